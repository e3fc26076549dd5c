r"""The Laplace approximation of a log density: a pure, jit- and vmap-able fit.

.. math:: p(y) \approx N(y^*, H^{-1}), \qquad y^* = \arg\max \log p, \quad
          H = -\nabla^2 \log p(y^*).

:func:`laplace` finds the mode with :func:`numpyro_lm.mode.newton.newton` (an L-BFGS warm
start first with ``method="lbfgs"``) and returns a :class:`LaplaceState`: the mode, the
curvature :math:`H` as a :class:`~numpyro_lm.curvature.Curvature`, the log density there
and a :class:`LaplaceInfo`. It never raises on device values: non-convergence, a log
density that is not finite and a curvature that is not positive definite are flags in the
info, for the caller to act on (``LaplaceMatching`` turns them into errors that name the
sites). It works on any flat log density: ``jax.vmap`` it over data sets, ``jax.jit`` it
inside a larger program.

The same fit in three steps, for callers that report progress between compiled calls
(blackjax's ``init``/``step`` pattern): :func:`laplace_init`, :func:`laplace_update` (call
again with a larger ``max_iter`` to continue) and :func:`laplace_finish`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax.numpy as jnp

from ..curvature import Curvature, DenseCurvature, Gaussian
from .hessian import DenseHessian
from .lbfgs import lbfgs
from .newton import NewtonState, default_tol, newton, newton_init

__all__ = ["LaplaceInfo", "LaplaceState", "laplace", "laplace_init", "laplace_update", "laplace_finish"]


class LaplaceInfo(NamedTuple):
    """How the mode search went (device arrays, one entry per fit)."""

    num_iter: jnp.ndarray  # Newton evaluations
    converged: jnp.ndarray  # the convergence rule of numpyro_lm.mode.newton held at the mode
    stalled: jnp.ndarray  # the line search could not decrease the objective further
    decrement: jnp.ndarray  # last Newton step, posterior SDs
    grad_norm: jnp.ndarray  # max |gradient| at the mode
    finite: jnp.ndarray  # the log density is finite at the mode
    positive: jnp.ndarray  # the curvature is numerically positive definite
    structure_error: jnp.ndarray = 0.0  # the Hessian strategy's check at the mode (numpyro_lm.mode.hessian)


class LaplaceState(NamedTuple):
    """A Laplace approximation: ``N(mode, curvature^-1)``.

    After a refinement (:mod:`numpyro_lm.posterior.refine`) ``mode`` holds the refined mean and
    ``curvature`` the refined precision; ``log_density`` and ``info`` stay those of the mode.
    """

    mode: jnp.ndarray
    curvature: Curvature
    log_density: jnp.ndarray
    info: LaplaceInfo

    @property
    def gaussian(self) -> Gaussian:
        return Gaussian(self.mode, self.curvature)


def _resolve_tol(tol, x):
    return default_tol(x.dtype) if tol is None else tol


def laplace_init(log_density: Callable, x0, *, method: str = "newton", tol: Optional[float] = None,
                 max_iter: int = 200, hessian=DenseHessian()) -> NewtonState:
    """The Newton state at ``x0``, or where L-BFGS from ``x0`` stops (``method="lbfgs"``:
    to a gradient of ``sqrt(tol)``, at most ``max_iter`` iterations)."""
    if method == "lbfgs":
        x0, _, _ = lbfgs(lambda x: -log_density(x), x0, gtol=jnp.sqrt(_resolve_tol(tol, x0)), max_iter=max_iter)
    elif method != "newton":
        raise ValueError(f"method must be 'newton' or 'lbfgs', not {method!r}")
    return newton_init(x0, hessian)


def laplace_update(log_density: Callable, state: NewtonState, *, tol: Optional[float] = None,
                   max_iter: int = 200, hessian=DenseHessian()) -> NewtonState:
    """Newton from ``state`` until converged, stalled or ``max_iter`` evaluations in all."""
    return newton(lambda x: -log_density(x), state, _resolve_tol(tol, state.x), max_iter, hessian)


def laplace_finish(state: NewtonState, *, regularize: Optional[float] = None,
                   curvature=DenseCurvature, hessian=None) -> LaplaceState:
    """The :class:`LaplaceState` at the Newton state's point.

    :param regularize: a ridge ``r`` added to the negative Hessian, ``H + r I``.
    :param curvature: the curvature class of a dense Hessian, built by ``curvature.from_precision(H)``.
    :param hessian: the search's Hessian strategy (:mod:`numpyro_lm.mode.hessian`), which then
        builds the curvature (``curvature`` is ignored).
    """
    if hessian is not None:
        curv = hessian.curvature(state.hess, regularize)
    else:
        precision = state.hess
        if regularize is not None:
            precision = precision + regularize * jnp.eye(precision.shape[-1], dtype=precision.dtype)
        curv = curvature.from_precision(precision)
    info = LaplaceInfo(
        num_iter=state.num_iter, converged=state.converged, stalled=state.stalled, decrement=state.decrement,
        grad_norm=state.grad_norm, finite=jnp.isfinite(state.value), positive=curv.positive(),
        structure_error=state.structure_error,
    )
    return LaplaceState(state.x, curv, -state.value, info)


def laplace(log_density: Callable, x0, *, method: str = "newton", tol: Optional[float] = None,
            max_iter: int = 200, regularize: Optional[float] = None, curvature=DenseCurvature) -> LaplaceState:
    """The Laplace approximation of ``log_density`` (a function of a flat vector) from ``x0``.

    :param str method: ``"newton"``, or ``"lbfgs"`` (an L-BFGS warm start, then Newton).
    :param float tol: Newton-decrement tolerance in posterior SDs (default 1e-9 in float64,
        1e-3 in float32: :func:`~numpyro_lm.mode.newton.default_tol`).
    :param int max_iter: Newton evaluations (and L-BFGS iterations of the warm start).
    :param float regularize: opt-in ridge on the negative Hessian (changes the posterior).
    :param curvature: the curvature class (default :class:`~numpyro_lm.curvature.DenseCurvature`).

    Example::

        state = jax.vmap(lambda y: laplace(lambda x: log_p(x, y), x0))(datasets)
        state.info.converged  # one flag per data set
    """
    state = laplace_init(log_density, x0, method=method, tol=tol, max_iter=max_iter)
    state = laplace_update(log_density, state, tol=tol, max_iter=max_iter)
    return laplace_finish(state, regularize=regularize, curvature=curvature)
