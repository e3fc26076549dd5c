"""Standard normal draws for the copula, generated on the host from a JAX key.

XLA on CPU compiles JAX's threefry normal generator in a few tenths of a second per
call site, which is most of the cold cost of a small Laplace fit. The draws need no
derivatives, so they come from NumPy's PCG64 through ``jax.pure_callback``, seeded by the
key's bits and a ``stream`` number: the same key gives the same draws, different streams
give independent ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["standard_normal", "log_gamma", "host_log_gamma", "key_bits", "host_generator"]


def key_bits(rng_key):
    """The raw ``uint32`` bits of a JAX key (new-style typed or legacy ``uint32[2]``)."""
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng_key).ravel()
    return rng_key.ravel()


def _generator(bits, stream: int):
    return np.random.default_rng([int(b) for b in np.asarray(bits, np.uint32).ravel()] + [stream])


def host_generator(rng_key, stream: int = 0) -> np.random.Generator:
    """A NumPy generator seeded by a concrete JAX key and a stream number (host-side work)."""
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        rng_key = jax.random.key_data(rng_key)
    return _generator(np.asarray(rng_key), stream)  # ravelled on the host: no eager program


def standard_normal(rng_key, shape: tuple, dtype=None, stream: int = 0):
    """``N(0, 1)`` draws of ``shape``, reproducible from ``rng_key`` and ``stream``."""
    dtype = jnp.result_type(float) if dtype is None else dtype

    def host(bits):
        return _generator(bits, stream).standard_normal(shape).astype(dtype)

    return jax.pure_callback(host, jax.ShapeDtypeStruct(shape, dtype), key_bits(rng_key), vmap_method="sequential")


def log_gamma(rng_key, concentration, shape: tuple, stream: int = 0):
    r"""``log X`` with ``X ~ Gamma(concentration, 1)`` of ``shape`` (batch shape last).

    Uses :math:`X \overset{d}{=} Y U^{1/\alpha}` with ``Y ~ Gamma(alpha + 1)`` and
    ``U ~ Uniform(0, 1)``, so the log stays finite for concentrations far below one,
    where Gamma draws underflow to zero.
    """
    dtype = jnp.result_type(concentration, float)

    def host(bits, alpha):
        alpha = np.broadcast_to(np.asarray(alpha, np.float64), shape)
        return host_log_gamma(_generator(bits, stream), alpha).astype(dtype)

    return jax.pure_callback(
        host, jax.ShapeDtypeStruct(shape, dtype), key_bits(rng_key), concentration, vmap_method="sequential"
    )


def host_log_gamma(rng: np.random.Generator, concentration) -> np.ndarray:
    """NumPy twin of :func:`log_gamma`: ``log X``, ``X ~ Gamma(concentration, 1)`` (float64)."""
    alpha = np.asarray(concentration, np.float64)
    return np.log(rng.standard_gamma(alpha + 1.0)) + np.log(rng.random(alpha.shape)) / alpha
