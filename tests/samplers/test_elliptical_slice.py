"""Elliptical slice sampling: closed-form GP regression, GP classification against NUTS,
and the Laplace ellipse on a non-Gaussian target."""

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.scipy.stats import norm
from numpyro.infer import MCMC

from numpyro_lm import LaplaceMatching
from numpyro_lm.samplers import EllipticalSlice, elliptical_slice_step, warm_nuts

pytestmark = pytest.mark.usefixtures("x64")
KEY = jax.random.PRNGKey(0)


def rbf(x, lengthscale=1.0, variance=1.0):
    return variance * jnp.exp(-0.5 * jnp.square(x[:, None] - x[None, :]) / lengthscale**2) + 1e-6 * jnp.eye(x.shape[0])


def gp_regression(x, y=None):
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(x.shape[0]), rbf(x)))
    numpyro.sample("y", dist.Normal(f, 0.3), obs=y)


def test_step_with_flat_likelihood_accepts_the_first_proposal():
    z, n = elliptical_slice_step(KEY, jnp.zeros(3), 0.0, lambda f: 0.0, jnp.zeros(3), jnp.eye(3))[::2]
    assert int(n) == 1 and z.shape == (3,)


@pytest.mark.slow  # 8 s on one core: runs where CI=true (Makefile)
def test_gp_regression_posterior_is_recovered():
    x = jnp.linspace(-2.0, 2.0, 12)
    y = jnp.sin(2 * x) + 0.3 * jax.random.normal(KEY, x.shape)
    k = rbf(x)
    gain = k @ jnp.linalg.inv(k + 0.09 * jnp.eye(12))
    mean, sd = gain @ y, jnp.sqrt(jnp.diag(k - gain @ k))
    mcmc = MCMC(EllipticalSlice(gp_regression), num_warmup=200, num_samples=1200, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(KEY, x, y=y)
    f = np.asarray(mcmc.get_samples()["f"])
    ess = az.ess(az.from_numpyro(mcmc, log_likelihood=False))["f"].values
    # Monte Carlo error of a mean: sd / sqrt(ESS); of an sd: about sd / sqrt(2 ESS)
    np.testing.assert_array_less(np.abs(f.mean(0) - mean), 5 * sd / np.sqrt(ess))
    np.testing.assert_array_less(np.abs(f.std(0) / sd - 1), 5 / np.sqrt(2 * ess))


def gp_classification(x, y=None):
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(x.shape[0]), rbf(x, variance=4.0)))
    numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_gp_classification_agrees_with_nuts():
    x = jnp.linspace(-3.0, 3.0, 16)
    y = (jnp.sin(1.5 * x) + 0.3 * jax.random.normal(KEY, x.shape) > 0).astype(jnp.float64)
    ess_mcmc = MCMC(EllipticalSlice(gp_classification), num_warmup=200, num_samples=1500, num_chains=2,
                    chain_method="vectorized", progress_bar=False)
    ess_mcmc.run(KEY, x, y=y)
    # reference: NUTS with the LM covariance as its dense mass matrix (mixes in 40 dims)
    warm = warm_nuts(LaplaceMatching(gp_classification).run(KEY, x, y=y))
    nuts = MCMC(warm.kernel, num_warmup=150, num_samples=1500, progress_bar=False)
    nuts.run(KEY, x, y=y, init_params=warm.init_params)
    a, b = (az.from_numpyro(m, log_likelihood=False) for m in (ess_mcmc, nuts))
    fa, fb = a.posterior["f"].values.reshape(-1, 16), b.posterior["f"].values.reshape(-1, 16)
    se = np.sqrt(fa.var(0) / az.ess(a)["f"].values + fb.var(0) / az.ess(b)["f"].values)
    np.testing.assert_array_less(np.abs(fa.mean(0) - fb.mean(0)), 5 * se)
    assert float(az.rhat(a)["f"].max()) < 1.05


def skew_normal():
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.factor("skew", norm.logcdf(2.0 * x))


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_laplace_ellipse_samples_a_non_gaussian_target_exactly():
    # skew-normal(2): mean delta sqrt(2/pi), delta = 2/sqrt(5); LM alone is 0.26 SD off
    delta = 2.0 / np.sqrt(5.0)
    mean, sd = delta * np.sqrt(2 / np.pi), np.sqrt(1 - 2 * delta**2 / np.pi)
    lm = LaplaceMatching(skew_normal).run(KEY)
    mcmc = MCMC(EllipticalSlice.from_laplace(lm), num_warmup=200, num_samples=4000, progress_bar=False)
    mcmc.run(KEY)
    x = np.asarray(mcmc.get_samples()["x"])
    ess = float(az.ess(az.from_numpyro(mcmc, log_likelihood=False))["x"].values)
    assert abs(x.mean() - mean) < 5 * sd / np.sqrt(ess)
    assert abs(x.std() / sd - 1) < 5 / np.sqrt(2 * ess)


def positive_scale(y):
    scale = numpyro.sample("scale", dist.HalfNormal(1.0))
    f = numpyro.sample("f", dist.Normal(0.0, scale).expand([3]).to_event(1))
    numpyro.sample("y", dist.Normal(f, 1.0), obs=y)


def latent_mean(y):
    m = numpyro.sample("m", dist.Normal(0.0, 1.0))
    f = numpyro.sample("f", dist.Normal(m, 1.0).expand([3]).to_event(1))
    numpyro.sample("y", dist.Normal(f, 1.0), obs=y)


@pytest.mark.parametrize("model, why", [(positive_scale, "not real-valued"), (latent_mean, "do not depend")])
def test_model_ellipse_refuses_non_gaussian_or_hierarchical_priors(model, why):
    mcmc = MCMC(EllipticalSlice(model), num_warmup=10, num_samples=10, progress_bar=False)
    with pytest.raises(ValueError, match=f"(?s){why}.*from_laplace"):
        mcmc.run(KEY, jnp.zeros(3))
