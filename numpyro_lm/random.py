"""Random draws from JAX keys, reproducible and stable in the number of draws.

Draw ``i`` comes from ``jax.random.fold_in(rng_key, i)``: the same key gives the same
draws, under ``jax.jit`` and ``jax.vmap`` alike, and asking for more draws extends the
first ones instead of replacing them. Gamma variates (for the Dirichlet and Wishart
families) come from uniforms through the Gamma quantile function, which JAX lacks and
:mod:`numpyro_lm.quantiles` computes on the host (a ``pure_callback`` that vmaps): exact,
and no rejection sampler to compile.

The NumPy helpers at the end serve host-side work (nested Laplace's mixture draws,
importance resampling), seeded from a concrete key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .quantiles import gamma_log_quantile

__all__ = ["normal_rows", "uniform_rows", "log_gamma", "host_generator", "host_log_gamma"]


def _rows(draw, rng_key, num_rows: int):
    return jax.vmap(lambda i: draw(jax.random.fold_in(rng_key, i)))(jnp.arange(num_rows))


def normal_rows(rng_key, num_rows: int, shape: tuple = (), dtype=None):
    """``(num_rows,) + shape`` standard normal draws, row ``i`` from ``fold_in(rng_key, i)``."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    return _rows(lambda k: jax.random.normal(k, shape, dtype), rng_key, num_rows)


def uniform_rows(rng_key, num_rows: int, shape: tuple = (), dtype=None):
    """``(num_rows,) + shape`` uniforms on ``(0, 1)`` (never exactly 0), row by row as above."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    tiny = jnp.finfo(dtype).tiny
    return _rows(lambda k: jax.random.uniform(k, shape, dtype, minval=tiny), rng_key, num_rows)


def log_gamma(rng_key, concentration, num_rows: int):
    r"""``log X``, ``X ~ Gamma(concentration, 1)``: ``(num_rows,) + concentration.shape`` draws.

    By inversion, :math:`\log F^{-1}(U)`, so the log stays finite for concentrations far
    below one, where Gamma draws underflow to zero.
    """
    concentration = jnp.asarray(concentration)
    dtype = jnp.result_type(concentration, float)
    u = uniform_rows(rng_key, num_rows, concentration.shape, dtype)
    return gamma_log_quantile(concentration, jnp.ones((), dtype), u)


def host_generator(rng_key, stream: int = 0) -> np.random.Generator:
    """A NumPy generator seeded by a concrete JAX key and a stream number (host-side work)."""
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        rng_key = jax.random.key_data(rng_key)
    bits = np.asarray(rng_key, np.uint32).ravel()  # on the host: no eager program
    return np.random.default_rng([int(b) for b in bits] + [stream])


def host_log_gamma(rng: np.random.Generator, concentration) -> np.ndarray:
    """NumPy twin of :func:`log_gamma` (float64), by :math:`X = Y U^{1/\\alpha}`,
    ``Y ~ Gamma(alpha + 1)``: finite for tiny concentrations."""
    alpha = np.asarray(concentration, np.float64)
    return np.log(rng.standard_gamma(alpha + 1.0)) + np.log(rng.random(alpha.shape)) / alpha
