r"""The mode and curvature of the hyperparameters' Laplace marginal :math:`\log\tilde p(\theta\mid y)`.

Newton ascent with central differences on a stencil of 0.2 posterior SDs (0.5 for large
models), the stencil and the line search's candidates each evaluated in one vectorised call of
the inner fits. The search stops :data:`MODE_TOL` posterior SDs from the mode (0.1 for large
models) and takes the last Newton step unverified: the design's first point is the inner fit there.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

__all__ = ["NonFiniteStart", "ModeSearch", "explore"]


class NonFiniteStart(ValueError):
    """The Laplace marginal of the hyperparameters is not finite where the search starts."""


class ModeSearch(NamedTuple):
    """The mode of the hyperparameters' Laplace marginal and how it was found."""

    theta: np.ndarray  # theta*, basis coordinates
    precision: np.ndarray  # negative Hessian of log p~ there (central differences)
    x: np.ndarray  # x*(theta*)
    log_density: float  # log p~(theta* | y) + const
    decrement: float  # last Newton step, posterior SDs
    grad_norm: float  # max |gradient| there
    num_iter: int
    num_evaluations: int  # inner Laplace fits


def _stencil(d: int) -> np.ndarray:
    """Central-difference offsets: 0, +-e_i, and +-(e_i + e_j) for i < j.

    ``1 + d^2`` points (7 in 2-D: one batch of inner fits).
    """
    points = [np.zeros(d)]
    for i in range(d):
        for s in (1.0, -1.0):
            e = np.zeros(d)
            e[i] = s
            points.append(e)
    for i in range(d):
        for j in range(i + 1, d):
            for s in (1.0, -1.0):
                e = np.zeros(d)
                e[i] = e[j] = s
                points.append(e)
    return np.array(points)


def _derivatives(values: np.ndarray, h: np.ndarray, d: int):
    """Gradient and Hessian of the stencil values (offsets ``h_i e_i``)."""
    f0 = values[0]
    grad, hess = np.zeros(d), np.zeros((d, d))
    for i in range(d):
        fp, fm = values[1 + 2 * i], values[2 + 2 * i]
        grad[i] = (fp - fm) / (2 * h[i])
        hess[i, i] = (fp - 2 * f0 + fm) / h[i] ** 2
    k = 1 + 2 * d
    for i in range(d):
        for j in range(i + 1, d):
            fpp, fmm = values[k : k + 2]
            # f(++) + f(--) - 2 f0 = h_i^2 H_ii + h_j^2 H_jj + 2 h_i h_j H_ij + O(h^4)
            diagonal = sum(values[1 + 2 * a] + values[2 + 2 * a] - 2 * f0 for a in (i, j))
            hess[i, j] = hess[j, i] = (fpp + fmm - 2 * f0 - diagonal) / (2 * h[i] * h[j])
            k += 2
    return grad, hess


TRUST_RADIUS = 2.0
"""Longest first step of the search, basis units (a factor e^2 of a scale in its log basis): a Newton
step from far away overshoots where the marginal is flat (from tau = 1 to 3e5 on the Poisson
random-effect benchmark, whose mode is at 100: seven iterations back instead of three forward).
Multiplied by 4 each time a whole clipped step is taken."""

MODE_TOL = 0.05
"""Newton decrement (posterior SDs) at which the search stops and takes its last step without
evaluating there. The design that follows weights each of its points by the marginal there, so
the centre need not be exact: a centre ``lambda`` SDs off lies ``lambda^2 / 2`` nats (1e-3 here)
below the mode, and Newton's quadratic convergence leaves the unverified step about
``c lambda^2`` SDs off (the Poisson random-effect benchmark: decrements 3.7, 0.042, 0.005 at
N = 100 000; 0.89, 0.048, 3e-5 at N = 5 000). A tolerance of 1e-3 cost two more iterations,
a fifth of the inner fits. Large models: :data:`COARSE_MODE_TOL`."""

COARSE_MODE_TOL = 0.1
""":data:`MODE_TOL` of large models, whose inner fits are structured and each costs seconds: a
centre 0.1 SD off is 0.005 nats below the mode, and at 0.05 the 10^5-group GLMM's search took a
fourth iteration (three inner fits, 2 s of its 9) for a decrement between 0.05 and 0.1. Small
models keep 0.05: their fits are cheap, and on a GP classification's hyperparameters the design
around a centre up to 0.1 SD off moved the amplitude's importance shift from 0.08 to 0.10 SD
(the verdict's limit is 0.09)."""

STALLED_ITERATIONS = 3
"""Iterations (not necessarily in a row) within twice :data:`MODE_TOL` after which the search
stops where it is. Round-off in the inner fits (float32, or a conditional mode found from another start) moves
the marginal's values by more than a step this short gains, so a line search may keep
"improving" on noise with the decrement stuck between the tolerance and twice it: NumPyro's
mortality example ended after 50 iterations at 0.088 SDs. Within 0.1 SDs the centre lies 0.005
nats below the mode, which the design's weights absorb (:data:`MODE_TOL`; 0.2 and 0.02 for large
models)."""

STENCIL_SDS = 0.2
"""The central differences' step, in the current posterior SDs: local, for the small models'
curvature (a GP classification's hyperparameters at 0.5: the design's draws' k-hat 0.48 -> 0.67
and an amplitude 0.10 SD off a long NUTS run, 0.086 at 0.2). Large models:
:data:`COARSE_STENCIL_SDS`."""

COARSE_STENCIL_SDS = 0.5
""":data:`STENCIL_SDS` of large models. Each off-centre inner fit ends within its tolerance below
its mode, below the centre's (the search's accepted point, fitted to the end): that deficit over
a step of ``h`` SDs inflates the curvature by about ``2 deficit / h^2``. At 0.2 SDs over 10^5
AR(1) steps one axis's curvature came out several times too large, and the search converged
linearly (its decrement halving over 11 iterations, 243 inner fits)."""
MIN_STENCIL = 1e-4
"""The smallest difference step (basis units) the search shrinks to where the marginal is not
finite beside the point; below it the differences are float32 round-off."""


def explore(marginal: Callable, theta0, x0, max_iter: int = 50, tol: float = MODE_TOL, one_at_a_time: bool = False,
            stencil_sds: float = STENCIL_SDS):
    """Mode and curvature of ``log p~(theta)``.

    ``marginal(thetas (K, d), x0s (K, Dx), with_shift=False) -> PointFits``.

    Newton ascent with central differences at ``stencil_sds`` current posterior SDs (0.05 basis units
    at the start), each step at most :data:`TRUST_RADIUS` long (growing where whole steps are
    taken), backtracking over 8 step lengths evaluated in one call (one at a time, longest
    first, where ``one_at_a_time``: large models fit one point per call). The point a line
    search accepts is the next stencil's centre, not fitted again. Stops at a decrement below
    ``tol`` (:data:`MODE_TOL`) with that last Newton step taken, or after
    :data:`STALLED_ITERATIONS` iterations below twice that (round-off in the inner fits).
    Returns a :class:`ModeSearch`.
    """
    theta = np.asarray(theta0, np.float64)
    d, x_ref, evaluations, radius = theta.size, np.asarray(x0), 0, TRUST_RADIUS
    offsets, h = _stencil(d), np.full(d, 0.05)

    def at(points):
        nonlocal evaluations
        evaluations += len(points)
        logp, xs = marginal(points, np.broadcast_to(x_ref, (len(points),) + x_ref.shape))[:2]
        return np.asarray(logp, np.float64), xs

    centre = None  # (log p~, x*) at theta, where the line search fitted it
    stalled = 0  # iterations with the decrement within 2 tol (STALLED_ITERATIONS)
    for it in range(1, max_iter + 1):
        if centre is None and one_at_a_time:  # the centre first (_fitted_centre)
            centre = _fitted_centre(at, theta)
            x_ref = centre[1] if np.isfinite(centre[0]) else x_ref
        if centre is None:
            logp, xs = at(theta + offsets * h)
        else:
            logp, xs = at(theta + offsets[1:] * h)
            logp, xs = np.concatenate([np.atleast_1d(centre[0]), logp]), np.concatenate([centre[1][None], xs])
        if not np.isfinite(logp[0]):
            raise NonFiniteStart(
                "the Laplace marginal of the hyperparameters is not finite at the start; pass "
                "init_params= with values inside the model's support"
            )
        if not np.all(np.isfinite(logp)):
            # an inner fit failed beside theta (its Newton search, in float32 on a flat
            # direction): the differences would be NaN, so the stencil shrinks instead
            _check_stencil(h, theta)
            h = np.maximum(h / 4, MIN_STENCIL)
            continue
        x_ref, centre = xs[0], (logp[0], xs[0])
        grad, neg, step, decrement, sd, positive = _newton_step(logp, h, d)

        def found(last_step=np.zeros(d)):  # the quadratic model's maximum: log p~ + g.step / 2 there
            return ModeSearch(theta + last_step, neg, x_ref, float(logp[0] + 0.5 * grad @ last_step), decrement,
                              float(np.max(np.abs(grad))), it, evaluations)

        stalled += int(decrement < 2 * tol and positive)
        if (decrement < tol and positive) or stalled >= STALLED_ITERATIONS:
            return found(step)
        h = np.clip(stencil_sds * sd, 1e-3, 0.5)
        length = float(np.linalg.norm(step))
        clipped = length > radius
        if clipped:  # far from the mode the local quadratic says little about where it is
            step = step * (radius / length)
        candidates, cand_logp, cand_x = _line_search(at, theta, step, logp[0], x_ref, one_at_a_time,
                                                     float(grad @ step))
        best = int(np.argmax(np.where(np.isfinite(cand_logp), cand_logp, -np.inf)))
        if cand_logp[best] > logp[0]:
            if clipped and np.allclose(candidates[best], theta + step):
                radius *= 4  # the whole clipped step improved: a mode farther away (a location)
            theta, x_ref, centre = candidates[best], cand_x[best], (cand_logp[best], cand_x[best])
        elif decrement < 2 * tol and positive:
            # no step improves on a marginal this flat (round-off in the inner fits): the mode
            # is within the stencil's resolution
            return found()
        else:
            h = h / 2
    raise ValueError(
        f"the mode of the hyperparameters' Laplace marginal was not found in {max_iter} iterations "
        f"(last Newton step {decrement:.2e} SDs); the marginal may be improper (check the priors)."
    )


def _newton_step(logp, h, d: int):
    """``(gradient, negative Hessian, saddle-free Newton step, its decrement in SDs, the
    posterior SDs, whether the negative Hessian is positive definite)`` from the stencil's values."""
    grad, hess = _derivatives(logp, h, d)
    neg = -hess
    eigval, eigvec = np.linalg.eigh(neg)
    positive = bool(np.all(eigval > 0))
    # saddle-free: curvature magnitudes, floored
    eigval = np.maximum(np.abs(eigval), 1e-6 * max(1.0, np.max(np.abs(eigval))))
    step = eigvec @ ((eigvec.T @ grad) / eigval)
    sd = np.sqrt(np.diag((eigvec / eigval) @ eigvec.T))
    return grad, neg, step, float(np.sqrt(grad @ step)), sd, positive


def _fitted_centre(at: Callable, theta):
    """``(log p~, x*)`` at ``theta`` alone: where points are fitted one per call, the first
    stencil's centre is fitted first and its neighbours start from its conditional mode (from the
    start's field, the origin, each of the first three fits took 20 Newton steps on the Poisson
    random-effect benchmark at N = 10^5; from the centre's mode, 3)."""
    logp, xs = at(theta[None])
    return logp[0], xs[0]


def _check_stencil(h, theta):
    """Refuse a marginal that is not finite even :data:`MIN_STENCIL` beside ``theta``."""
    if np.all(h <= MIN_STENCIL):
        raise ValueError(
            f"the Laplace marginal of the hyperparameters is not finite beside {np.round(theta, 4).tolist()} "
            f"(the latent field's conditional mode was not found {MIN_STENCIL:.0e} basis units away): it "
            "cannot be differentiated there. Fit jointly (strategy=\"laplace\"), enable float64 "
            "(jax.config.update(\"jax_enable_x64\", True)), or sample the hyperparameters with "
            "MCMC(LaplaceNUTS(model))."
        )


OVERSHOOT = 0.7
"""Where fits are made one at a time, a step that improves on the centre is kept whole when the
quadratic through the centre's value, its slope along the step and the step's value peaks
beyond this fraction of it; short of it the peak is fitted too and the better of the two kept.
On a CAR field over a 50 x 50 grid (mean, tau, alpha: alpha's logit skewed towards 1) whole
steps that improved overshot alpha by 2-3 SDs and the search zigzagged for ten iterations of
nine inner fits each."""


def _line_search(at: Callable, theta, step, logp, x_ref, one_at_a_time: bool, slope: float = np.inf):
    """``(candidates, their log densities, their conditional modes)`` along ``step`` at 8 lengths
    halving from 1 in one call; or, where large models fit one point per call, one length at a
    time from the whole step, each next length the peak of the quadratic through ``logp``, its
    ``slope`` along the step (the gradient's product with it) and the last length's value
    (clipped to a tenth to a half of it; Nocedal and Wright 2006, sec. 3.5), until one improves
    on ``logp``, the whole step's overshoot checked against :data:`OVERSHOOT`."""
    lengths = 0.5 ** np.arange(8)
    if not one_at_a_time:
        candidates = theta + lengths[:, None] * step
        return (candidates, *at(candidates))
    length, tried = 1.0, []
    for attempt in range(len(lengths)):
        candidates = theta[None] + length * step
        cand_logp, cand_x = at(candidates)
        tried.append((cand_logp[0], candidates, cand_logp, cand_x))
        peak = _quadratic_peak(logp, slope, length, cand_logp[0])
        if any(t[0] > logp for t in tried) and (attempt > 0 or not peak < OVERSHOOT):
            break
        if cand_logp[0] > logp:  # the whole step improves but overshoots: its peak too, the better kept
            length = max(peak, 0.1)
        else:
            length = length * float(np.clip(peak / length, 0.1, 0.5))
    best = max(tried, key=lambda t: t[0] if np.isfinite(t[0]) else -np.inf)
    return best[1:]


def _quadratic_peak(logp, slope, length, value) -> float:
    """Where the quadratic in the step's length ``t`` through ``(0, logp)`` with slope ``slope``
    there and through ``(length, value)`` peaks; ``inf`` where it has no maximum (or a value is
    not finite: then the caller halves)."""
    curvature = 2 * (value - logp - slope * length) / length**2
    if not (np.isfinite(curvature) and np.isfinite(slope)) or curvature >= 0:
        return np.inf if np.isfinite(value) else 0.5 * length
    return float(-slope / curvature)
