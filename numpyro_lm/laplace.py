"""The mode of a log density and the Gaussian at it (the Laplace approximation).

Pure functions over a flat vector. ``fn`` is always the *negative* log density, the
function minimised.

Newton's method (dense Hessian) is the default while the Hessian is affordable: it
converges in a handful of steps and each step already computes the curvature that the
Laplace approximation needs. Steps use the absolute eigenvalues of the Hessian (so saddle
points repel instead of attract) and a backtracking Armijo line search. L-BFGS (optax)
takes over for large dimensions, followed by Newton polishing steps.

Convergence is judged by the *Newton decrement* ``sqrt(g' H^-1 g)``: the length of the
Newton step measured in posterior standard deviations, i.e. the gradient norm in the
metric of the posterior covariance. It does not depend on the units of the parameters.
It counts as converged below ``tol``, or once the decrease it predicts, ``decrement^2/2``,
is below the rounding error of the log density (``eps |f|``), or when the line search
fails on a step whose predicted decrease is below ``1e4 eps |f|`` (log densities that
are sums of cancelling terms round well above ``eps |f|``): beyond that point no step
can be told apart from noise.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from .random import standard_normal

__all__ = [
    "FAST_COMPILE",
    "usable_compiler_options",
    "OptimState",
    "initial_state",
    "default_tol",
    "newton_minimize",
    "TrialNewtonState",
    "modified_cholesky",
    "trial_newton_minimize",
    "lbfgs_minimize",
    "value_grad_hessian",
    "evaluate",
    "Gaussian",
    "gaussian_from_eigh",
]


# XLA options for the small programs of a Laplace fit: LLVM's backend optimisations cost
# two to three times the compile time and buy little on dense linear algebra of this size;
# XLA:CPU's elemental emitters compile the many small fusions of a log density in about
# half the time of its newer fusion emitters (jaxlib 0.10), at the same speed.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


@functools.lru_cache(maxsize=None)
def _known_option(name: str, value) -> bool:
    try:
        jax.jit(lambda x: x, compiler_options={name: value}).lower(0.0).compile()
    except Exception:  # "No such compile option" from a jaxlib without it
        return False
    return True


def usable_compiler_options(options):
    """``options`` less the entries of :data:`FAST_COMPILE` this jaxlib does not know.

    Checked once per option on first use (after the user has configured JAX), by
    compiling an identity; options a user adds are passed on unchecked.
    """
    if options is None:
        return None
    return {k: v for k, v in options.items()
            if not (k in FAST_COMPILE and v == FAST_COMPILE[k]) or _known_option(k, v)}


class OptimState(NamedTuple):
    """State of the mode search.

    ``grad``, ``hess`` and its eigen-decomposition belong to ``x`` when ``fresh`` (the
    last iteration did not move), which is the case after convergence: the curvature of
    the Laplace approximation then comes for free with the last Newton check.
    """

    x: jnp.ndarray  # current point
    value: jnp.ndarray  # fn(x)
    grad: jnp.ndarray
    hess: jnp.ndarray
    eigenvalues: jnp.ndarray  # of hess, ascending
    eigenvectors: jnp.ndarray
    grad_norm: jnp.ndarray  # max |grad|
    decrement: jnp.ndarray  # sqrt(g' |H|^-1 g), in posterior SD units
    num_iter: jnp.ndarray  # iterations done so far
    converged: jnp.ndarray  # decrement <= tol
    stalled: jnp.ndarray  # the line search could not decrease fn
    fresh: jnp.ndarray


def default_tol(dtype) -> float:
    """Newton-decrement tolerance: 1e-9 SD in float64, 1e-3 SD in float32.

    In float32 the gradient of a sum over many observations carries rounding noise of
    order eps * sum|terms|; 1e-3 posterior SDs is well above it and far below anything
    that matters statistically.
    """
    return 1e-9 if jnp.finfo(dtype).bits == 64 else 1e-3


def value_grad_hessian(fn: Callable, x):
    """``fn(x)``, its gradient and Hessian from one forward-over-reverse trace of ``fn``."""
    basis = jnp.eye(x.shape[-1], dtype=x.dtype)
    jvp = jax.vmap(lambda v: jax.jvp(jax.value_and_grad(fn), (x,), (v,)), out_axes=((None, None), (0, 0)))
    (value, grad), (_, hess) = jvp(basis)
    # materialised once: XLA would otherwise fuse the D x D tangent computation into each
    # consumer (symmetrisation, the loop's state selects) and run it there again
    hess = jnp.matmul(hess, jnp.eye(hess.shape[-1], dtype=hess.dtype), precision=lax.Precision.HIGHEST)
    return value, grad, hess


def evaluate(fn: Callable, state: OptimState) -> OptimState:
    """Value, gradient, Hessian and its eigen-decomposition at ``state.x``."""
    value, grad, hess = value_grad_hessian(fn, state.x)
    hess = 0.5 * (hess + hess.T)
    eigval, eigvec = jnp.linalg.eigh(hess)
    _, decrement = _saddle_free_step(grad, eigval, eigvec)
    return state._replace(
        value=value, grad=grad, hess=hess, eigenvalues=eigval, eigenvectors=eigvec,
        grad_norm=jnp.max(jnp.abs(grad)), decrement=decrement, fresh=jnp.asarray(True),
    )


def _rounding(value):
    """The rounding error of a log density value: ``eps * max(1, |value|)``."""
    return jnp.finfo(value.dtype).eps * jnp.maximum(1.0, jnp.abs(value))


def _saddle_free_step(grad, eigval, eigvec):
    """``-|H|^-1 g`` with ``|H|`` the Hessian with absolute (floored) eigenvalues."""
    floor = jnp.finfo(eigval.dtype).eps * jnp.maximum(jnp.max(jnp.abs(eigval)), 1.0)
    abs_eigval = jnp.maximum(jnp.abs(eigval), floor)
    g = eigvec.T @ grad
    return -eigvec @ (g / abs_eigval), jnp.sqrt(jnp.sum(g**2 / abs_eigval))


def _backtrack(fn, x, value, grad, step, max_halvings=40, c=1e-4):
    """Armijo backtracking: the largest ``t = 2^-k`` with enough decrease (``t = 0`` if none).

    ``fn`` appears once in the loop body (not also before it) to keep one copy of the
    model in the compiled program.
    """
    slope = jnp.dot(grad, step)

    def ok(t, new_value):
        return jnp.isfinite(new_value) & (new_value <= value + c * t * slope)

    def cond(carry):
        t, new_value, k = carry
        return (~ok(t, new_value)) & (k <= max_halvings)

    def body(carry):
        t, _, k = carry
        return 0.5 * t, fn(x + 0.5 * t * step), k + 1

    two = jnp.full((), 2.0, x.dtype)
    t, new_value, _ = lax.while_loop(cond, body, (two, jnp.full((), jnp.inf, x.dtype), 0))
    accepted = ok(t, new_value)
    return jnp.where(accepted, t, 0.0), jnp.where(accepted, new_value, value)


def newton_minimize(fn: Callable, state: OptimState, tol: float, max_iter) -> OptimState:
    """Damped Newton from ``state`` until converged, stalled or ``max_iter`` iterations in total."""

    def cond(s):
        return (~s.converged) & (~s.stalled) & (s.num_iter < max_iter)

    def body(s):
        s = evaluate(fn, s)
        step, _ = _saddle_free_step(s.grad, s.eigenvalues, s.eigenvectors)
        # Converged when the step is below ``tol`` posterior SDs, or when the decrease a
        # Newton step predicts (decrement^2 / 2) is below the rounding error of fn.
        rounding = _rounding(s.value)
        converged = (s.decrement <= tol) | (0.5 * s.decrement**2 <= rounding)
        t, new_value = _backtrack(fn, s.x, s.value, s.grad, step)
        t = jnp.where(converged, 0.0, t)
        # A line search that fails on a step this small has hit the noise of fn (sums with
        # cancelling terms round far above eps |f|): the mode is found to that precision.
        at_noise_floor = (t == 0.0) & (0.5 * s.decrement**2 <= 1e4 * rounding)
        converged = converged | at_noise_floor
        return s._replace(
            x=s.x + t * step,
            value=jnp.where(t > 0, new_value, s.value),
            num_iter=s.num_iter + jnp.where(converged, 0, 1),
            converged=converged,
            stalled=(~converged) & (t == 0.0),
            fresh=t == 0.0,
        )

    return lax.while_loop(cond, body, state)


class TrialNewtonState(NamedTuple):
    """State of :func:`trial_newton_minimize` (``hess`` and ``chol`` belong to ``x`` when ``fresh``)."""

    x: jnp.ndarray
    value: jnp.ndarray
    grad: jnp.ndarray
    hess: jnp.ndarray
    chol: jnp.ndarray  # lower Cholesky factor of hess, or of hess + shift I where not positive definite
    positive: jnp.ndarray  # hess is positive definite
    decrement: jnp.ndarray
    num_iter: jnp.ndarray
    converged: jnp.ndarray
    stalled: jnp.ndarray
    fresh: jnp.ndarray


def modified_cholesky(hess):
    """``(L, positive)``: the Cholesky factor of ``hess``, or where it is not positive
    definite of ``hess + mu I`` with Gershgorin's ``mu = max_i (sum_{j != i} |H_ij| - H_ii)``
    (plus ``sqrt(eps)`` of the diagonal's scale), which is."""
    chol = jnp.linalg.cholesky(hess)
    positive = jnp.all(jnp.isfinite(chol))
    diagonal = jnp.diagonal(hess)
    off = jnp.sum(jnp.abs(hess), axis=-1) - jnp.abs(diagonal)
    floor = jnp.sqrt(jnp.finfo(hess.dtype).eps) * jnp.maximum(1.0, jnp.max(jnp.abs(diagonal)))
    mu = jnp.maximum(jnp.max(off - diagonal), 0.0) + floor
    shifted = jnp.linalg.cholesky(hess + mu * jnp.eye(hess.shape[-1], dtype=hess.dtype))
    return jnp.where(positive, chol, shifted), positive


def trial_newton_minimize(fn: Callable, x0, tol: float, max_iter) -> TrialNewtonState:
    """Damped Newton from ``x0`` whose line search reuses the Newton evaluation.

    Each iteration evaluates value, gradient and Hessian at a trial point ``x + t step``:
    accepted on Armijo decrease (the next Newton step is then computed from it), else
    ``t`` is halved. The compiled program holds one copy of ``fn`` (``newton_minimize``
    holds two, the line search's and the Hessian's): about half the tracing and XLA
    compilation, at the price of a full evaluation per rejected trial, which warm starts
    rarely need. Steps solve with :func:`modified_cholesky` (a Cholesky factorisation
    costs about a quarter of the eigendecomposition ``newton_minimize`` uses; where the Hessian is
    not positive definite the shifted one gives a descent direction). ``max_iter`` counts
    evaluations. On return the state is ``fresh``: its gradient, Hessian and factor belong
    to ``x``; convergence (as in :func:`newton_minimize`) needs a positive definite Hessian.
    """
    inf = jnp.asarray(jnp.inf, x0.dtype)
    d = x0.shape[-1]
    false = jnp.asarray(False)
    square = jnp.zeros((d, d), x0.dtype)
    init = TrialNewtonState(
        x=x0, value=inf, grad=jnp.zeros_like(x0), hess=square, chol=square, positive=false, decrement=inf,
        num_iter=jnp.asarray(0), converged=false, stalled=false, fresh=jnp.asarray(True),
    )

    def cond(carry):
        s = carry[0]
        return (~s.converged) & (~s.stalled) & (s.num_iter < max_iter)

    def body(carry):
        s, step, t = carry
        trial = s.x + t * step
        value, grad, hess = value_grad_hessian(fn, trial)
        slope = jnp.dot(s.grad, step)
        accept = jnp.isfinite(value) & ((s.value == inf) | (value <= s.value + 1e-4 * t * slope))
        hess = 0.5 * (hess + hess.T)
        chol, positive = modified_cholesky(hess)
        g = jax.scipy.linalg.solve_triangular(chol, grad, lower=True)
        new_step = -jax.scipy.linalg.solve_triangular(chol.T, g, lower=False)
        decrement = jnp.sqrt(jnp.sum(g**2))
        at_tol = positive & ((decrement <= tol) | (0.5 * decrement**2 <= _rounding(value)))
        # a rejected trial on a step this small has hit the noise of fn: converged there
        at_noise_floor = (~accept) & s.positive & (0.5 * s.decrement**2 <= 1e4 * _rounding(s.value))
        accepted = s._replace(
            x=trial, value=value, grad=grad, hess=hess, chol=chol, positive=positive,
            decrement=decrement, converged=at_tol,
        )
        rejected = s._replace(converged=at_noise_floor, stalled=(~at_noise_floor) & (t < 2.0**-40))
        s = jax.tree.map(lambda a, r: jnp.where(accept, a, r), accepted, rejected)
        s = s._replace(num_iter=s.num_iter + 1)
        step = jnp.where(accept, new_step, step)
        t = jnp.where(accept, 1.0, 0.5 * t).astype(t.dtype)
        return s, step, t

    state, _, _ = lax.while_loop(cond, body, (init, jnp.zeros_like(x0), jnp.ones((), x0.dtype)))
    return state._replace(stalled=state.stalled & ~state.converged)


def lbfgs_minimize(fn: Callable, state: OptimState, gtol: float, max_iter: int) -> OptimState:
    """optax L-BFGS (zoom line search) until ``max|grad| <= gtol`` or ``max_iter`` in total.

    Used for dimensions where a dense Hessian per step is too costly; the result should
    be polished by a few Newton steps (which also certify convergence).
    """
    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(fn)

    def cond(carry):
        x, opt_state, k, gnorm = carry
        return (gnorm > gtol) & (k < max_iter)

    def body(carry):
        x, opt_state, k, _ = carry
        value, grad = value_and_grad(x, state=opt_state)
        updates, opt_state = opt.update(grad, opt_state, x, value=value, grad=grad, value_fn=fn)
        return optax.apply_updates(x, updates), opt_state, k + 1, jnp.max(jnp.abs(grad))

    init = (state.x, opt.init(state.x), state.num_iter, jnp.asarray(jnp.inf, state.x.dtype))
    x, _, num_iter, gnorm = lax.while_loop(cond, body, init)
    return state._replace(x=x, value=fn(x), grad_norm=gnorm, num_iter=num_iter, fresh=jnp.asarray(False))


def initial_state(x0) -> OptimState:
    d = x0.shape[-1]
    inf, false = jnp.asarray(jnp.inf, x0.dtype), jnp.asarray(False)
    square = jnp.zeros((d, d), x0.dtype)
    return OptimState(
        x=x0, value=inf, grad=jnp.zeros_like(x0), hess=square, eigenvalues=jnp.zeros_like(x0),
        eigenvectors=square, grad_norm=inf, decrement=inf, num_iter=jnp.asarray(0),
        converged=false, stalled=false, fresh=false,
    )


class Gaussian(NamedTuple):
    """The Laplace Gaussian ``N(mean, precision^-1)`` over the flat basis coordinates.

    Kept with the eigen-decomposition ``precision = Q diag(w) Q'`` that the Newton check
    at the mode already computed: ``cov = Q diag(1/w) Q'`` and draws are
    ``mean + Q diag(w^-1/2) eps``. A non-positive ``w`` makes ``cov`` NaN.
    """

    mean: jnp.ndarray
    precision: jnp.ndarray
    eigenvalues: jnp.ndarray
    eigenvectors: jnp.ndarray
    cov: jnp.ndarray

    def sample(self, rng_key, num_samples: int, stream: int = 0):
        eps = standard_normal(rng_key, (num_samples,) + self.mean.shape, self.mean.dtype, stream)
        return self.mean + (eps / jnp.sqrt(self.eigenvalues)) @ self.eigenvectors.T


def singular_floor(eigenvalues):
    """Eigenvalues of a symmetric matrix below this are numerically zero (see below)."""
    d = eigenvalues.shape[-1]
    return jnp.sqrt(d) * jnp.finfo(eigenvalues.dtype).eps * jnp.max(jnp.abs(eigenvalues))


def gaussian_from_eigh(mean, precision, eigenvalues, eigenvectors) -> Gaussian:
    """Gaussian from the mode and the eigen-decomposition of the precision.

    Eigenvalues below ``sqrt(D) * eps * max(eigenvalue)`` are numerically zero (rounding
    alone can make them slightly positive; the typical rounding error of an eigenvalue is
    ``eps * max``, ``sqrt(D)`` of them summed at random): they make ``cov`` NaN, like
    negative ones, rather than a covariance of 1e16 along a direction the data do not
    identify.
    """
    floor = singular_floor(eigenvalues)
    inv = jnp.where(eigenvalues > floor, 1.0 / eigenvalues, jnp.nan)
    cov = (eigenvectors * inv) @ eigenvectors.T
    return Gaussian(mean, precision, eigenvalues, eigenvectors, cov)
