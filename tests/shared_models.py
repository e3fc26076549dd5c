"""Models and data several test modules share (each test module imports what it needs from here)."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

Y = jnp.array([1.2, -0.4, 2.5, 0.9, 1.7, 0.1])


def gaussian_hierarchy(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("group", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def exact_posterior(y):
    """mu | y: y_j ~ N(mu, 2) marginally; theta_j | mu, y ~ N((mu + y_j)/2, 1/2)."""
    precision = 1 / 25 + y.shape[0] / 2
    mean = float(jnp.sum(y) / 2 / precision)
    theta_mean = (mean + np.asarray(y)) / 2
    theta_var = 0.5 + 0.25 / precision
    return mean, 1 / np.sqrt(precision), theta_mean, np.sqrt(theta_var)


def whitened_field(x, y=None):
    """z sits in a plate, but f = L z couples every entry: the plate's arrowhead does not hold."""
    amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
    k = amp**2 * jnp.exp(-((x[:, None] - x[None, :]) ** 2) / 2) + 1e-3 * jnp.eye(x.shape[0])
    with numpyro.plate("n", x.shape[0]):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=jnp.linalg.cholesky(k) @ z), obs=y)


def whitened_gp(x, y=None, jitter=1e-3):
    amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
    ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
    d = x[:, None] - x[None, :]
    k = amp**2 * jnp.exp(-(d**2) / (2 * ls**2)) + jitter * jnp.eye(x.shape[0])
    with numpyro.plate("n", x.shape[0]):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=jnp.linalg.cholesky(k) @ z), obs=y)


def glmm(x, group, num_groups, y=None):
    """Logistic GLMM: two fixed effects, a scale, a non-centred random intercept and slope per group."""
    beta = numpyro.sample("beta", dist.Normal(0, 1).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        z = numpyro.sample("z", dist.Normal(0, 1))
        w = numpyro.sample("w", dist.Normal(0, 0.5))
    eta = beta[0] + beta[1] * x + sigma * z[group] + w[group] * x
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=eta), obs=y)


def glmm_data(num_groups, per_group=6, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(num_groups), per_group).astype(np.int32)
    x = rng.normal(size=group.size).astype(dtype)
    eta = -0.3 + 0.8 * x + 0.7 * rng.normal(size=num_groups)[group]
    y = (rng.uniform(size=group.size) < 1 / (1 + np.exp(-eta))).astype(dtype)
    return (x, group, num_groups), {"y": y}


def coupled(num, y=None):
    """z sits in a plate, but the likelihood sees its cumulative sum: the entries interact."""
    with numpyro.plate("steps", num):
        z = numpyro.sample("z", dist.Normal(0, 1))
    numpyro.sample("y", dist.Normal(jnp.cumsum(z), 0.5).to_event(1), obs=y)


def wide_regression(x, sigma=None, y=None):
    """More coefficients than observations: the likelihood's Hessian has rank n, the prior's is
    diagonal (Student-t: not positive definite in its tails)."""
    if sigma is None:
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("coefficients", x.shape[1]):
        beta = numpyro.sample("beta", dist.StudentT(3.0, 0.0, 0.5))
    numpyro.sample("y", dist.Normal(x @ beta, sigma).to_event(1), obs=y)


def wide_data(n=30, p=80, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p)).astype(np.float32)
    beta = np.zeros(p)
    beta[:3] = [2.0, -1.5, 1.0]
    return x, (x @ beta + 0.5 * rng.normal(size=n)).astype(np.float32)


def poisson_glmm(group, num_groups, y=None):
    """Poisson counts with a non-centred random intercept per group: one scalar block a group."""
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", group.size):
        numpyro.sample("y", dist.Poisson(jnp.exp(beta + sigma * z[group])), obs=y)
