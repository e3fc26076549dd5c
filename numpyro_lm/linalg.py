"""Dense linear algebra that stays safe under ``jax.vmap`` on CPU.

Under ``jax.vmap`` JAX turns ``eigh``, ``cholesky`` and triangular solves into batched
LAPACK calls, which jaxlib (0.10) spreads over XLA:CPU's intra-op thread pool; inside the
parallel loops of a compiled program on a machine with few cores, the pool's threads then
wait on each other for ever (seen: ``run_many`` over 200 data sets on two cores). These
wrappers run one LAPACK call per batch entry instead (``jax.custom_batching.sequential_vmap``):
the same numbers, a loop of small calls, no hang. Unbatched calls are JAX's own.
"""

from __future__ import annotations


import jax.numpy as jnp
from jax.custom_batching import sequential_vmap
from jax.scipy.linalg import solve_triangular as _solve_triangular

__all__ = ["eigh", "cholesky", "solve_triangular"]


@sequential_vmap
def eigh(a):
    """``jnp.linalg.eigh``: ``(eigenvalues ascending, eigenvectors as columns)``."""
    return jnp.linalg.eigh(a)


@sequential_vmap
def cholesky(a):
    """``jnp.linalg.cholesky`` (lower; NaN where ``a`` is not positive definite)."""
    return jnp.linalg.cholesky(a)


def solve_triangular(a, b, lower: bool):
    """``jax.scipy.linalg.solve_triangular(a, b, lower=lower)``."""
    return (_solve_lower if lower else _solve_upper)(a, b)


@sequential_vmap
def _solve_lower(a, b):
    return _solve_triangular(a, b, lower=True)


@sequential_vmap
def _solve_upper(a, b):
    return _solve_triangular(a, b, lower=False)


