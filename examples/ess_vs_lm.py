"""
How many elliptical slice samples match Laplace Matching? (thesis Fig. 3.7, small scale)
========================================================================================

The thesis compares LM with elliptical slice sampling (ESS) on election results of one
precinct: vote counts per election, party shares through a softmax of a latent GP over
(election, party). Here the data are generated: 6 elections, 4 parties, 1000 votes each,
a GP with a product kernel over time and party. All methods run on the same NumPyro
model in float64. The truth is a long NUTS run (2 x 5000 draws, started from LM with the
LM covariance as its mass matrix). For a growing number of ESS draws we measure the error
of the sample mean and standard deviation of every party share against the truth (in
units of the true SD, worst share), and mark where ESS becomes as good as LM. Two
ellipses: the GP prior (the thesis' ESS) and the LM Gaussian
(``EllipticalSlice.from_laplace``). The plot goes to ``examples/output/ess_vs_lm.png``.

Run with ``.venv/bin/python examples/ess_vs_lm.py`` (a few minutes).
"""

import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402
from numpyro_lm.samplers import EllipticalSlice, warm_nuts  # noqa: E402

# sphinx-gallery runs an example from its own folder and sets no __file__
HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.getcwd()
OUTPUT = os.path.join(HERE, "output")
T, P, VOTES = 6, 4, 1000


def kernel():
    t = jnp.arange(T, dtype=jnp.result_type(float))
    k_time = jnp.exp(-0.5 * jnp.square(t[:, None] - t[None, :]) / 2.0**2)
    k_party = 0.7 * jnp.eye(P) + 0.3  # parties share a common swing
    return 2.0 * jnp.kron(k_time, k_party) + 1e-6 * jnp.eye(T * P)


def election(votes=None):
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(T * P), covariance_matrix=kernel()))
    shares = numpyro.deterministic("shares", jax.nn.softmax(f.reshape(T, P), axis=-1))
    with numpyro.plate("election", T):
        numpyro.sample("votes", dist.Multinomial(VOTES, shares), obs=votes)


def generate(key):
    k1, k2 = jax.random.split(key)
    base = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
    drift = 0.3 * jnp.cumsum(jax.random.normal(k1, (T, P)), axis=0)
    return jax.random.multinomial(k2, VOTES, jax.nn.softmax(base + drift, -1), shape=(T, P)).astype(jnp.float32)


def ess_draws(kernel, key, votes, num_warmup, num_samples):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(key, votes=votes)
    shares = np.asarray(mcmc.get_samples()["shares"]).reshape(num_samples, -1)
    return shares, time.perf_counter() - t0


def nuts_truth(lm, votes):
    warm = warm_nuts(lm)
    init = {k: np.broadcast_to(v, (2,) + v.shape) for k, v in warm.init_params.items()}
    mcmc = MCMC(warm.kernel, num_warmup=500, num_samples=5000, num_chains=2, chain_method="sequential",
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(3), votes=votes, init_params=init)
    return np.asarray(mcmc.get_samples()["shares"]).reshape(10000, -1)


def errors(draws, mean, sd):
    """Worst share's |mean error| and |sd error|, in units of the true SD."""
    return np.max(np.abs(draws.mean(0) - mean) / sd), np.max(np.abs(draws.std(0) - sd) / sd)


def main():
    votes = generate(jax.random.PRNGKey(0))

    lm = LaplaceMatching(election, num_samples=4000, progress_bar=False).run(jax.random.PRNGKey(1), votes=votes)
    t0 = time.perf_counter()
    lm.run(jax.random.PRNGKey(2), votes=votes)
    lm_draws = np.asarray(jax.block_until_ready(lm.get_samples()["shares"])).reshape(4000, -1)
    lm_time = time.perf_counter() - t0

    truth = nuts_truth(lm, votes)
    mean, sd = truth.mean(0), truth.std(0)
    lm_mean_err, lm_sd_err = errors(lm_draws, mean, sd)
    print(f"LM (compiled) {1e3 * lm_time:.1f} ms")
    print(f"LM error: mean {lm_mean_err:.3f} SD, sd {lm_sd_err:.3f} SD (worst of {mean.size} shares)")

    sizes = np.unique(np.logspace(1, np.log10(5000), 25).astype(int))
    runs = 5  # independent ESS chains per ellipse, errors averaged
    curves, per_draw = {}, {}
    for label, kernel in (("GP prior", EllipticalSlice(election)), ("LM Gaussian", EllipticalSlice.from_laplace(lm))):
        chains = [ess_draws(kernel, jax.random.PRNGKey(10 + r), votes, 500, int(sizes[-1]))[0] for r in range(runs)]
        _, seconds = ess_draws(kernel, jax.random.PRNGKey(99), votes, 500, int(sizes[-1]))
        per_draw[label] = seconds / (500 + sizes[-1])
        curves[label] = np.array([[errors(c[:n], mean, sd) for n in sizes] for c in chains]).mean(0)
        print(f"ESS, {label} ellipse: one draw {1e3 * per_draw[label]:.2f} ms "
              f"(LM costs {lm_time / per_draw[label]:.0f} draws)")
        for k, what, level in ((0, "mean", lm_mean_err), (1, "sd", lm_sd_err)):
            below = np.flatnonzero(curves[label][:, k] <= level)
            found = f"about {sizes[below[0]]}" if below.size else f"more than {sizes[-1]}"
            print(f"  draws until its {what} is as good as LM's: {found}")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, k, what, level in ((axes[0], 0, "mean", lm_mean_err), (axes[1], 1, "standard deviation", lm_sd_err)):
        for (label, curve), color in zip(curves.items(), ("C0", "C2")):
            ax.loglog(sizes, curve[:, k], "o-", ms=3, color=color, label=f"ESS, {label} ellipse ({runs} chains)")
        ax.axhline(level, color="C1", label="Laplace Matching")
        ax.axvline(lm_time / per_draw["GP prior"], color="C7", ls=":", label="ESS draws in LM's time")
        ax.set_xlabel("ESS draws")
        ax.set_ylabel("worst |error| / true SD")
        ax.set_title(what, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Shares of 4 parties in 6 elections: ESS against Laplace Matching")
    fig.tight_layout()
    os.makedirs(OUTPUT, exist_ok=True)
    path = os.path.join(OUTPUT, "ess_vs_lm.png")
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
