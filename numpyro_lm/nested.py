r"""Nested Laplace over hyperparameters (INLA, Rue, Martino and Chopin 2009) for any model.

A joint Laplace approximation fails on hierarchical models: the joint mode of a group
scale sits far from the bulk of its marginal posterior. Split the LM basis coordinates
into a few hyperparameters :math:`\theta` and the rest :math:`x`. For fixed
:math:`\theta` the conditional :math:`p(x \mid \theta, y)` is close to Gaussian, and

.. math:: \log \tilde p(\theta \mid y) = \log p(y, x^*(\theta), \theta)
          - \tfrac12 \log\det H(\theta) + \text{const},

with :math:`x^*(\theta)` the conditional mode (inner Newton, warm-started) and
:math:`H(\theta)` the negative Hessian in :math:`x` there, is the Laplace approximation of
the hyperparameters' marginal posterior. We find its mode :math:`\theta^*` and curvature
(Newton with central differences on a stencil of 0.2 posterior SDs, evaluated in one
vectorised call), standardise :math:`\theta = \theta^* + V\Lambda^{-1/2} z`, and integrate:

* **up to three coordinates, a lattice** in ``z`` (step 0.5 in 1-D, 0.75 in 2-D, 1 in
  3-D) explored outwards from the mode, as INLA's grid strategy does: the neighbours of a
  point are evaluated while the point's log density is within ``drop`` (8, 9, 10.5) of the
  mode's, so skewed marginals (a scale's log has a heavy tail towards zero) get the
  extent they need on each side, each inner fit warm-started from the conditional mode
  extrapolated from its neighbours. Inside the cell of each point :math:`\log\tilde p` is
  its local quadratic along each axis (central differences of the lattice values,
  :func:`cell_moments`): weights :math:`\propto \tilde p(\theta_k \mid y)\prod_a
  \int_{-h/2}^{h/2} e^{g_a u - c_a u^2/2}\,du`, exact for a Gaussian marginal.
  The *edge* is the set of points with a neighbour left out of the design; its share of
  the weight is small by construction (below 1e-3 for a Gaussian marginal) unless the
  lattice hit its extent (10 standardised units) or inner fits failed;
* **four to ten coordinates, a central composite design** (INLA's CCD): the centre,
  ``2d`` star points and the points of a two-level (full for four, half fraction beyond,
  resolution at least V) factorial, all at radius :math:`f_0\sqrt d`, :math:`f_0 = 1.1`,
  with volumes :math:`c_k/\phi(z_k)` that integrate a standard Gaussian's mass and
  second moments exactly (:math:`c = 1 - f_0^{-2}` at the centre, :math:`1/(K f_0^2)` at
  each of the ``K`` others): weights :math:`\propto c_k \tilde p(\theta_k\mid y)/\phi(z_k)`.

Draws. On a lattice: a cell by weight, :math:`z` inside it from the cell's density
(:func:`cell_draws`; a uniform :math:`z` would make the importance weights vary with the
marginal's slope across each cell: k-hat 0.72 on eight schools), and
:math:`x \mid z \sim N(m_k + S_k (z - z_k), H_k^{-1})`, the cell's conditional Gaussian
with its mean following :math:`z` along the slope :math:`S_k` of the conditional means
between the point's lattice neighbours. For a CCD, :math:`z` is drawn from a split normal
along each standardised axis (scales :math:`\sigma^\pm_i = r/\sqrt{2\,\text{drop}}`
from the star points' log density drop, INLA's skewness correction) and :math:`x` from
the conditional Gaussian of the nearest design point, its mean moved along the
least-squares slope of the conditional means over the design (exact for a
linear-Gaussian model). The conditional means :math:`m_k` are the modes moved by
:func:`mean_shift` (skewed conditionals, e.g. small Poisson counts). Coordinates of
sites matched one by one (Gamma, Beta...) are mapped from their conditional Gaussian
through that point's matched family with the Gaussian copula (no shift, no slope), so a
conjugate conditional (a Beta given the hyperparameters) is drawn exactly; coordinates
the conditional precision couples to nothing are drawn from the family directly. The
draws' density is exact, so PSIS applies.

The matched family of each site comes from the design's moments in the LM basis: the
first two moments of the mixture (conditional means and covariances weighted by the
design weights, plus the within-cell spread of :math:`z` and of the means that follow
it on a lattice), replaced by the draws' moments for sites drawn through per-point
matched families.
"""

from __future__ import annotations

import itertools
import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtr

from .families.base import basis_log_prob
from .laplace import trial_newton_minimize

__all__ = [
    "NonFiniteStart", "ModeSearch", "NestedDesign", "PointFits", "LATTICE", "CCD_F0", "MAX_CCD_DIM", "CELL_BOUND", "BATCH",
    "site_values", "x_positions", "conditional_fit", "point_params", "matched_normaliser", "mean_shift", "explore", "lattice",
    "cell_moments", "cell_draws", "ccd_points", "integrate", "mixture_moments", "quantile_sites", "draw",
]

# (step, log-density drop) of the lattice in standardised units, by dimension
LATTICE = {1: (0.5, 8.0), 2: (0.75, 9.0), 3: (1.0, 10.5)}
MAX_HALF = 10.0  # the lattice's extent, standardised units from the mode
CCD_F0 = 1.1
MAX_CCD_DIM = 10
BATCH = 8  # inner fits per compiled call (one program for the stencil, the line search and the design)
CELL_BOUND = 20.0  # |g| h and c h^2 of a lattice cell's log density (cell_moments is exact below)


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


class NestedDesign(NamedTuple):
    """The integration design over the hyperparameters and the conditionals at its points."""

    kind: str  # "lattice" or "ccd"
    theta_index: np.ndarray  # flat coordinates of the hyperparameters
    x_index: np.ndarray  # flat coordinates of the other latents
    mode: np.ndarray  # theta*, basis coordinates
    scale: np.ndarray  # V Lambda^-1/2: theta = mode + scale @ z
    step: float  # lattice step (0 for a CCD)
    sigma: np.ndarray  # (d, 2) split-normal scales (minus, plus) of a CCD's draws (ones on a lattice)
    z: np.ndarray  # (K, d) standardised design points
    theta: np.ndarray  # (K, d)
    log_weights: np.ndarray  # (K,) normalised
    x_mode: np.ndarray  # (K, Dx) conditional modes
    x_mean: np.ndarray  # (K, Dx) conditional means: the modes moved by mean_shift
    x_cov: np.ndarray  # (K, Dx, Dx) conditional covariances
    x_slope: np.ndarray  # (K, Dx, d) d x_mean / d z: x | theta ~ N(x_mean_k + slope_k (z - z_k), x_cov_k)
    cell_slope: np.ndarray  # (K, d) lattice: log p~ inside the cell is g.u - sum c u^2 / 2, u = z - z_k
    cell_curvature: np.ndarray  # (K, d) (zeros for a CCD)
    point_params: dict  # {site: matched family params (K, ...)} of the quantile sites' conditionals
    uncoupled: np.ndarray  # (Dx,) coordinates with no conditional precision to any other
    edge_mass: float  # weight of the design's edge (lattice)
    num_outer_iter: int
    num_evaluations: int  # inner Laplace fits, the mode search's included


class PointFits(NamedTuple):
    """The inner Laplace fits at K points (what the vectorised marginal returns)."""

    log_density: np.ndarray  # (K,) log p~(theta_k | y) + const
    x: np.ndarray  # (K, Dx) conditional modes
    cov: np.ndarray  # (K, Dx, Dx)
    precision_diagonal: np.ndarray  # (K, Dx) diagonal of the conditional precision H
    uncoupled: np.ndarray  # (K, Dx) coordinates H couples to no other
    params: dict  # {site: matched params (K, ...)} of the quantile sites, see point_params
    shift: np.ndarray  # (K, Dx) conditional mean - mode (mean_shift), zero where not computed


def site_values(layout, theta_index, theta, x) -> dict:
    """``{site: basis coordinates}`` with the hyperparameters' sites from ``theta`` and the
    others from ``x`` (each in layout order): ``theta`` stays outside differentiation in ``x``."""
    hyper = set(int(i) for i in theta_index)
    out, at = {}, {True: 0, False: 0}
    for site in layout.sites:
        is_hyper = site.offset in hyper
        source, start = (theta if is_hyper else x), at[is_hyper]
        out[site.name] = source[start : start + site.size].reshape(site.basis_shape)
        at[is_hyper] += site.size
    return out


def conditional_fit(neg_log_density: Callable, theta, x0, tol: float, max_iter: int):
    """Inner Laplace at ``theta``: :class:`PointFits` (``params`` and ``shift`` left empty).

    ``neg_log_density(theta, x)``. The Newton check that certifies convergence already
    evaluated the Hessian at ``x*`` (:func:`~numpyro_lm.laplace.trial_newton_minimize`:
    one copy of the model in the compiled program). Points whose inner fit did not
    converge get ``log p~ = -inf`` (no weight).
    """
    state = trial_newton_minimize(lambda x: neg_log_density(theta, x), x0, tol, max_iter)
    ok = state.positive & state.converged & state.fresh
    root = jnp.diagonal(state.chol)
    log_marginal = -state.value - jnp.sum(jnp.log(jnp.where(ok, root, 1.0)))
    log_marginal = jnp.where(ok & jnp.isfinite(log_marginal), log_marginal, -jnp.inf)
    eye = jnp.eye(x0.shape[-1], dtype=x0.dtype)
    cov = jax.scipy.linalg.cho_solve((state.chol, True), eye)
    cov = jnp.where(ok, 0.5 * (cov + cov.T), jnp.nan)
    off_diagonal = state.hess * (1 - jnp.eye(state.hess.shape[-1], dtype=state.hess.dtype))
    uncoupled = jnp.all(off_diagonal == 0, axis=-1)
    return PointFits(log_marginal, state.x, cov, jnp.diagonal(state.hess), uncoupled, {}, jnp.zeros_like(state.x))


def point_params(layout, theta_index, x, cov) -> dict:
    """Matched family params of each quantile site's conditional marginals (per point)."""
    positions = x_positions(layout, theta_index)
    var = jnp.diagonal(cov, axis1=-2, axis2=-1)
    out = {}
    for site, family in quantile_sites(layout, theta_index):
        cols = positions[site.name]
        lead = x.shape[:-1]
        out[site.name] = family.from_gaussian(
            x[..., cols].reshape(lead + site.basis_shape), var[..., cols].reshape(lead + site.basis_shape)
        )
    return out


def matched_normaliser(layout, theta_index, x, precision_diagonal, uncoupled, params):
    r"""Correction of :math:`\log \tilde p(\theta \mid y)` from the matched families (per point).

    For a coordinate :math:`x_j` the conditional precision couples to no other, the
    Laplace integral of its factor, :math:`p(x_j^*)\sqrt{2\pi/H_{jj}}`, is replaced by
    Laplace Matching's, :math:`p(x_j^*)/q_j(x_j^*)` with :math:`q_j` the matched family:
    exact when the conditional is that family (a Beta given its hyperparameters), and
    the same to leading order otherwise. Adds
    :math:`\sum_j \tfrac12\log H_{jj} - \tfrac12\log 2\pi - \log q_j(x_j^*)`.
    """
    positions = x_positions(layout, theta_index)
    total = jnp.zeros(x.shape[:-1], x.dtype)
    for site, family in quantile_sites(layout, theta_index):
        cols = positions[site.name]
        lead = x.shape[:-1]
        y = x[..., cols].reshape(lead + site.basis_shape)
        log_q = basis_log_prob(family, params[site.name], y).reshape(lead + (-1,))
        term = 0.5 * jnp.log(precision_diagonal[..., cols]) - 0.5 * jnp.log(2 * jnp.pi) - log_q
        total = total + jnp.sum(jnp.where(uncoupled[..., cols], term, 0.0), axis=-1)
    return total


def x_positions(layout, theta_index) -> dict:
    """``{site: its columns in x}`` for the sites outside the hyperparameters."""
    hyper = set(int(i) for i in theta_index)
    out, at = {}, 0
    for site in layout.sites:
        if site.offset not in hyper:
            out[site.name] = np.arange(at, at + site.size)
            at += site.size
    return out


def mean_shift(neg_log_density: Callable, theta, x, cov):
    r"""Move the conditional mode towards the conditional mean (skewed conditionals).

    The Gaussian :math:`q = N(m, \Sigma)` closest in KL to the conditional satisfies
    :math:`E_q[\nabla f] = 0` (Stein), :math:`f` the negative log density in ``x``. One
    Newton step from the mode with the Laplace covariance, the expectation by sigma points
    :math:`x^* \pm a_i`, :math:`a_i` the columns of any square root of :math:`\Sigma` (its
    Cholesky factor: the third-derivative term only sees :math:`\sum_i a_i a_i^T = \Sigma`),

    .. math:: \delta = -\Sigma\Big(\nabla f(x^*) + \tfrac12 \sum_i
              \big[\nabla f(x^* + a_i) + \nabla f(x^* - a_i) - 2\nabla f(x^*)\big]\Big)
              \approx -\tfrac12 \Sigma\, \nabla_x \log\det H(x^*),

    a mean correction in the spirit of the simplified Laplace approximation (Rue et al.
    2009, sec. 3.2.3), its third derivatives by differences of gradients. Capped at one conditional
    SD per coordinate; zero where a gradient is not finite. ``2 Dx + 1`` gradients.
    """
    # any square root of the covariance serves (sum_i a_i a_i' = cov): its Cholesky factor
    axes = jnp.linalg.cholesky(cov).T
    points = jnp.concatenate([x + axes, x - axes, x[None]])
    grads = jax.vmap(jax.grad(lambda y: neg_log_density(theta, y)))(points)
    n = x.shape[-1]
    g0 = grads[2 * n]
    expected = g0 + 0.5 * jnp.sum(grads[:n] + grads[n : 2 * n] - 2 * g0, axis=0)
    sd = jnp.sqrt(jnp.diagonal(cov))
    shift = jnp.clip(-cov @ expected, -sd, sd)
    return jnp.where(jnp.all(jnp.isfinite(shift)), shift, 0.0)


# ------------------------------------------------------------------ the mode


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


def explore(marginal: Callable, theta0, x0, max_iter: int = 50, tol: float = 1e-3):
    """Mode and curvature of ``log p~(theta)``.

    ``marginal(thetas (K, d), x0s (K, Dx), with_shift=False) -> PointFits``.

    Newton ascent with central differences at 0.2 current posterior SDs (0.05 basis units
    at the start), backtracking over 8 step lengths evaluated in one call.
    Returns a :class:`ModeSearch`.
    """
    theta = np.asarray(theta0, np.float64)
    d = theta.size
    offsets = _stencil(d)
    h = np.full(d, 0.05)
    x_ref = np.asarray(x0)
    evaluations = 0

    def at(points):
        nonlocal evaluations
        evaluations += len(points)
        logp, xs = marginal(points, np.broadcast_to(x_ref, (len(points),) + x_ref.shape))[:2]
        return np.asarray(logp, np.float64), xs

    for it in range(1, max_iter + 1):
        logp, xs = at(theta + offsets * h)
        if not np.isfinite(logp[0]):
            raise NonFiniteStart(
                "the Laplace marginal of the hyperparameters is not finite at the start; pass "
                "init_params= with values inside the model's support"
            )
        x_ref = xs[0]
        grad, hess = _derivatives(logp, h, d)
        neg = -hess
        eigval, eigvec = np.linalg.eigh(neg)
        # saddle-free: curvature magnitudes, floored
        eigval = np.maximum(np.abs(eigval), 1e-6 * max(1.0, np.max(np.abs(eigval))))
        step = eigvec @ ((eigvec.T @ grad) / eigval)
        decrement = float(np.sqrt(grad @ step))
        sd = np.sqrt(np.diag((eigvec / eigval) @ eigvec.T))
        def found():
            return ModeSearch(theta, neg, x_ref, float(logp[0]), decrement, float(np.max(np.abs(grad))), it, evaluations)

        if decrement < tol and np.all(np.linalg.eigvalsh(neg) > 0):
            return found()
        h = np.clip(0.2 * sd, 1e-3, 0.5)
        lengths = 0.5 ** np.arange(8)
        candidates = theta + lengths[:, None] * step
        cand_logp, cand_x = at(candidates)
        best = int(np.argmax(np.where(np.isfinite(cand_logp), cand_logp, -np.inf)))
        if cand_logp[best] > logp[0]:
            theta, x_ref = candidates[best], cand_x[best]
        elif decrement < 10 * tol and np.all(np.linalg.eigvalsh(neg) > 0):
            return found()
        else:
            h = h / 2
    raise ValueError(
        f"the mode of the hyperparameters' Laplace marginal was not found in {max_iter} iterations "
        f"(last Newton step {decrement:.2e} SDs); the marginal may be improper (check the priors)."
    )


# ------------------------------------------------------------------ designs


def _neighbours(point):
    d = len(point)
    return [point[:a] + (point[a] + s,) + point[a + 1 :] for a, s in itertools.product(range(d), (-1, 1))]


def lattice(marginal: Callable, mode, scale, x_mode):
    """Explore the lattice outwards from the mode (module docstring).

    Returns ``(step, z (K, d), PointFits of the K points, on-edge mask (K,))``.
    """
    d = mode.size
    step, drop = LATTICE[d]
    limit = int(round(MAX_HALF / step))
    points, waves, modes = [], [], {}
    wave, starts = [(0,) * d], [np.asarray(x_mode)]
    top = -np.inf
    while wave:
        z = np.array(wave, np.float64) * step
        fits = marginal(mode + z @ scale.T, np.stack(starts), True)
        points += wave
        waves.append(fits)
        logp = np.asarray(fits.log_density, np.float64)
        top = max(top, float(np.max(logp)))
        following = {}
        for i, point in enumerate(wave):
            modes[point] = fits.x[i]
        for i, point in enumerate(wave):
            if not logp[i] >= top - drop:  # below the cut (or not finite): not expanded
                continue
            for n in _neighbours(point):
                if max(abs(c) for c in n) <= limit and n not in modes and n not in following:
                    # warm start: x* extrapolated linearly from this point and the one behind it
                    behind = modes.get(tuple(2 * p - q for p, q in zip(point, n)))
                    x = fits.x[i]
                    following[n] = x if behind is None or not np.all(np.isfinite(behind)) else 2 * x - behind
        # fill the last batch of inner fits with the next ring out (free: padding otherwise)
        ring = list(following.items())
        room = -len(following) % BATCH
        while room and ring:
            ahead = {}
            for point, x in ring:
                for n in _neighbours(point):
                    if (len(ahead) < room and max(abs(c) for c in n) <= limit and n not in modes
                            and n not in following and n not in ahead):
                        ahead[n] = x
            following.update(ahead)
            ring, room = list(ahead.items()), room - len(ahead)
        wave, starts = list(following), list(following.values())
    fits = jax.tree.map(lambda *a: np.concatenate(a), *waves)
    finite = {p: i for i, (p, lp) in enumerate(zip(points, fits.log_density)) if np.isfinite(lp)}
    edge = np.array([any(n not in finite for n in _neighbours(p)) for p in points])
    slopes = _lattice_slopes(points, finite, fits.x + fits.shift, step)
    shape = _cell_shapes(points, finite, np.asarray(fits.log_density, np.float64), step)
    return step, np.array(points, np.float64) * step, fits, edge, slopes, shape


def _along(finite, point, axis, k):
    """Index of the finite lattice point ``k`` steps from ``point`` along ``axis`` (or None)."""
    return finite.get(point[:axis] + (point[axis] + k,) + point[axis + 1 :])


def _lattice_slopes(points, finite, x, step):
    """``(K, Dx, d)`` derivatives of the conditional means in ``z``: central differences
    between a point's lattice neighbours, one-sided where one is missing, zero if both are."""
    d = len(points[0])
    slopes = np.zeros(x.shape + (d,))
    for i, p in enumerate(points):
        for a in range(d):
            up, down = _along(finite, p, a, 1), _along(finite, p, a, -1)
            if up is not None and down is not None:
                slopes[i, :, a] = (x[up] - x[down]) / (2 * step)
            elif up is not None:
                slopes[i, :, a] = (x[up] - x[i]) / step
            elif down is not None:
                slopes[i, :, a] = (x[i] - x[down]) / step
    return slopes


def _cell_shapes(points, finite, logp, step):
    """``(g, c)``, each ``(K, d)``: gradient and curvature of ``log p~`` in ``z`` at each point.

    Along each axis, the quadratic through the point and its two neighbours, or where one
    is missing (the design's edge) through the point and the next two on the other side,
    or the line through two points: exact for a Gaussian marginal. The curvature is
    floored at zero (a convex stretch is drawn from its tangent) and both are bounded
    (``|g| h <= 20``, ``c h^2 <= 20``) so that :func:`cell_moments` stays exact; the same
    values define the draws' density.
    """
    d = len(points[0])
    g, c = np.zeros((len(points), d)), np.zeros((len(points), d))
    for i, p in enumerate(points):
        for a in range(d):
            up, down = _along(finite, p, a, 1), _along(finite, p, a, -1)
            if up is not None and down is not None:
                g[i, a] = (logp[up] - logp[down]) / (2 * step)
                c[i, a] = -(logp[up] - 2 * logp[i] + logp[down]) / step**2
                continue
            side = 1 if up is not None else -1
            near, far = _along(finite, p, a, side), _along(finite, p, a, 2 * side)
            if near is None:
                continue
            if far is not None:
                c[i, a] = -(logp[far] - 2 * logp[near] + logp[i]) / step**2
            # f(s h) = f(0) + g s h - c h^2 / 2
            g[i, a] = side * ((logp[near] - logp[i]) / step + 0.5 * c[i, a] * step)
    bound = CELL_BOUND / step
    return np.clip(g, -bound, bound), np.clip(c, 0.0, bound / step)


_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(24)


def cell_moments(g, c, step):
    r"""Log mass, mean and variance of ``u`` on ``[-h/2, h/2]`` under :math:`e^{g u - c u^2/2}`.

    Each ``(..., d)``; by 24-point Gauss-Legendre quadrature, exact to rounding for
    ``|g| h, c h^2 <= 20`` (the integrand is entire; the error term is of order
    :math:`(|g|h/2)^{48}/48!`). ``g = c = 0`` gives ``log h``, ``0``, ``h^2/12``.
    """
    u = 0.5 * step * _GL_NODES
    log_f = g[..., None] * u - 0.5 * c[..., None] * u**2 + np.log(0.5 * step * _GL_WEIGHTS)
    top = np.max(log_f, axis=-1, keepdims=True)
    f = np.exp(log_f - top)
    mass = np.sum(f, axis=-1)
    mean = np.sum(f * u, axis=-1) / mass
    var = np.maximum(np.sum(f * u**2, axis=-1) / mass - mean**2, 0.0)
    return np.log(mass) + top[..., 0], mean, var


def cell_draws(rng: np.random.Generator, g, c, step):
    r"""``u`` on ``[-h/2, h/2]`` with density :math:`\propto e^{g u - c u^2/2}` (``c >= 0``), elementwise.

    Inverse CDF of the tangent :math:`e^{g u}`, then rejection with probability
    :math:`1 - e^{-c u^2/2}` (acceptance at least :math:`e^{-c h^2/8}`).
    """
    g, c = np.asarray(g, np.float64), np.asarray(c, np.float64)
    u = np.empty(g.shape)
    todo = np.ones(g.shape, bool)
    while np.any(todo):
        gt, ct = g[todo], c[todo]
        v = rng.uniform(size=gt.shape)
        a = 0.5 * gt * step
        with np.errstate(divide="ignore", invalid="ignore"):
            tilted = np.logaddexp(np.log1p(-v) - a, np.log(v) + a) / gt
        new = np.where(np.abs(a) < 1e-8, (v - 0.5) * step, tilted)
        new = np.clip(new, -0.5 * step, 0.5 * step)
        accept = rng.uniform(size=gt.shape) <= np.exp(-0.5 * ct * new**2)
        idx = np.flatnonzero(todo)
        u.flat[idx[accept]] = new[accept]
        todo.flat[idx[accept]] = False
    return u


def _least_squares_slope(z, x):
    """``(Dx, d)``: the slope of the conditional means' least-squares plane over the design."""
    design = np.concatenate([np.ones((len(z), 1)), z], axis=1)
    coef = np.linalg.lstsq(design, x, rcond=None)[0]
    return coef[1:].T


def _factorial(d: int) -> np.ndarray:
    """Two-level design: full for ``d <= 4``, else the half fraction ``x_d = x_1 ... x_{d-1}``
    (resolution ``d``, so main effects and two-factor interactions stay unconfounded)."""
    if d <= 4:
        return np.array(list(itertools.product((-1.0, 1.0), repeat=d)))
    base = np.array(list(itertools.product((-1.0, 1.0), repeat=d - 1)))
    return np.concatenate([base, np.prod(base, axis=1, keepdims=True)], axis=1)


def ccd_points(d: int):
    """``(z (K, d), log volume (K,))`` of the central composite design (module docstring)."""
    if d > MAX_CCD_DIM:
        raise ValueError(
            f"nested Laplace integrates over at most {MAX_CCD_DIM} hyperparameter coordinates "
            f"(a central composite design); {d} were given. Choose fewer hyper= sites."
        )
    r = CCD_F0 * math.sqrt(d)
    star = np.concatenate([np.eye(d), -np.eye(d)]) * r
    outer = np.concatenate([star, CCD_F0 * _factorial(d)])
    z = np.concatenate([np.zeros((1, d)), outer])
    # volumes c_k / phi(z_k): integrate N(0, I)'s mass and second moments exactly, with
    # c = 1 - 1/f0^2 at the centre and 1/(K f0^2) at each of the K others
    log_volume = np.full(len(z), 0.5 * r**2 - math.log(len(outer)) - 2 * math.log(CCD_F0))
    log_volume[0] = math.log(1.0 - CCD_F0**-2)
    return z, log_volume


def _split_normal_scales(z, logp):
    """``(d, 2)`` scales ``r / sqrt(2 drop)`` from the star points (minus, plus side)."""
    d = z.shape[1]
    r = CCD_F0 * math.sqrt(d)
    sigma = np.ones((d, 2))
    for i in range(d):
        for side, row in ((0, 1 + d + i), (1, 1 + i)):
            fall = logp[0] - logp[row]
            if not fall > 0:
                raise ValueError(
                    "the hyperparameters' Laplace marginal does not fall off from its mode along "
                    f"standardised axis {i} (log density drop {fall:.3g} at {r:.2f} SDs); the marginal "
                    "may be multimodal or improper. Choose fewer hyper= sites or better priors."
                )
            # a support edge (drop = inf) still leaves a tenth of the Gaussian's spread
            sigma[i, side] = float(np.clip(r / np.sqrt(2 * fall), 0.1, 10.0))
    return sigma


def integrate(marginal: Callable, search: ModeSearch, theta_index, x_index, slope_cols):
    """The :class:`NestedDesign` around the mode of the hyperparameters' marginal.

    ``slope_cols (Dx,)``: the coordinates whose conditional mean follows ``theta`` linearly
    between design points (those drawn from their conditional Gaussians).
    """
    mode, x_mode = search.theta, search.x
    d = mode.size
    eigval, eigvec = np.linalg.eigh(search.precision)
    scale = eigvec / np.sqrt(eigval)
    sigma = np.ones((d, 2))
    if d in LATTICE:
        kind = "lattice"
        step, z, fits, edge, slopes, (g, c) = lattice(marginal, mode, scale, x_mode)
        # the cell's mass: log p~ at the point times the integral of its local quadratic
        log_w = np.asarray(fits.log_density, np.float64) + np.sum(cell_moments(g, c, step)[0] - np.log(step), 1)
    else:
        kind, step = "ccd", 0.0
        z, log_volume = ccd_points(d)
        fits = marginal(mode + z @ scale.T, np.broadcast_to(np.asarray(x_mode), (len(z),) + np.shape(x_mode)), True)
        logp = np.asarray(fits.log_density, np.float64)
        sigma = _split_normal_scales(z, logp)
        log_w = logp + log_volume
        edge = np.zeros(len(z), bool)
        finite = np.isfinite(logp)
        slope = _least_squares_slope(z[finite], np.asarray(fits.x + fits.shift, np.float64)[finite])
        slopes = np.broadcast_to(slope, (len(z),) + slope.shape)
        g = c = np.zeros_like(z)
    ok = np.isfinite(log_w) & np.all(np.isfinite(fits.cov), axis=(1, 2))
    log_w = np.where(ok, log_w, -np.inf)
    log_w = log_w - (np.max(log_w) + np.log(np.sum(np.exp(log_w - np.max(log_w)))))
    w = np.exp(log_w)
    keep = log_w > np.log(1e-12)  # points that carry no mass
    kept = jax.tree.map(lambda a: np.asarray(a)[keep], fits)
    return NestedDesign(
        kind=kind, theta_index=theta_index, x_index=x_index, mode=mode, scale=scale, step=step, sigma=sigma,
        z=z[keep], theta=mode + z[keep] @ scale.T, log_weights=log_w[keep] - np.log(np.sum(w[keep])),
        x_mode=np.asarray(kept.x, np.float64), x_mean=np.asarray(kept.x + kept.shift, np.float64), x_cov=np.asarray(kept.cov, np.float64),
        x_slope=np.asarray(slopes)[keep] * slope_cols[:, None], cell_slope=g[keep], cell_curvature=c[keep],
        point_params=kept.params, uncoupled=np.all(kept.uncoupled, axis=0), edge_mass=float(np.sum(w[edge])),
        num_outer_iter=search.num_iter, num_evaluations=search.num_evaluations + len(z),
    )


def mixture_moments(design: NestedDesign, size: int):
    """Mean and covariance over all flat coordinates of the design's mixture."""
    w = np.exp(design.log_weights)
    ti, xi = design.theta_index, design.x_index
    slope, scale = design.x_slope, design.scale
    # on a lattice z - z_k has the cell's density (mean m_k, variances v_k per axis) and
    # x's mean follows it along the point's slope; a CCD's points carry no spread
    if design.kind == "lattice":
        _, m, v = cell_moments(design.cell_slope, design.cell_curvature, design.step)
    else:
        m = v = np.zeros_like(design.z)
    theta = design.theta + m @ scale.T
    x_mean = design.x_mean + np.einsum("kia,ka->ki", slope, m)
    mean = np.zeros(size)
    mean[ti] = w @ theta
    mean[xi] = w @ x_mean
    dt = theta - mean[ti]
    dx = x_mean - mean[xi]
    cov = np.zeros((size, size))
    cov[np.ix_(ti, ti)] = (dt * w[:, None]).T @ dt + np.einsum("ia,k,ka,ja->ij", scale, w, v, scale)
    cov[np.ix_(xi, xi)] = (np.einsum("k,kij->ij", w, design.x_cov) + (dx * w[:, None]).T @ dx
                           + np.einsum("kia,k,ka,kja->ij", slope, w, v, slope))
    cross = (dt * w[:, None]).T @ dx + np.einsum("ia,k,ka,kja->ij", scale, w, v, slope)
    cov[np.ix_(ti, xi)] = cross
    cov[np.ix_(xi, ti)] = cross.T
    return mean, 0.5 * (cov + cov.T)


# ------------------------------------------------------------------ draws


def quantile_sites(layout, hyper_index):
    """Sites outside the hyperparameters matched coordinate by coordinate (Gamma, Beta...)."""
    from .families import get_family
    from .marginals import is_elementwise

    hyper = set(int(i) for i in hyper_index)
    out = []
    for site in layout.sites:
        family = get_family(site.family, site.basis)
        if site.offset not in hyper and family.copula == "quantile" and is_elementwise(site, family):
            out.append((site, family))
    return out


# per-family programs, compiled once per family and shapes (the family is static)
@partial(jax.jit, static_argnums=0)
def _quantile(family, params, s):
    return family.basis_quantile(params, ndtr(s))


@partial(jax.jit, static_argnums=0)
def _log_prob(family, params, y):
    return basis_log_prob(family, params, y)


def _split_normal(rng, sigma, n):
    """``(z (n, d), log density (n,))`` of independent split normals (scales ``sigma (d, 2)``)."""
    e = rng.standard_normal((n, sigma.shape[0]))
    s = np.where(e < 0, sigma[:, 0], sigma[:, 1])
    z = e * s
    log_density = np.sum(np.log(2.0 / (sigma[:, 0] + sigma[:, 1])) - 0.5 * math.log(2 * math.pi) - 0.5 * e**2, 1)
    return z, log_density


def _by_point(k, eps, chol):
    """``chol[k_n] @ eps_n`` for every draw, grouped by design point (no (n, Dx, Dx) gather)."""
    out = np.empty_like(eps)
    order = np.argsort(k, kind="stable")
    bounds = np.searchsorted(k[order], np.arange(len(chol) + 1))
    for j in np.flatnonzero(np.diff(bounds)):
        rows = order[bounds[j] : bounds[j + 1]]
        out[rows] = eps[rows] @ chol[j].T
    return out


def draw(rng: np.random.Generator, design: NestedDesign, layout, num_samples: int):
    """``(flat draws (n, D), log_q)`` from the design's mixture (module docstring).

    ``log_q()`` computes the draws' log density (``(n,)``) when it is needed (the PSIS
    diagnostics): drawing alone compiles and runs no family density.
    """
    size, d = layout.size, design.theta.shape[1]
    if design.kind == "lattice":
        w = np.exp(design.log_weights)
        k = rng.choice(w.size, size=num_samples, p=w / w.sum())
        g, c = design.cell_slope[k], design.cell_curvature[k]
        u = cell_draws(rng, g, c, design.step)  # z - z_k
        theta = design.theta[k] + u @ design.scale.T
        log_mass = cell_moments(design.cell_slope, design.cell_curvature, design.step)[0]
        log_cell = np.sum(g * u - 0.5 * c * u**2 - log_mass[k], 1)
        log_q = design.log_weights[k] + log_cell - np.linalg.slogdet(design.scale)[1]
    else:
        z, log_q = _split_normal(rng, design.sigma, num_samples)
        theta = design.mode + z @ design.scale.T
        log_q = log_q - np.linalg.slogdet(design.scale)[1]
        # the conditional of the nearest design point
        k = np.argmin(np.sum((z[:, None, :] - design.z[None]) ** 2, -1), axis=1)
        u = z - design.z[k]
    chol = np.linalg.cholesky(design.x_cov)
    eps = rng.standard_normal((num_samples, design.x_mode.shape[1]))
    x_mean = design.x_mean[k] + np.einsum("nia,na->ni", design.x_slope[k], u)
    x = x_mean + _by_point(k, eps, chol)
    flat = np.zeros((num_samples, size))
    flat[:, design.theta_index] = theta
    flat[:, design.x_index] = x
    log_det = np.sum(np.log(np.diagonal(chol, axis1=1, axis2=2)), axis=1)
    log_q = log_q - 0.5 * np.sum(eps**2, 1) - log_det[k] - 0.5 * x.shape[1] * math.log(2 * math.pi)
    positions = x_positions(layout, design.theta_index)
    var = np.diagonal(design.x_cov, axis1=1, axis2=2)
    dtype = jnp.result_type(float)
    mapped = []
    for site, family in quantile_sites(layout, design.theta_index):
        cols = positions[site.name]
        shape = (num_samples,) + site.basis_shape
        params = {n: np.asarray(v, np.float64)[k] for n, v in design.point_params[site.name].items()}
        sd = np.sqrt(var[:, cols][k]).reshape(shape)
        s = (x[:, cols].reshape(shape) - x_mean[:, cols].reshape(shape)) / sd
        # coordinates coupled to no other (the independence copula) are drawn from the family
        # itself where it has a host sampler; the others through its quantile function
        alone = design.uncoupled[cols].reshape(site.basis_shape) & (family.host_sample is not None)
        if np.all(alone):
            y = family.host_sample(rng, params)
        else:
            y = np.asarray(_quantile(family, params, jnp.asarray(s, dtype)), np.float64)
            if np.any(alone):
                y = np.where(alone, family.host_sample(rng, params), y)
        flat[:, site.offset : site.offset + site.size] = y.reshape(num_samples, -1)
        mapped.append((family, params, y, sd, s))

    def log_density():
        # the copula density: each mapped coordinate's Gaussian marginal replaced by the
        # family's (for uncoupled coordinates both terms are exact whatever s is)
        out = log_q
        for family, params, y, sd, s in mapped:
            term = np.log(sd) + np.asarray(_log_prob(family, params, jnp.asarray(y, dtype)), np.float64)
            term = term + 0.5 * s**2 + 0.5 * math.log(2 * math.pi)
            out = out + term.reshape(num_samples, -1).sum(1)
        return out

    return flat, log_density
