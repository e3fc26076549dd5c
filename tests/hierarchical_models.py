"""Hierarchical models with shipped or generated data, shared by the nested-Laplace tests
and the script that makes their NUTS references (tests/data/make_references.py)."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist


def eight_schools():
    """Non-centred eight schools (Rubin 1981)."""
    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

    def model(sigma, y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("school", sigma.shape[0]):
            theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
            numpyro.deterministic("theta", mu + tau * theta_tilde)
            numpyro.sample("obs", dist.Normal(mu + tau * theta_tilde, sigma), obs=y)

    return model, (jnp.asarray(sigma), jnp.asarray(y)), {}


def beta_binomial(groups=25, seed=0):
    """Rat-tumour style: group rates p_j ~ Beta(m kappa, (1 - m) kappa), counts ~ Binomial."""
    rng = np.random.default_rng(seed)
    n = rng.integers(15, 50, groups).astype(float)
    p = rng.beta(0.15 * 12, 0.85 * 12, groups)
    k = rng.binomial(n.astype(int), p).astype(float)

    def model(n, k):
        m = numpyro.sample("m", dist.Beta(1.0, 1.0))
        kappa = numpyro.sample("kappa", dist.Gamma(1.5, 0.05))
        with numpyro.plate("group", n.shape[0]):
            p = numpyro.sample("p", dist.Beta(m * kappa, (1.0 - m) * kappa))
            numpyro.sample("k", dist.Binomial(n, p), obs=k)

    return model, (jnp.asarray(n), jnp.asarray(k)), {}


def hierarchical_poisson(groups=20, per_group=5, seed=0):
    """Counts with group log-rates alpha + sigma * z_j (non-centred)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=groups)
    rate = np.exp(0.3 + 0.5 * z)
    exposure = np.full(groups, float(per_group))
    counts = rng.poisson(rate * exposure).astype(float)  # the sum over a group's units

    def model(exposure, counts):
        alpha = numpyro.sample("alpha", dist.Normal(0.0, 2.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("group", exposure.shape[0]):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
            numpyro.sample("counts", dist.Poisson(exposure * jnp.exp(alpha + sigma * z)), obs=counts)

    return model, (jnp.asarray(exposure), jnp.asarray(counts)), {}


MODELS = {
    "eight_schools": eight_schools,
    "beta_binomial": beta_binomial,
    "hierarchical_poisson": hierarchical_poisson,
}
