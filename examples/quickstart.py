"""
Quickstart: Laplace Matching next to NUTS on a model with real, positive and simplex sites.
===========================================================================================

A shop records, for three days, how many visitors arrive (Poisson with a positive
``rate``), which of four products they pick (Multinomial with ``shares`` on the simplex),
and how long they stay (Normal with real ``mu`` and positive ``sigma``). The data are
generated here. Run with ``make demo``; the marginals of LM and NUTS, overlaid, are
saved to ``examples/output/quickstart_marginals.png``.
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

from numpyro_lm import LaplaceMatching
from numpyro_lm.plotting import plot_marginals

# sphinx-gallery runs an example from its own folder and sets no __file__
HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.getcwd()
OUTPUT = os.path.join(HERE, "output")


def model(visitors, picks, stay):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 0.02))
    shares = numpyro.sample("shares", dist.Dirichlet(jnp.ones(4)))
    mu = numpyro.sample("mu", dist.Normal(10.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(10.0))
    with numpyro.plate("day", visitors.shape[0]):
        numpyro.sample("visitors", dist.Poisson(rate), obs=visitors)
        numpyro.sample("picks", dist.Multinomial(picks.sum(-1), shares), obs=picks)
    with numpyro.plate("visit", stay.shape[0]):
        numpyro.sample("stay", dist.Normal(mu, sigma), obs=stay)


def generate(key):
    k1, k2, k3 = jax.random.split(key, 3)
    visitors = jax.random.poisson(k1, 120.0, (3,)).astype(jnp.float32)
    picks = jax.random.multinomial(k2, 40, jnp.array([0.4, 0.3, 0.2, 0.1]), shape=(3, 4)).astype(jnp.float32)
    stay = 12.0 + 4.0 * jax.random.normal(k3, (50,))
    return visitors, picks, stay


def summary(samples, names):
    rows = {}
    for name in names:
        x = np.asarray(samples[name]).reshape(len(samples[name]), -1)
        for i in range(x.shape[1]):
            label = name if x.shape[1] == 1 else f"{name}[{i}]"
            rows[label] = (x[:, i].mean(), x[:, i].std())
    return rows


def main():
    data = generate(jax.random.PRNGKey(0))

    t0 = time.perf_counter()
    lm = LaplaceMatching(model).run(jax.random.PRNGKey(1), *data)
    lm_samples = jax.block_until_ready(lm.get_samples())
    lm_time = time.perf_counter() - t0

    t0 = time.perf_counter()
    mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), *data)
    nuts_samples = jax.block_until_ready(mcmc.get_samples())
    nuts_time = time.perf_counter() - t0

    print("Laplace Matching")
    lm.print_summary()
    print("\nNUTS (1 chain, 1000 warmup + 1000 draws)")
    mcmc.print_summary()

    names = ["rate", "shares", "mu", "sigma"]
    ours, ref = summary(lm_samples, names), summary(nuts_samples, names)
    print(f"\n{'site':<10} {'LM mean':>9} {'NUTS mean':>10} {'LM sd':>8} {'NUTS sd':>8} {'|diff|/sd':>9}")
    for label in ours:
        (m1, s1), (m2, s2) = ours[label], ref[label]
        print(f"{label:<10} {m1:>9.3f} {m2:>10.3f} {s1:>8.3f} {s2:>8.3f} {abs(m1 - m2) / s2:>9.2f}")
    print("\nMatched posteriors:")
    for name, d in lm.posterior.items():
        params = {k: np.round(np.asarray(v), 3).tolist() for k, v in vars(d).items()
                  if k in ("concentration", "rate", "loc", "scale")}
        print(f"  {name}: {type(d).__name__} {params}")
    # ArviZ: the same habits as with MCMC (az.from_numpyro(lm) works too)
    import arviz as az

    idata = lm.to_inference_data(posterior_predictive=True)
    print(f"\nArviZ groups: {', '.join(idata.groups())}")
    loo = az.loo(idata, var_name="stay")
    print(f"PSIS-LOO of the visit lengths under the LM posterior: elpd_loo {float(loo.elpd_loo):.1f}")
    try:
        os.makedirs(OUTPUT, exist_ok=True)
        path = os.path.join(OUTPUT, "quickstart_marginals.png")
        plot_marginals(lm, az.from_numpyro(mcmc), labels=("LM", "NUTS"), path=path)
        print(f"LM and NUTS marginals overlaid: {path}")
    except ImportError as e:
        print(f"(no plot: {e})")
    print(f"\nWall time, first calls with compilation: LM {lm_time:.2f} s, NUTS {nuts_time:.2f} s "
          f"({nuts_time / lm_time:.1f}x faster)")
    t0 = time.perf_counter()
    jax.block_until_ready(lm.run(jax.random.PRNGKey(3), *data).get_samples())
    print(f"A second LM fit with the same shapes (compiled): {1e3 * (time.perf_counter() - t0):.1f} ms")


if __name__ == "__main__":
    main()
