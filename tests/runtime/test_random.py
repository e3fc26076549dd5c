"""Draws from JAX keys: reproducible, stable in the number of draws, right distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from numpyro_lm.runtime.random import log_gamma, normal_rows, uniform_rows

pytestmark = pytest.mark.usefixtures("x64")


@pytest.mark.slow
def test_normal_rows_are_reproducible_prefix_stable_and_standard():
    key = jax.random.PRNGKey(3)
    a = normal_rows(key, 20000, (2,))
    np.testing.assert_array_equal(a, normal_rows(key, 20000, (2,)))
    np.testing.assert_array_equal(a[:7], normal_rows(key, 7, (2,)))  # more draws extend fewer
    assert not np.allclose(a[:10], normal_rows(jax.random.PRNGKey(4), 10, (2,)))
    # mean SE 0.007, variance SE 0.01
    assert np.all(np.abs(a.mean(0)) < 0.04) and np.all(np.abs(a.var(0) - 1) < 0.05)
    # under jit and vmap: each key its own draws, as if called alone
    keys = jax.random.split(key, 3)
    batched = jax.jit(jax.vmap(lambda k: normal_rows(k, 5, (2,))))(keys)
    np.testing.assert_array_equal(batched[1], normal_rows(keys[1], 5, (2,)))


def test_uniform_rows_are_inside_the_unit_interval():
    u = uniform_rows(jax.random.PRNGKey(0), 50000)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 4 * np.sqrt(1 / 12 / 50000)


@pytest.mark.parametrize("alpha", [0.01, 0.5, 7.0])
def test_log_gamma_moments(alpha):
    """E log X = digamma(a), Var log X = trigamma(a) for X ~ Gamma(a, 1)."""
    n = 40000
    x = np.asarray(log_gamma(jax.random.PRNGKey(0), jnp.full((2,), alpha), n))
    assert x.shape == (n, 2) and np.all(np.isfinite(x))
    var = special.polygamma(1, alpha)
    assert np.all(np.abs(x.mean(0) - special.digamma(alpha)) < 5 * np.sqrt(var / n))
    # log-Gamma has finite kurtosis; 10 % is > 5 standard errors of the variance here
    assert np.all(np.abs(x.var(0) / var - 1) < 0.1)
    batched = jax.vmap(lambda k: log_gamma(k, jnp.full((2,), alpha), 3))(jax.random.split(jax.random.PRNGKey(1), 4))
    assert batched.shape == (4, 3, 2)
