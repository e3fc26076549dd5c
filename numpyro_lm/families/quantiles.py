"""Quantile functions of the matched families, in their Laplace Matching basis.

JAX has the regularised incomplete gamma and beta functions but not their inverses
(numpyro's ``Gamma.icdf`` needs tensorflow_probability), and a bisection over
``lax.igamma`` costs half a second of XLA compilation per model. The copula draws need
no derivatives, so the inverses run on the host through ``jax.pure_callback`` with SciPy
(a dependency of JAX itself), computed in float64 whatever the JAX precision.

The results are in basis coordinates, ``log x`` for the Gamma and ``logit x`` for the
Beta, with the extreme tails handled analytically where ``x`` itself under- or
overflows: for ``u -> 0`` the Gamma quantile is
:math:`\\log x \\approx (\\log u + \\log\\Gamma(\\alpha + 1))/\\alpha - \\log\\lambda`, and the
Beta quantile :math:`\\log x \\approx (\\log u + \\log a + \\log B(a, b))/a`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

__all__ = ["gamma_log_quantile", "beta_logit_quantile"]

_TINY = np.finfo(np.float64).tiny


def _on_host(host_fn, *arrays):
    """Call ``host_fn`` (NumPy, float64) on broadcast arrays from inside jit or vmap."""
    arrays = jnp.broadcast_arrays(*arrays)
    dtype = jnp.result_type(*arrays, float)
    shape = jax.ShapeDtypeStruct(arrays[0].shape, dtype)

    def call(*host_arrays):
        out = host_fn(*(np.asarray(a, np.float64) for a in host_arrays))
        return np.asarray(out, dtype=dtype)

    if not any(isinstance(a, jax.core.Tracer) for a in arrays):
        # concrete inputs (host-side work) are computed here, without a callback: a callback
        # gets device copies of its arguments that wait on XLA's thread pool, which runs the
        # callback itself; a test-suite process pinned to one core hung at 0 % CPU that way
        # (in nested Laplace's mixture draws; not reproducible on demand)
        return jnp.asarray(call(*arrays))
    return jax.pure_callback(call, shape, *arrays, vmap_method="broadcast_all")


def _clip_unit(u):
    return np.clip(u, _TINY, 1.0 - np.finfo(np.float64).eps)


def _log_gamma_quantile(concentration, u):
    u = _clip_unit(u)
    x = special.gammaincinv(concentration, u)
    small = (np.log(u) + special.gammaln(concentration + 1.0)) / concentration
    with np.errstate(divide="ignore"):
        return np.where(x > _TINY, np.log(np.maximum(x, _TINY)), small)


def gamma_log_quantile(concentration, rate, u):
    """``log F^{-1}(u)`` for ``Gamma(concentration, rate)``."""
    return _on_host(_log_gamma_quantile, concentration, u) - jnp.log(rate)


def _logit_beta_quantile(a, b, u):
    u = _clip_unit(u)
    x = special.betaincinv(a, b, u)  # accurate when x is small
    y = special.betaincinv(b, a, 1.0 - u)  # 1 - x, accurate when x is near one
    log_beta = special.betaln(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):  # np.where evaluates the branch it discards too
        log_x = np.where(x > _TINY, np.log(np.maximum(x, _TINY)), (np.log(u) + np.log(a) + log_beta) / a)
        log_y = np.where(y > _TINY, np.log(np.maximum(y, _TINY)), (np.log1p(-u) + np.log(b) + log_beta) / b)
    return np.where(x < 0.5, log_x - np.log1p(-np.minimum(x, 0.5)), np.log1p(-np.minimum(y, 0.5)) - log_y)


def beta_logit_quantile(concentration1, concentration0, u):
    """``logit F^{-1}(u)`` for ``Beta(concentration1, concentration0)``."""
    return _on_host(_logit_beta_quantile, concentration1, concentration0, u)
