r"""The mode search: one damped Newton method, an L-BFGS warm start, one convergence rule.

Pure functions over a flat vector; ``fn`` is the *negative* log density, the function
minimised. Every fit of the package (the joint fit, nested Laplace's inner fits, the
exact Wishart maps) runs :func:`newton`.

**Newton.** Each iteration evaluates value, gradient and Hessian at a *trial point*
``x + t step`` (one forward-over-reverse trace of ``fn``: the compiled program holds one
copy of the model). The trial is accepted on Armijo decrease, and the next step is
computed from it (:func:`newton_step`: through the Cholesky factor where the Hessian is
positive definite, the saddle-free step through its eigendecomposition elsewhere); else
``t`` is halved. So the state always holds the gradient and Hessian *at its point*: the
curvature of the Laplace approximation comes with the last convergence check.
``num_iter`` counts evaluations. The state is resumable: a loop of :func:`newton` calls with growing
``max_iter`` (for a progress bar) gives the same iterates as one call.

**Convergence** (:func:`is_converged`) is judged by the *Newton decrement*
:math:`\sqrt{g^\top H^{-1} g}`: the length of the Newton step in posterior standard
deviations, independent of the parameters' units. Converged below ``tol``, or once the
decrease it predicts, ``decrement^2/2``, is below the rounding error of the log density
(``eps |f|``); and a trial rejected on a step whose predicted decrease is below
``1e4 eps |f|`` (and is below :data:`NOISE_FLOOR_MAX_STEP` posterior SDs) has hit the
noise of ``fn`` (sums of cancelling terms round well above ``eps |f|``): the mode is found
to that precision. Convergence says the point is
stationary; whether it is a mode is the flag ``positive``. Where convergence came from the
rounding of ``fn`` rather than ``tol``, one more full Newton step is taken (kept unless
``fn`` rises beyond its noise): the line search cannot verify it, but near the mode it
is exact to second order, so the mode's accuracy is limited by the gradient's rounding,
not the value's (conjugate models then come out exact to ~1e-15 instead of ~1e-8).

**L-BFGS** (optax, zoom line search) is a warm start for dimensions where a Hessian per
step costs too much; :func:`newton` then polishes and certifies the mode.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.custom_batching import custom_vmap

from .linalg import cholesky, solve_triangular

__all__ = [
    "NewtonState",
    "default_tol",
    "value_grad_hessian",
    "newton_step",
    "is_converged",
    "newton_init",
    "newton_iteration",
    "running",
    "newton",
    "newton_many",
    "lbfgs",
]


def default_tol(dtype) -> float:
    """Newton-decrement tolerance: 1e-9 SD in float64, 1e-3 SD in float32.

    In float32 the gradient of a sum over many observations carries rounding noise of
    order eps * sum|terms|; 1e-3 posterior SDs is well above it and far below anything
    that matters statistically.
    """
    return 1e-9 if jnp.finfo(dtype).bits == 64 else 1e-3


def _forward_mode_refused(error: TypeError) -> bool:
    """JAX's refusal of forward-mode autodiff through a ``custom_vjp`` (``odeint``'s adjoint)."""
    return "forward-mode" in str(error) and "custom_vjp" in str(error)


def hvp(fn: Callable, x, v):
    """The Hessian-vector product ``H(x) v`` of ``fn``: forward-over-reverse, or
    reverse-over-reverse (the gradient of ``grad fn . v``) where ``fn`` has a ``custom_vjp``
    that forward mode cannot differentiate (``jax.experimental.ode.odeint``)."""
    try:
        return jax.jvp(jax.grad(fn), (x,), (v,))[1]
    except TypeError as error:
        if not _forward_mode_refused(error):
            raise
    return jax.grad(lambda y: jnp.vdot(jax.grad(fn)(y), v))(x)


def hvp_operator(fn: Callable, x) -> Callable:
    """``v -> H(x) v`` with the model's forward pass run once (``jax.linearize`` of the
    gradient), so that products in a loop reuse what does not depend on ``v`` (a GP's kernel
    and its Cholesky factor) instead of recomputing it per iteration; :func:`hvp` where
    forward mode is refused."""
    try:
        return jax.linearize(jax.grad(fn), x)[1]
    except TypeError as error:
        if not _forward_mode_refused(error):
            raise
    return lambda v: hvp(fn, x, v)


def _hessian_rows(fn: Callable, x, runs: tuple):
    """The Hessian by runs of sites (:func:`numpyro_lm.trace.site_runs`), ``fn`` given the flat
    vector as :class:`~numpyro_lm.trace.Pieces`. Runs are taken smallest first; run ``k``'s
    derivative is of the gradient in ``k`` and the runs after it only (the blocks before it
    are filled in by symmetry), and the runs not differentiated carry no tangent: a GP's
    kernel and its Cholesky factor, computed from two hyperparameters, are differentiated for
    their two rows, not for each of the field's ``n`` (at n = 200: 0.46 s -> a few ms)."""
    from .trace import Pieces  # trace imports the model machinery; optimize stays below it

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
    ``runs`` are given (:func:`_hessian_rows`; ``fn`` must then pass its argument on to
    :func:`numpyro_lm.trace.unravel` untouched)."""
    basis = jnp.eye(x.shape[-1], dtype=x.dtype)
    jvp = jax.vmap(lambda v: jax.jvp(jax.value_and_grad(fn), (x,), (v,)), out_axes=((None, None), (0, 0)))
    try:
        if runs:
            (value, grad), hess = jax.value_and_grad(fn)(x), _hessian_rows(fn, x, runs)
        else:
            (value, grad), (_, hess) = jvp(basis)
    except TypeError as error:
        if not _forward_mode_refused(error):
            raise
        (value, grad), hess = jax.value_and_grad(fn)(x), jax.jacrev(jax.grad(fn))(x)
    # materialised once: XLA would otherwise fuse the D x D tangent computation into each
    # consumer (symmetrisation, the loop's state selects) and run it there again
    hess = jnp.matmul(hess, jnp.eye(hess.shape[-1], dtype=hess.dtype), precision=lax.Precision.HIGHEST)
    return value, grad, 0.5 * (hess + hess.T)


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
    # every Newton iteration (a LAPACK call of ~10 us each); decompose only the entries
    # that need it, one at a time (which also keeps clear of jaxlib's batched LAPACK, see
    # numpyro_lm.linalg)
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


NOISE_FLOOR_MAX_STEP = 0.5
"""Largest Newton step (posterior SDs) whose rejected trial may count as the noise floor of ``fn``."""


def _rounding(value):
    """The rounding error of a log density value: ``eps * max(1, |value|)``."""
    return jnp.finfo(value.dtype).eps * jnp.maximum(1.0, jnp.abs(value))


def is_converged(decrement, value, tol):
    """The convergence rule (module docstring): the step is below ``tol`` posterior SDs, or
    the decrease it predicts is below the rounding error of ``fn``."""
    return (decrement <= tol) | (0.5 * decrement**2 <= _rounding(value))


class NewtonState(NamedTuple):
    """State of :func:`newton`: the accepted point with its value, gradient and Hessian,
    and the trial pending from it (``x + t step``)."""

    x: jnp.ndarray
    value: jnp.ndarray  # fn(x); inf before the first evaluation
    grad: jnp.ndarray
    hess: jnp.ndarray
    chol: jnp.ndarray  # Cholesky factor of hess (not finite where hess is not positive definite)
    positive: jnp.ndarray  # hess is positive definite
    decrement: jnp.ndarray  # sqrt(g' H^-1 g), posterior SDs (|H| where H is not positive definite)
    grad_norm: jnp.ndarray  # max |grad|
    num_iter: jnp.ndarray  # evaluations so far
    converged: jnp.ndarray
    polished: jnp.ndarray  # the last full step after convergence is done (or not needed)
    stalled: jnp.ndarray  # the line search cannot decrease fn any more
    step: jnp.ndarray
    t: jnp.ndarray
    structure_error: jnp.ndarray  # the Hessian strategy's check at x (numpyro_lm.hessian; 0 for dense)


def _strategy(hessian):
    """The Hessian strategy (:mod:`numpyro_lm.hessian`), dense by default."""
    if hessian is None:
        from .hessian import DenseHessian

        return DenseHessian()
    return hessian


def newton_init(x0, hessian=None) -> NewtonState:
    """The state before the first evaluation (its first trial is ``x0`` itself); ``hessian``
    a strategy of :mod:`numpyro_lm.hessian` (default dense): ``hess`` and ``chol`` are its pytrees."""
    inf, false = jnp.asarray(jnp.inf, x0.dtype), jnp.asarray(False)
    hess, chol = _strategy(hessian).init(x0)
    return NewtonState(
        x=x0, value=inf, grad=jnp.zeros_like(x0), hess=hess, chol=chol, positive=false, decrement=inf,
        grad_norm=inf, num_iter=jnp.asarray(0), converged=false, polished=false, stalled=false, step=jnp.zeros_like(x0),
        t=jnp.ones((), x0.dtype), structure_error=jnp.zeros((), x0.dtype),
    )


def newton_iteration(fn: Callable, s: NewtonState, tol: float, hessian=None) -> NewtonState:
    """One evaluation of :func:`newton`: the trial ``x + t step`` accepted or rejected.

    A strategy with ``value_first`` (the structured ones of large models) evaluates ``fn``
    alone at the trial and its gradient and Hessian only where the trial is accepted: a
    rejected trial then costs one evaluation of ``fn`` instead of ``b + G + 1`` Hessian-vector
    products (two copies of the model in the compiled program, which large models afford).
    """
    hessian = _strategy(hessian)
    trial = s.x + s.t * s.step
    slope = jnp.dot(s.grad, s.step)
    polishing = s.converged  # the final full step, taken unless fn rises beyond its noise

    def accepts(value):
        decrease = (s.value == jnp.inf) | (value <= s.value + 1e-4 * s.t * slope)
        return jnp.isfinite(value) & (decrease | (polishing & (value <= s.value + 1e4 * _rounding(s.value))))

    # a structure that fails its check wherever it is evaluated (a plate whose entries the
    # likelihood couples) ends the search at once: the fit is refused, and the next curvature tried
    final = getattr(hessian, "structure_final", False)

    def moved(value, grad, hess, structure_error):
        new_step, decrement, chol, positive = hessian.step(grad, hess)
        stalled = (structure_error > jnp.sqrt(jnp.finfo(value.dtype).eps)) if final else s.stalled
        return s._replace(
            stalled=stalled, x=trial, value=value, grad=grad, hess=hess, chol=chol, positive=positive, decrement=decrement,
            structure_error=structure_error,
            grad_norm=jnp.max(jnp.abs(grad)), converged=polishing | is_converged(decrement, value, tol),
            polished=polishing | (decrement <= tol), step=new_step, t=jnp.ones_like(s.t),
        )

    # a rejected trial on a step this small has hit the noise of fn: converged there; but
    # not on a step of half a posterior SD or more, where a rejection means the quadratic
    # model is wrong (on a sum of 10^4 terms 1e4 eps |f| is tens of nats in float32)
    at_noise_floor = (jnp.isfinite(s.value) & (0.5 * s.decrement**2 <= 1e4 * _rounding(s.value))
                      & (s.decrement <= NOISE_FLOOR_MAX_STEP))
    rejected = s._replace(converged=polishing | at_noise_floor, polished=polishing | at_noise_floor,
                          stalled=(~polishing) & (~at_noise_floor) & (s.t < 2.0**-40), t=0.5 * s.t)
    if getattr(hessian, "value_first", False):
        s = lax.cond(accepts(fn(trial)), lambda: moved(*hessian.evaluate(fn, trial, s.hess)), lambda: rejected)
    else:
        evaluated = hessian.evaluate(fn, trial, s.hess)
        accept = accepts(evaluated[0])
        s = jax.tree.map(lambda a, r: jnp.where(accept, a, r), moved(*evaluated), rejected)
    return s._replace(num_iter=s.num_iter + 1)


def running(s: NewtonState, max_iter):
    """Whether the search goes on: not converged (and polished), not stalled, budget left."""
    return (~(s.converged & s.polished)) & (~s.stalled) & (s.num_iter < max_iter)


def newton(fn: Callable, state: NewtonState, tol: float, max_iter, hessian=None) -> NewtonState:
    """Damped Newton from ``state`` until converged, stalled or ``max_iter`` evaluations in total."""
    return lax.while_loop(lambda s: running(s, max_iter), lambda s: newton_iteration(fn, s, tol, hessian), state)


def newton_many(fn: Callable, state: NewtonState, data, tol: float, max_iter: int, block: int,
                hessian=None) -> NewtonState:
    """:func:`newton` for a batch: ``fn(x, data_i)``, ``state`` and ``data`` with a leading axis.

    ``jax.vmap(newton)`` would run every entry until the slowest stops. Here one vmapped
    iteration advances the running entries (the others are kept) while more than ``block``
    run; the remaining ones are then gathered into a block of that size and continue on
    their own: a batch costs about the median entry's iterations, not the slowest one's.
    Each entry's iterates are those :func:`newton` gives it alone.
    """
    iteration = jax.vmap(lambda s, d: newton_iteration(lambda x: fn(x, d), s, tol, hessian))

    def advance(carry):
        s, d = carry
        keep = running(s, max_iter)
        new = iteration(s, d)
        select = jax.tree.map(lambda a, b: jnp.where(keep.reshape(keep.shape + (1,) * (a.ndim - 1)), a, b), new, s)
        return select, d

    size = state.x.shape[0]
    if block >= size:
        return lax.while_loop(lambda c: jnp.any(running(c[0], max_iter)), advance, (state, data))[0]
    state, _ = lax.while_loop(lambda c: jnp.sum(running(c[0], max_iter)) > block, advance, (state, data))
    index = jnp.argsort(~running(state, max_iter), stable=True)[:block]  # the running ones first
    part = jax.tree.map(lambda a: a[index], (state, data))
    part, _ = lax.while_loop(lambda c: jnp.any(running(c[0], max_iter)), advance, part)
    return jax.tree.map(lambda a, b: a.at[index].set(b), state, part)


def lbfgs(fn: Callable, x0, gtol: float, max_iter: int):
    """optax L-BFGS from ``x0`` until ``max|grad| <= gtol`` or ``max_iter`` iterations.

    Returns ``(x, num_iter, max|grad|)`` (the gradient of the last iteration's start); a warm
    start for :func:`newton`, which certifies the mode.
    """
    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(fn)

    def cond(carry):
        _, _, k, gnorm = carry
        return (gnorm > gtol) & (k < max_iter)

    def body(carry):
        x, opt_state, k, _ = carry
        value, grad = value_and_grad(x, state=opt_state)
        updates, opt_state = opt.update(grad, opt_state, x, value=value, grad=grad, value_fn=fn)
        return optax.apply_updates(x, updates), opt_state, k + 1, jnp.max(jnp.abs(grad))

    init = (x0, opt.init(x0), jnp.asarray(0), jnp.asarray(jnp.inf, x0.dtype))
    x, _, num_iter, grad_norm = lax.while_loop(cond, body, init)
    return x, num_iter, grad_norm
