"""Quantiles in basis coordinates against SciPy's CDFs, tails included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from numpyro_lm.quantiles import beta_logit_quantile, gamma_log_quantile

pytestmark = pytest.mark.usefixtures("x64")

U = np.array([1e-10, 1e-3, 0.1, 0.5, 0.9, 0.999, 1 - 1e-10])


@pytest.mark.parametrize("alpha,rate", [(0.05, 1.0), (0.5, 2.0), (3.0, 0.1), (1e4, 5.0)])
def test_gamma_log_quantile(alpha, rate):
    log_q = np.asarray(gamma_log_quantile(alpha, rate, jnp.asarray(U)))
    # the CDF at the quantile is u (relative precision, both tails)
    cdf = stats.gamma(alpha, scale=1 / rate).cdf(np.exp(log_q))
    sf = stats.gamma(alpha, scale=1 / rate).sf(np.exp(log_q))
    np.testing.assert_allclose(np.where(U < 0.5, cdf, 1 - sf), U, rtol=1e-6)
    assert np.all(np.diff(log_q) > 0)


def test_gamma_log_quantile_deep_lower_tail_is_finite():
    # Gamma(0.01) quantile at u=1e-12 is ~exp(-2700): underflows, the log does not
    log_q = float(gamma_log_quantile(0.01, 1.0, jnp.asarray(1e-12)))
    expected = (np.log(1e-12) + special.gammaln(1.01)) / 0.01  # P(X <= x) ~ x^a / Gamma(a + 1)
    np.testing.assert_allclose(log_q, expected, rtol=1e-6)


@pytest.mark.parametrize("a,b", [(0.05, 0.5), (0.5, 2.0), (3.0, 100.0), (1e4, 5.0)])
def test_beta_logit_quantile(a, b):
    t = np.asarray(beta_logit_quantile(a, b, jnp.asarray(U)))
    x = 1 / (1 + np.exp(-t))
    d = stats.beta(a, b)
    lower = d.cdf(x)
    upper = 1 - d.sf(x)
    ok = np.where(U < 0.5, lower, upper)
    finite_x = (x > 1e-300) & (x < 1)
    np.testing.assert_allclose(ok[finite_x], U[finite_x], rtol=1e-6)
    assert np.all(np.diff(t) > 0) and np.all(np.isfinite(t))


def test_quantiles_work_under_jit_and_vmap():
    f = jax.jit(jax.vmap(lambda a, u: gamma_log_quantile(a, 1.0, u)))
    out = f(jnp.array([1.0, 2.0]), jnp.array([0.5, 0.5]))
    np.testing.assert_allclose(np.exp(out), stats.gamma([1.0, 2.0]).ppf(0.5), rtol=1e-10)
