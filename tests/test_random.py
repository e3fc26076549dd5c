"""Host-side draws: reproducible from the key, right distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from numpyro_lm.random import log_gamma, standard_normal

pytestmark = pytest.mark.usefixtures("x64")


def test_standard_normal_is_reproducible_and_standard():
    key = jax.random.PRNGKey(3)
    a = standard_normal(key, (20000,))
    np.testing.assert_array_equal(a, standard_normal(key, (20000,)))
    assert not np.allclose(a[:10], standard_normal(key, (20000,), stream=1)[:10])
    assert not np.allclose(a[:10], standard_normal(jax.random.PRNGKey(4), (20000,))[:10])
    # mean SE 0.007, variance SE 0.01
    assert abs(float(a.mean())) < 0.04 and abs(float(a.var()) - 1) < 0.05
    b = jax.jit(lambda k: standard_normal(k, (3,)))(jax.random.key(3))
    assert b.shape == (3,)


@pytest.mark.parametrize("alpha", [0.01, 0.5, 7.0])
def test_log_gamma_moments(alpha):
    """E log X = digamma(a), Var log X = trigamma(a) for X ~ Gamma(a, 1)."""
    n = 40000
    x = np.asarray(log_gamma(jax.random.PRNGKey(0), jnp.full((n,), alpha), (n,)))
    assert np.all(np.isfinite(x))
    var = special.polygamma(1, alpha)
    assert abs(x.mean() - special.digamma(alpha)) < 5 * np.sqrt(var / n)
    # log-Gamma has finite kurtosis; 10 % is > 5 standard errors of the variance here
    assert abs(x.var() / var - 1) < 0.1
