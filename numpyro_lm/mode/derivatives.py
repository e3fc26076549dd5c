r"""Derivatives of a flat log density for the mode search: Hessian-vector products, and the
value, gradient and Hessian from one trace (by runs of sites where the sites are many).

Forward-over-reverse throughout, falling back to reverse-over-reverse where ``fn`` holds a
``custom_vjp`` that forward mode cannot differentiate (``jax.experimental.ode.odeint``'s
adjoint): :func:`forward_mode_refused` recognises JAX's refusal.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["forward_mode_refused", "hvp", "jacobian", "diagonal_slope", "hvp_operator", "Pieces", "hessian_by_runs", "value_grad_hessian"]


def forward_mode_refused(error: TypeError) -> bool:
    """JAX's refusal of forward-mode autodiff through a ``custom_vjp`` (``odeint``'s adjoint)."""
    return "forward-mode" in str(error) and "custom_vjp" in str(error)


def hvp(fn: Callable, x, v):
    """The Hessian-vector product ``H(x) v`` of ``fn``: forward-over-reverse, or
    reverse-over-reverse (the gradient of ``grad fn . v``) where ``fn`` has a ``custom_vjp``
    that forward mode cannot differentiate (``jax.experimental.ode.odeint``)."""
    try:
        return jax.jvp(jax.grad(fn), (x,), (v,))[1]
    except TypeError as error:
        if not forward_mode_refused(error):
            raise
    return jax.grad(lambda y: jnp.vdot(jax.grad(fn)(y), v))(x)


def jacobian(fn: Callable, x):
    """The Jacobian of ``fn`` at ``x``: forward mode, or reverse mode where forward mode is
    refused (:func:`forward_mode_refused`: a model with ``odeint`` traced along)."""
    try:
        return jax.jacfwd(fn)(x)
    except TypeError as error:
        if not forward_mode_refused(error):
            raise
    return jax.jacrev(fn)(x)


def diagonal_slope(fn: Callable, x):
    """``J 1`` of an elementwise map ``fn`` (its Jacobian's diagonal): one forward product, or one
    reverse product (``1' J``, the same for a diagonal ``J``) where forward mode is refused."""
    try:
        return jax.jvp(fn, (x,), (jnp.ones_like(x),))[1]
    except TypeError as error:
        if not forward_mode_refused(error):
            raise
    value, pullback = jax.vjp(fn, x)
    return pullback(jnp.ones_like(value))[0]


def hvp_operator(fn: Callable, x) -> Callable:
    """``v -> H(x) v`` with the model's forward pass run once (``jax.linearize`` of the
    gradient), so that products in a loop reuse what does not depend on ``v`` (a GP's kernel
    and its Cholesky factor) instead of recomputing it per iteration; :func:`hvp` where
    forward mode is refused."""
    try:
        return jax.linearize(jax.grad(fn), x)[1]
    except TypeError as error:
        if not forward_mode_refused(error):
            raise
    return lambda v: hvp(fn, x, v)


@jax.tree_util.register_pytree_node_class
class Pieces:
    """The flat vector as consecutive pieces, ``arrays[k]`` starting at coordinate ``starts[k]``,
    each a run of whole sites. :func:`unravel` reads each site from its own piece, so that a
    derivative in one piece carries no tangent into the others' sites (one flat vector would
    give every site a tangent, zero but computed: a GP's Cholesky differentiated for each of
    its field's coordinates)."""

    def __init__(self, starts: tuple, arrays: tuple):
        self.starts, self.arrays = tuple(starts), tuple(arrays)

    def tree_flatten(self):
        return self.arrays, self.starts

    @classmethod
    def tree_unflatten(cls, starts, arrays):
        return cls(starts, arrays)

    def flat(self):
        return jnp.concatenate(self.arrays, axis=-1)

    def site(self, offset: int, size: int):
        for start, array in zip(self.starts, self.arrays):
            if start <= offset and offset + size <= start + array.shape[-1]:
                return array[..., offset - start : offset - start + size]
        raise ValueError(f"no piece holds coordinates {offset}..{offset + size - 1}: pieces must be runs of whole sites")


def hessian_by_runs(fn: Callable, x, runs: tuple):
    """The Hessian by runs of sites (:func:`numpyro_lm.core.trace.site_runs`), ``fn`` given the flat
    vector as :class:`Pieces`. Runs are taken smallest first; run ``k``'s
    derivative is of the gradient in ``k`` and the runs after it only (the blocks before it
    are filled in by symmetry), and the runs not differentiated carry no tangent: a GP's
    kernel and its Cholesky factor, computed from two hyperparameters, are differentiated for
    their two rows, not for each of the field's ``n``."""
    starts = tuple(a for a, _ in runs)
    pieces = tuple(x[a:b] for a, b in runs)
    order = sorted(range(len(runs)), key=lambda k: runs[k][1] - runs[k][0])
    hess = jnp.zeros((x.shape[-1],) * 2, x.dtype)
    for i, k in enumerate(order):
        moving = (k,) + tuple(order[i + 1:])

        def grads(piece, moving=moving):
            def value(parts):
                new = dict(zip(moving, parts))
                return fn(Pieces(starts, tuple(new.get(j, p) for j, p in enumerate(pieces))))

            return jax.grad(value)((piece,) + tuple(pieces[j] for j in moving[1:]))

        basis = jnp.eye(pieces[k].shape[-1], dtype=x.dtype)
        blocks = jax.vmap(lambda v: jax.jvp(grads, (pieces[k],), (v,))[1])(basis)
        a, b = runs[k]
        for j, block in zip(moving, blocks):  # block: rows of run k, columns of run j
            c, d = runs[j]
            hess = hess.at[a:b, c:d].set(block)
            if j != k:
                hess = hess.at[c:d, a:b].set(block.T)
    return hess


def value_grad_hessian(fn: Callable, x, runs: tuple = ()):
    """``fn(x)``, its gradient and (symmetrised) Hessian from one forward-over-reverse trace
    (reverse-over-reverse where forward mode is refused: :func:`hvp`), or run by run where
    ``runs`` are given (:func:`hessian_by_runs`; ``fn`` must then pass its argument on to
    :func:`numpyro_lm.core.trace.unravel` untouched)."""
    basis = jnp.eye(x.shape[-1], dtype=x.dtype)
    jvp = jax.vmap(lambda v: jax.jvp(jax.value_and_grad(fn), (x,), (v,)), out_axes=((None, None), (0, 0)))
    try:
        if runs:
            (value, grad), hess = jax.value_and_grad(fn)(x), hessian_by_runs(fn, x, runs)
        else:
            (value, grad), (_, hess) = jvp(basis)
    except TypeError as error:
        if not forward_mode_refused(error):
            raise
        (value, grad), hess = jax.value_and_grad(fn)(x), jax.jacrev(jax.grad(fn))(x)
    # materialised once: XLA would otherwise fuse the D x D tangent computation into each
    # consumer (symmetrisation, the loop's state selects) and run it there again
    hess = jnp.matmul(hess, jnp.eye(hess.shape[-1], dtype=hess.dtype), precision=lax.Precision.HIGHEST)
    return value, grad, 0.5 * (hess + hess.T)
