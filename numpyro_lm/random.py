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

__all__ = ["standard_normal", "key_bits"]


def key_bits(rng_key):
    """The raw ``uint32`` bits of a JAX key (new-style typed or legacy ``uint32[2]``)."""
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng_key).ravel()
    return rng_key.ravel()


def standard_normal(rng_key, shape: tuple, dtype=None, stream: int = 0):
    """``N(0, 1)`` draws of ``shape``, reproducible from ``rng_key`` and ``stream``."""
    dtype = jnp.result_type(float) if dtype is None else dtype

    def host(bits):
        seed = [int(b) for b in np.asarray(bits, np.uint32).ravel()] + [stream]
        return np.random.default_rng(seed).standard_normal(shape).astype(dtype)

    return jax.pure_callback(host, jax.ShapeDtypeStruct(shape, dtype), key_bits(rng_key), vmap_method="sequential")
