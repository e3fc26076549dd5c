"""The pure Laplace fit: exact on Gaussians, flags instead of errors, jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.curvature import covariance
from numpyro_lm.mode.laplace_state import laplace, laplace_finish, laplace_init, laplace_update

pytestmark = pytest.mark.usefixtures("x64")

PRECISION = np.array([[2.0, 0.9], [0.9, 1.0]])


def gaussian_log_density(x, mean=np.array([1.0, -2.0])):
    d = x - mean
    return -0.5 * d @ PRECISION @ d


def test_laplace_of_a_gaussian_is_the_gaussian():
    state = laplace(gaussian_log_density, jnp.zeros(2))
    assert bool(state.info.converged) and bool(state.info.positive) and bool(state.info.finite)
    np.testing.assert_allclose(state.mode, [1.0, -2.0], rtol=1e-12)
    np.testing.assert_allclose(covariance(state.curvature), np.linalg.inv(PRECISION), rtol=1e-12)
    np.testing.assert_allclose(state.log_density, 0.0, atol=1e-12)
    np.testing.assert_allclose(state.gaussian.cov, np.linalg.inv(PRECISION), rtol=1e-12)


@pytest.mark.parametrize("method", ["newton", pytest.param("lbfgs", marks=pytest.mark.slow)])
def test_laplace_under_jit_and_vmap_fits_each_data_set(method):
    means = jnp.array([[0.0, 1.0], [2.0, -1.0], [-3.0, 0.5]])
    fit = jax.jit(jax.vmap(lambda m: laplace(lambda x: gaussian_log_density(x, m), jnp.zeros(2), method=method)))
    state = fit(means)
    assert state.mode.shape == (3, 2) and bool(jnp.all(state.info.converged))
    # the convergence rule stops once the predicted decrease is below the rounding error of
    # log p (~eps): the mode is then within sqrt(2 eps) ~ 2e-8 posterior SDs (the SDs are ~1)
    np.testing.assert_allclose(state.mode, means, atol=1e-7)
    np.testing.assert_allclose(jax.vmap(covariance)(state.curvature), jnp.broadcast_to(np.linalg.inv(PRECISION), (3, 2, 2)),
                               rtol=1e-9)


@pytest.mark.slow
def test_flags_instead_of_errors():
    # a flat direction: the mode search converges, the curvature is singular (flagged)
    state = laplace(lambda x: -0.5 * (x[0] + x[1]) ** 2, jnp.zeros(2))
    assert not bool(state.info.positive)
    # the opt-in ridge makes it proper
    state = laplace(lambda x: -0.5 * (x[0] + x[1]) ** 2, jnp.zeros(2), regularize=1.0)
    assert bool(state.info.positive)
    # an unbounded density: not converged
    state = laplace(lambda x: jnp.sum(x**2), jnp.ones(2), max_iter=20)
    assert not bool(state.info.converged)


@pytest.mark.slow
def test_three_steps_equal_one_call():
    def log_p(x):
        return -jnp.sum((x - 3.0) ** 4) - 1e-3 * jnp.sum(x**2)

    whole = laplace(log_p, jnp.zeros(2))
    state = laplace_init(log_p, jnp.zeros(2))
    for until in (5, 10, 200):
        state = laplace_update(log_p, state, max_iter=until)
    steps = laplace_finish(state)
    np.testing.assert_array_equal(steps.mode, whole.mode)
    assert int(steps.info.num_iter) == int(whole.info.num_iter)
