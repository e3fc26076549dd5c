"""
Did it work? The verdict of Laplace Matching on a model it fits and one the joint fit does not.
===============================================================================================

1. Logistic regression (500 generated points): the posterior is close to Gaussian, k-hat
   is small, and LM's draws can be used as they are.
2. Eight schools (non-centred): the joint mode puts the group scale ``tau`` far from the
   bulk of its posterior. The joint fit alone (``strategy="laplace"``) says so (k-hat above
   0.7, not trusted, with a warning); the default call sees from the model that ``tau``
   is a hyperparameter, starts with nested Laplace over it and is trusted. Both are compared with NUTS; the overlaid marginals are saved
   to ``examples/output/eight_schools_marginals.png``.

Run with ``.venv/bin/python examples/did_it_work.py``.
"""

import os
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

from numpyro_lm import LaplaceMatching, NotTrustedWarning
from numpyro_lm.plotting import plot_marginals

# sphinx-gallery runs an example from its own folder and sets no __file__
HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.getcwd()
OUTPUT = os.path.join(HERE, "output")


def logistic_regression(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 5.0).expand([x.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    numpyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)


def eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        numpyro.deterministic("theta", mu + tau * theta_tilde)
        numpyro.sample("obs", dist.Normal(mu + tau * theta_tilde, sigma), obs=y)


def main():
    kx, ky = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (500, 3))
    y = jax.random.bernoulli(ky, jax.nn.sigmoid(x @ jnp.array([1.0, 0.25, -0.5]))).astype(jnp.float32)
    lm = LaplaceMatching(logistic_regression).run(jax.random.PRNGKey(1), x, y=y)
    print("Logistic regression:", lm.diagnostics()["verdict"])

    y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    with warnings.catch_warnings():  # the verdict is printed below
        warnings.simplefilter("ignore", NotTrustedWarning)
        joint = LaplaceMatching(eight_schools, num_samples=4000, strategy="laplace").run(
            jax.random.PRNGKey(1), sigma, y=y)
    print("Eight schools, the joint fit alone:", joint.diagnostics()["verdict"])
    lm = LaplaceMatching(eight_schools, num_samples=4000).run(jax.random.PRNGKey(1), sigma, y=y)
    d = lm.diagnostics()
    print("Eight schools, the default call:", " -> ".join(
        f"{a['candidate']} ({'trusted' if a['trusted'] else 'not trusted'})" for a in d["trail"]))
    print("  ", d["verdict"])
    mcmc = MCMC(NUTS(eight_schools), num_warmup=1000, num_samples=4000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), sigma, y=y)
    nuts = az.from_numpyro(mcmc)
    for name, fit in (("joint ", joint), ("default ", lm)):
        print(az.summary(fit.to_inference_data(), var_names=["mu", "tau"], kind="stats").add_prefix(name))
    print(az.summary(nuts, var_names=["mu", "tau"], kind="stats").add_prefix("NUTS "))
    os.makedirs(OUTPUT, exist_ok=True)
    path = os.path.join(OUTPUT, "eight_schools_marginals.png")
    plot_marginals(lm, nuts, var_names=["mu", "tau", "theta_tilde"], path=path)
    print(f"The default call's and NUTS's marginals overlaid: {path}")


if __name__ == "__main__":
    main()
