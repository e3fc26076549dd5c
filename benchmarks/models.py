"""Benchmark models with generated (or classic, shipped) data."""

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist


def eight_schools():
    """Non-centred eight schools (Rubin 1981). Hierarchical: tau is where Laplace fails."""
    y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

    def model(sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("J", sigma.shape[0]):
            theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
            theta = numpyro.deterministic("theta", mu + tau * theta_tilde)
            numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

    return model, (sigma,), {"y": y}


def logistic_regression(n=500, d=3, seed=0):
    """Bayesian logistic regression on generated data: near-Gaussian posterior."""
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (n, d))
    w = jnp.linspace(1.0, -0.5, d)
    y = jax.random.bernoulli(ky, jax.nn.sigmoid(x @ w)).astype(x.dtype)

    def model(x, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 5.0).expand([x.shape[1]]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 5.0))
        numpyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)

    return model, (x,), {"y": y}


def counts(seed=0):
    """Category shares (simplex) and rates (positive) from counts: conjugate, so LM is exact."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    shares = jnp.array([0.5, 0.3, 0.15, 0.05])
    category_counts = jax.random.multinomial(k1, 60, shares, shape=(3, 4)).astype(jnp.result_type(float))
    events = jax.random.poisson(k2, jnp.array([2.0, 5.0, 0.5])[:, None], (3, 20)).astype(jnp.result_type(float))

    def model(category_counts, events):
        with numpyro.plate("region", category_counts.shape[0]):
            p = numpyro.sample("shares", dist.Dirichlet(jnp.full(4, 0.5)))
            numpyro.sample("categories", dist.Multinomial(category_counts.sum(-1), p), obs=category_counts)
            rate = numpyro.sample("rate", dist.Gamma(1.0, 0.5))
            with numpyro.plate("day", events.shape[1]):
                numpyro.sample("events", dist.Poisson(rate), obs=events.T)

    return model, (category_counts, events), {}


def rbf_kernel(x, lengthscale=1.0, variance=1.0, jitter=1e-5):
    d2 = jnp.square(x[:, None] - x[None, :])
    return variance * jnp.exp(-0.5 * d2 / lengthscale**2) + jitter * jnp.eye(x.shape[0])


def gp_classification(n=40, seed=0):
    """Latent GP classification (fixed RBF kernel): a latent Gaussian model, 40 correlated dims."""
    kx, kf, ky = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jnp.sort(jax.random.uniform(kx, (n,), minval=-3.0, maxval=3.0))
    f = 2.0 * jnp.sin(1.5 * x)
    y = jax.random.bernoulli(ky, jax.nn.sigmoid(f)).astype(jnp.result_type(float))

    def model(x, y=None):
        cov = rbf_kernel(x, lengthscale=1.0, variance=4.0)
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=cov))
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)

    return model, (x,), {"y": y}


MODELS = {
    "eight_schools": eight_schools,
    "logistic_regression": logistic_regression,
    "counts": counts,
    "gp_classification": gp_classification,
}
