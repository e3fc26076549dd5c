"""The Newton step from a dense Hessian: through its Cholesky factor where it is positive
definite, the saddle-free step through its eigendecomposition elsewhere (Dauphin et al. 2014)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap

from ..curvature.linalg import cholesky, solve_triangular

__all__ = ["newton_step"]


def _saddle_free(grad, hess):
    w, q = jnp.linalg.eigh(hess)
    w = jnp.maximum(jnp.abs(w), jnp.finfo(w.dtype).eps * jnp.maximum(jnp.max(jnp.abs(w)), 1.0))
    g = q.T @ grad
    return -q @ (g / w), jnp.sqrt(jnp.sum(g**2 / w))


def _no_step(grad, hess):
    return jnp.zeros_like(grad), jnp.zeros((), grad.dtype)


@custom_vmap
def _saddle_free_where(needed, grad, hess):
    """:func:`_saddle_free` where ``needed``, zeros elsewhere."""
    return lax.cond(needed, _saddle_free, _no_step, grad, hess)


@_saddle_free_where.def_vmap
def _saddle_free_where_batched(axis_size, in_batched, needed, grad, hess):
    # vmap would turn the cond into a select and decompose every Hessian of the batch at
    # every Newton iteration (a LAPACK call each); decompose only the entries
    # that need it, one at a time (which also keeps clear of jaxlib's batched LAPACK, see
    # numpyro_lm.curvature.linalg)
    needed, grad, hess = (x if b else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x))
                          for x, b in zip((needed, grad, hess), in_batched))

    # the entries that need it first, then a loop over just those
    count = jnp.sum(needed)
    order = jnp.argsort(~needed, stable=True)

    def each(i, out):
        j = order[i]
        step, decrement = _saddle_free(grad[j], hess[j])
        return out[0].at[j].set(step), out[1].at[j].set(decrement)

    out = lax.fori_loop(0, count, each, (jnp.zeros_like(grad), jnp.zeros(grad.shape[:1], grad.dtype)))
    return out, (True, True)


def newton_step(grad, hess):
    """``(step, decrement, chol, positive)``: the Newton step and its length in posterior SDs.

    Where ``hess`` is positive definite, its Cholesky factor ``chol`` gives ``-H^-1 g``;
    elsewhere the *saddle-free* step ``-|H|^-1 g`` with ``|H|`` the Hessian's absolute
    eigenvalues (floored at ``eps`` of the largest): a descent direction that is repelled
    by saddle points and takes full-length steps along directions of negative curvature
    (Dauphin et al. 2014). ``decrement`` is ``sqrt(g' H^-1 g)`` with the matrix used.
    Under ``jax.vmap`` the eigendecomposition runs only when an entry of the batch needs it.
    """
    chol = cholesky(hess)
    positive = jnp.all(jnp.isfinite(chol)) & jnp.all(jnp.diagonal(chol) > 0)
    g = solve_triangular(chol, grad, lower=True)
    step = -solve_triangular(chol.T, g, lower=False)
    free_step, free_decrement = _saddle_free_where(~positive, grad, hess)
    step = jnp.where(positive, step, free_step)
    decrement = jnp.where(positive, jnp.sqrt(jnp.sum(g**2)), free_decrement)
    return step, decrement, chol, positive
