"""Warm-started NUTS: the LM Gaussian carried into NumPyro's unconstrained space."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC
from numpyro.infer.util import unconstrain_fn

from numpyro_lm import LaplaceMatching
from numpyro_lm.samplers import unconstrained_gaussian, warm_nuts
from numpyro_lm.samplers.warm_nuts import numpyro_coordinates

pytestmark = pytest.mark.usefixtures("x64")
KEY = jax.random.PRNGKey(0)


def positive_and_real(y):
    # declared out of alphabetical order: NumPyro flattens sorted ("alpha", "zeta")
    zeta = numpyro.sample("zeta", dist.Gamma(3.0, 1.0))
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
    numpyro.sample("y", dist.Normal(alpha.sum(), 1.0 / jnp.sqrt(zeta)), obs=y)


def test_same_coordinates_keep_the_covariance_in_sorted_order():
    # log basis = NumPyro's exp transform, identity = identity: the Jacobian is I, so the
    # unconstrained covariance is the LM covariance with the sites reordered
    lm = LaplaceMatching(positive_and_real).run(KEY, jnp.array([0.5, 1.5, 1.0, 2.0]))
    names, mode, cov = unconstrained_gaussian(lm)
    assert names == ("alpha", "zeta")
    order = np.concatenate([np.arange(s.offset, s.offset + s.size) for s in sorted(lm.layout.sites)])
    np.testing.assert_allclose(cov, np.asarray(lm.gaussian.cov)[np.ix_(order, order)], rtol=1e-10)
    zeta = lm.layout.site("zeta")
    np.testing.assert_allclose(mode["zeta"], lm.gaussian.mean[zeta.offset], rtol=1e-10)


def dirichlet_counts(counts):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(4)))
    numpyro.sample("c", dist.Multinomial(counts.sum(), w), obs=counts)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_simplex_mode_and_covariance_in_stick_breaking_coordinates():
    counts = jnp.array([400.0, 300.0, 200.0, 100.0])
    lm = LaplaceMatching(dirichlet_counts).run(KEY, counts)
    _, mode, cov = unconstrained_gaussian(lm)
    constrained = lm.model_info.constrain(lm.gaussian.mean, (counts,))["w"]
    expected = unconstrain_fn(dirichlet_counts, (counts,), {}, {"w": constrained})["w"]
    np.testing.assert_allclose(mode["w"], expected, rtol=1e-8)
    # J Sigma J' against the covariance of u(y) for y ~ N(mode, Sigma): the posterior SDs
    # are ~0.1, so the linearisation is good to ~1%; an entry's MC standard error with
    # S draws is sqrt(C_ii C_jj / S): allow 5 of them
    g, num = lm.gaussian, 40000
    y = g.mean + np.random.default_rng(0).standard_normal((num, 3)) @ np.linalg.cholesky(g.cov).T
    u = jax.vmap(lambda yi: numpyro_coordinates(lm.model_info, yi, (counts,), {})[0]["w"])(jnp.asarray(y))
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_array_less(np.abs(cov - np.cov(np.asarray(u).T)), 0.02 * np.outer(sd, sd) + 5 * np.outer(sd, sd) / np.sqrt(num))


def linear_regression(x, y):
    beta = numpyro.sample("beta", dist.Normal(0.0, 2.0).expand([2]).to_event(1))
    numpyro.sample("y", dist.Normal(x @ beta, 0.5), obs=y)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_warm_nuts_samples_the_closed_form_posterior():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 2)) @ np.array([[1.0, 0.9], [0.0, 0.3]])  # correlated posterior
    y = x @ np.array([1.0, -0.5]) + 0.5 * rng.normal(size=30)
    precision = x.T @ x / 0.25 + np.eye(2) / 4.0
    cov = np.linalg.inv(precision)
    mean = cov @ (x.T @ y / 0.25)
    lm = LaplaceMatching(linear_regression).run(KEY, x, y)
    warm = warm_nuts(lm)
    mcmc = MCMC(warm.kernel, num_warmup=100, num_samples=1000, progress_bar=False)
    mcmc.run(KEY, x, y, init_params=warm.init_params)
    # the mass matrix NUTS used is the LM covariance (no mass adaptation by default)
    used = mcmc.last_state.adapt_state.inverse_mass_matrix[("beta",)]
    np.testing.assert_allclose(used, cov, rtol=1e-6)
    beta = np.asarray(mcmc.get_samples()["beta"])
    # with the exact covariance as mass matrix the draws are nearly independent:
    # 5 standard errors of 1000 draws
    np.testing.assert_array_less(np.abs(beta.mean(0) - mean), 5 * np.sqrt(np.diag(cov) / 1000))
    np.testing.assert_allclose(np.cov(beta.T), cov, rtol=0.2)


def plated(y):
    """A site of 600 coordinates (beyond SITE_JACOBIAN_MAX, elementwise: log basis) and a simplex."""
    p = numpyro.sample("p", dist.Dirichlet(jnp.ones(3)))
    with numpyro.plate("units", y.shape[0]):
        rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
        numpyro.sample("y", dist.Poisson(rate * (1 + p[0])), obs=y)


@pytest.mark.slow  # 8 s on one core: runs where CI=true (Makefile)
def test_diagonal_mass_matrix_equals_the_dense_diagonal():
    """Beyond dense_max_dim the warm start forms no D x D array (site by site, elementwise
    slopes for large sites): its diagonal equals the dense computation's."""
    y = jnp.asarray(np.random.default_rng(0).poisson(3.0, size=600), jnp.float64)
    with pytest.warns(Warning):
        lm = LaplaceMatching(plated, strategy="laplace", progress_bar=False).run(KEY, y)
    dense = warm_nuts(lm, dense_max_dim=10_000).inverse_mass_matrix
    diagonal = warm_nuts(lm, dense_max_dim=100).inverse_mass_matrix
    (names,) = dense
    assert diagonal[names].shape == (602,)
    np.testing.assert_allclose(diagonal[names], np.diagonal(dense[names]), rtol=1e-8)


def decay(ts, y=None):
    # y(t) = exp(-k t) by odeint: its adjoint is a custom_vjp, which forward mode cannot differentiate
    from jax.experimental.ode import odeint

    k = numpyro.sample("k", dist.LogNormal(0.0, 0.5))
    path = odeint(lambda u, t, rate: -rate * u, jnp.ones(1), ts, k, rtol=1e-6, atol=1e-5, mxstep=1000)[:, 0]
    numpyro.sample("y", dist.Normal(path, 0.05), obs=y)


# the dense Jacobian (in the slow set), and the site-by-site slope
@pytest.mark.parametrize("dense_max_dim", [10, 0])
@pytest.mark.slow
def test_a_model_with_odeint_gets_its_warm_start_and_posterior(dense_max_dim, x32):
    ts = jnp.linspace(0.0, 2.0, 9)
    lm = LaplaceMatching(decay, strategy="laplace", progress_bar=False).run(KEY, ts, jnp.exp(-0.7 * ts))
    # forward-mode products through the trace raised "can't apply forward-mode autodiff (jvp) to
    # a custom_vjp function"; the reverse products give the same numbers
    warm = warm_nuts(lm, dense_max_dim=dense_max_dim)
    # log basis = NumPyro's exp transform: the unconstrained variance is the LM variance
    variance = np.ravel(warm.inverse_mass_matrix[("k",)])
    np.testing.assert_allclose(variance, np.ravel(lm.gaussian.cov), rtol=1e-5)  # float32 rounding
    assert lm.posterior["k"].mean > 0  # the support check ran through the model's trace too
