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

The L-BFGS warm start for large models is :mod:`.lbfgs`; the derivatives :mod:`.derivatives`;
the dense step :mod:`.steps`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .hessian import DenseHessian

__all__ = [
    "NewtonState",
    "default_tol",
    "is_converged",
    "newton_init",
    "newton_iteration",
    "running",
    "newton",
    "newton_many",
]


def default_tol(dtype) -> float:
    """Newton-decrement tolerance: 1e-9 SD in float64, 1e-3 SD in float32.

    In float32 the gradient of a sum over many observations carries rounding noise of
    order eps * sum|terms|; 1e-3 posterior SDs is well above it and far below anything
    that matters statistically.
    """
    return 1e-9 if jnp.finfo(dtype).bits == 64 else 1e-3


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
    structure_error: jnp.ndarray  # the Hessian strategy's check at x (numpyro_lm.mode.hessian; 0 for dense)


def newton_init(x0, hessian=DenseHessian()) -> NewtonState:
    """The state before the first evaluation (its first trial is ``x0`` itself); ``hessian``
    a strategy of :mod:`numpyro_lm.mode.hessian` (default dense): ``hess`` and ``chol`` are its pytrees."""
    inf, false = jnp.asarray(jnp.inf, x0.dtype), jnp.asarray(False)
    hess, chol = hessian.init(x0)
    return NewtonState(
        x=x0, value=inf, grad=jnp.zeros_like(x0), hess=hess, chol=chol, positive=false, decrement=inf,
        grad_norm=inf, num_iter=jnp.asarray(0), converged=false, polished=false, stalled=false, step=jnp.zeros_like(x0),
        t=jnp.ones((), x0.dtype), structure_error=jnp.zeros((), x0.dtype),
    )


def newton_iteration(fn: Callable, s: NewtonState, tol: float, hessian=DenseHessian()) -> NewtonState:
    """One evaluation of :func:`newton`: the trial ``x + t step`` accepted or rejected.

    A strategy with ``value_first`` (the structured ones of large models) evaluates ``fn``
    alone at the trial and its gradient and Hessian only where the trial is accepted: a
    rejected trial then costs one evaluation of ``fn`` instead of ``b + G + 1`` Hessian-vector
    products (two copies of the model in the compiled program, which large models afford).
    """
    trial = s.x + s.t * s.step
    slope = jnp.dot(s.grad, s.step)
    polishing = s.converged  # the final full step, taken unless fn rises beyond its noise

    def accepts(value):
        decrease = (s.value == jnp.inf) | (value <= s.value + 1e-4 * s.t * slope)
        return jnp.isfinite(value) & (decrease | (polishing & (value <= s.value + 1e4 * _rounding(s.value))))

    # a structure that fails its check wherever it is evaluated (a plate whose entries the
    # likelihood couples) ends the search at once: the fit is refused, and the next curvature tried
    final = hessian.structure_final

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
    if hessian.value_first:
        # the trial's value taken from fn(trial), not from the evaluation: what only the value
        # needs (a likelihood's normaliser, lgamma(y + 1) of Poisson counts) then leaves the
        # conditional, and XLA hoists it out of the loop (at 10^5 counts in float64, 27 of the
        # 140 ms of an inner fit)
        value = fn(trial)
        s = lax.cond(accepts(value), lambda: moved(value, *hessian.evaluate(fn, trial, s.hess)[1:]), lambda: rejected)
    else:
        evaluated = hessian.evaluate(fn, trial, s.hess)
        accept = accepts(evaluated[0])
        s = jax.tree.map(lambda a, r: jnp.where(accept, a, r), moved(*evaluated), rejected)
    return s._replace(num_iter=s.num_iter + 1)


def running(s: NewtonState, max_iter):
    """Whether the search goes on: not converged (and polished), not stalled, budget left."""
    return (~(s.converged & s.polished)) & (~s.stalled) & (s.num_iter < max_iter)


def newton(fn: Callable, state: NewtonState, tol: float, max_iter, hessian=DenseHessian()) -> NewtonState:
    """Damped Newton from ``state`` until converged, stalled or ``max_iter`` evaluations in total."""
    return lax.while_loop(lambda s: running(s, max_iter), lambda s: newton_iteration(fn, s, tol, hessian), state)


def newton_many(fn: Callable, state: NewtonState, data, tol: float, max_iter: int, block: int,
                hessian=DenseHessian()) -> NewtonState:
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
