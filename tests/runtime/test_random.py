"""Draws from JAX keys: reproducible, stable in the number of draws, right distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from numpyro_lm.runtime.random import _erfinv32, log_gamma, normal_rows, standard_normal, uniform_rows

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


def test_single_precision_erfinv_matches_the_exact_one():
    """Giles's polynomial against SciPy's float64 erfinv, from the centre to the 24-bit edge."""
    u = np.concatenate([np.linspace(-0.999, 0.999, 20001), 1 - np.logspace(-3, np.log10(2.0**-24), 2000)])
    exact = special.erfinv(u.astype(np.float32).astype(np.float64))
    mine = np.asarray(_erfinv32(jnp.asarray(u, jnp.float32)), np.float64)
    # float32's own rounding of the result is 6e-8; the polynomial's error stays below 1e-6
    assert np.max(np.abs(mine - exact) / np.maximum(np.abs(exact), 1e-30)) < 1e-6


def test_standard_normal_float32_is_standard_and_finite():
    n = 2**20
    z = np.asarray(standard_normal(jax.random.PRNGKey(5), (n,), jnp.float32))
    assert z.dtype == np.float32 and np.all(np.isfinite(z))
    assert np.max(np.abs(z)) <= special.ndtri(1 - 2.0**-25) + 1e-4  # the 24-bit uniforms' edge
    # the empirical CDF against the normal one: Kolmogorov's 0.999 quantile is 1.95 / sqrt(n)
    grid = np.linspace(-4, 4, 401)
    ecdf = np.searchsorted(np.sort(z), grid) / n
    assert np.max(np.abs(ecdf - special.ndtr(grid))) < 1.95 / np.sqrt(n)
    # fourth moment 3 (SE sqrt(96 / n) ~ 0.01)
    assert abs(np.mean(z.astype(np.float64) ** 4) - 3) < 0.05
    # reproducible, each key its own, and normal_rows' rows in float32 are prefix-stable
    np.testing.assert_array_equal(z[:5], standard_normal(jax.random.PRNGKey(5), (n,), jnp.float32)[:5])
    assert not np.allclose(z[:5], standard_normal(jax.random.PRNGKey(7), (5,), jnp.float32))
    rows = normal_rows(jax.random.PRNGKey(6), 9, (3,), jnp.float32)
    np.testing.assert_array_equal(rows[:4], normal_rows(jax.random.PRNGKey(6), 4, (3,), jnp.float32))


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
