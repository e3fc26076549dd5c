"""Dense linear algebra for one fit and for a batch of fits (``jax.vmap``) on CPU.

One matrix: JAX's own LAPACK calls. A batch of matrices (``run_many``): jaxlib (0.10)
calls LAPACK once per matrix of the batch, spread over XLA:CPU's intra-op thread pool,
which has two costs. Many small matrices pay microseconds of call overhead each (for a
batch of small Newton steps, more than their Hessians cost), and
inside the parallel loops of a compiled program on a machine with few cores the pool's
threads can wait on each other for ever (seen: ``eigh`` in ``run_many`` over 200 data
sets on two cores). So under ``jax.vmap`` (``jax.custom_batching.custom_vmap``):

- :func:`cholesky` and :func:`solve_triangular` run, for a batch of up to
  :data:`SEQUENTIAL_MAX` entries (a small ``run_many`` batch, the variances of nested
  Laplace's conditional fits), as one LAPACK call per entry in a loop (``lax.map``: cheap
  to trace and compile; the substitution loops below made a third of the compile time of
  a nested fit when its inner fits were vmapped), and for a
  larger batch as column loops of array operations vectorised over the batch
  (Cholesky-Banachiewicz; forward and back substitution): ``D`` steps of ``O(B D^2)``
  work, no LAPACK;
- :func:`eigh` runs one LAPACK call per entry (``sequential_vmap``): it is needed rarely
  (saddle-free steps, a curvature's spectrum).

The results equal JAX's to rounding; a matrix that is not positive definite gives a
factor with ``NaN``, as LAPACK's does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap, sequential_vmap
from jax.scipy.linalg import solve_triangular as _lapack_solve_triangular

__all__ = ["SEQUENTIAL_MAX", "eigh", "cholesky", "solve_triangular", "cholesky_columns", "substitution"]

SEQUENTIAL_MAX = 64
"""Batches up to this size get one LAPACK call per entry; larger ones the vectorised loops."""


@sequential_vmap
def eigh(a):
    """``jnp.linalg.eigh``: ``(eigenvalues ascending, eigenvectors as columns)``."""
    return jnp.linalg.eigh(a)


def _batched(args, in_batched, axis_size):
    return [x if b else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x)) for x, b in zip(args, in_batched)]


def cholesky_columns(a):
    """Lower Cholesky factor column by column (one matrix; array operations that vectorise
    under ``jax.vmap``; NaN where ``a`` is not positive definite)."""
    n = a.shape[-1]
    index = jnp.arange(n)

    def column(j, lower):
        row = jnp.where(index < j, lower[j], 0.0)  # L[j, :j]
        pivot = jnp.sqrt(a[j, j] - row @ row)  # NaN where a is not positive definite
        below = (a[:, j] - lower @ row) / pivot
        return lower.at[:, j].set(jnp.where(index > j, below, jnp.where(index == j, pivot, 0.0)))

    return lax.fori_loop(0, n, column, jnp.zeros_like(a))


@custom_vmap
def cholesky(a):
    """``jnp.linalg.cholesky`` (lower; ``NaN`` where ``a`` is not positive definite)."""
    return jnp.linalg.cholesky(a)


@cholesky.def_vmap
def _cholesky_batched(axis_size, in_batched, a):
    (a,) = _batched((a,), in_batched, axis_size)
    if axis_size <= SEQUENTIAL_MAX:
        return lax.map(jnp.linalg.cholesky, a), True
    return jax.vmap(cholesky_columns)(a), True


def _substitution(a, b, lower: bool):
    """Solve ``a x = b`` for triangular ``a`` and a vector ``b`` (one system; vectorises under vmap)."""
    n = a.shape[-1]
    index = jnp.arange(n)

    def step(k, x):
        j = k if lower else n - 1 - k
        done = (index < j) if lower else (index > j)
        return x.at[j].set((b[j] - jnp.where(done, a[j], 0.0) @ x) / a[j, j])

    return lax.fori_loop(0, n, step, jnp.zeros_like(b))


def substitution(a, b, lower: bool):
    """Solve ``a x = b`` for triangular ``a`` and ``b`` of shape ``(n,)`` or ``(n, k)`` by substitution
    (array operations: vectorises under ``jax.vmap``, no LAPACK call)."""
    if b.ndim == 1:
        return _substitution(a, b, lower)
    return jax.vmap(lambda col: _substitution(a, col, lower), in_axes=1, out_axes=1)(b)


def _triangular_solver(lower: bool):
    """LAPACK's triangular solve for one matrix, substitution loops under ``vmap``."""

    @custom_vmap
    def solve(a, b):
        return _lapack_solve_triangular(a, b, lower=lower)

    @solve.def_vmap
    def solve_batched(axis_size, in_batched, a, b):
        a, b = _batched((a, b), in_batched, axis_size)
        if axis_size <= SEQUENTIAL_MAX:
            return lax.map(lambda mv: _lapack_solve_triangular(*mv, lower=lower), (a, b)), True
        return jax.vmap(lambda m, v: substitution(m, v, lower))(a, b), True

    return solve


_solve_lower, _solve_upper = _triangular_solver(True), _triangular_solver(False)


def solve_triangular(a, b, lower: bool):
    """``jax.scipy.linalg.solve_triangular(a, b, lower=lower)`` for ``b`` of shape ``(D,)`` or ``(D, k)``."""
    return (_solve_lower if lower else _solve_upper)(a, b)
