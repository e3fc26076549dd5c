"""The integration design over the hyperparameters: a lattice (up to three coordinates) or a
central composite design (four to ten; three for a long field whose marginal is Gaussian
enough: :data:`CCD_FIRST_MIN`, :data:`CCD_RESIDUAL_MAX`), with the weights and conditionals at its points.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, NamedTuple

import jax
import numpy as np

from ...core.structure import MAX_CCD_DIM
from .lattice_design import BATCH, LATTICE, cell_moments, lattice, lattice_slopes
from .search import ModeSearch

__all__ = ["CCD_F0", "NestedDesign", "ccd_points", "CCD_RESIDUAL_MAX", "CCD_FIRST_MIN", "CHOL_SLOPE_MAX",
           "conditional_cholesky", "integrate"]

CCD_F0 = 1.1


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
    x_cov: np.ndarray  # (K, Dx, Dx) conditional covariances (None where they are structured)
    x_slope: np.ndarray  # (K, Dx, d) d x_mean / d z: x | theta ~ N(x_mean_k + slope_k (z - z_k), x_cov_k)
    cell_slope: np.ndarray  # (K, d) lattice: log p~ inside the cell is g.u - sum c u^2 / 2, u = z - z_k
    cell_curvature: np.ndarray  # (K, d) (zeros for a CCD)
    point_params: dict  # {site: matched family params (K, ...)} of the quantile sites' conditionals
    uncoupled: np.ndarray  # (Dx,) coordinates with no conditional precision to any other
    edge_mass: float  # weight of the design's edge (lattice)
    num_outer_iter: int
    num_evaluations: int  # inner Laplace fits, the mode search's included
    x_var: np.ndarray = None  # (K, Dx) conditional variances
    x_curvature: object = None  # the K conditional precisions where structured (host arrays), else None
    x_chol: np.ndarray = None  # (K, Dx, Dx) Cholesky factors of x_cov (None where they are structured)
    x_chol_slope: np.ndarray = None  # (K, Dx, Dx, d) d x_chol / d z across a lattice cell, or None:
    # x | theta ~ N(x_mean_k + slope_k u, L(u) L(u)'), L(u) = x_chol_k + x_chol_slope_k u


CHOL_SLOPE_MAX = 2**24
"""Most numbers in a lattice's Cholesky slopes (``K Dx^2 d``) for its conditional covariances to follow
the hyperparameters across a cell (:func:`_cholesky_slopes`); above, each cell keeps its point's."""


def conditional_cholesky(cov):
    """Cholesky factors of the design points' conditional covariances ``(K, n, n)``. A point
    deep in a funnel (a hierarchical scale near zero) has a covariance whose smallest
    eigenvalues, computed in float32, are rounding: one slightly negative makes the
    factorisation fail. Those points' eigenvalues are floored at float32's resolution of
    their largest (the precision they were computed to); the others are factored as they are."""
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        out = np.empty_like(cov)
        floor = np.finfo(np.float32).eps
        for i, c in enumerate(cov):
            try:
                out[i] = np.linalg.cholesky(c)
            except np.linalg.LinAlgError:
                w, q = np.linalg.eigh(0.5 * (c + c.T))
                w = np.maximum(w, floor * np.max(np.abs(w)))
                out[i] = np.linalg.cholesky((q * w) @ q.T)
        return out


def _cholesky_slopes(z, step, chol, usable, slope_cols):
    r"""``(K, Dx, Dx, d)``: how each lattice point's conditional Cholesky factor changes across its
    cell, :math:`L(u) = L_k + \sum_a S_{ka} u_a` (:func:`~.lattice_design.lattice_slopes` of the
    factors), so that the draws' covariance follows the hyperparameters as their mean does.

    With the point's factor alone, a non-centred hierarchy's conditional covariance (its scale
    moving with the hyperparameters) was off by a cell's worth: over NumPyro's UCB admissions
    GLMM (three hyperparameter coordinates, step 1) the weights' k-hat was 0.59-0.85 over four keys
    for an answer within 0.1 SD of NUTS's, 0.19-0.37 with the slopes.

    Rows of coordinates drawn through matched families (not ``slope_cols``) stay their point's. Each
    point's slopes are shrunk so that no diagonal entry falls below half its point's anywhere in the
    cell (the factor stays a Cholesky factor; the difference of two neighbours can exceed it)."""
    slopes = lattice_slopes(z, step, chol, usable) * slope_cols[None, :, None, None]
    diag = np.diagonal(chol, axis1=1, axis2=2)  # (K, Dx)
    reach = 0.5 * step * np.sum(np.abs(np.diagonal(slopes, axis1=1, axis2=2)), axis=1)  # (K, d, Dx) -> (K, Dx)
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.where(reach > 0, 0.5 * diag / reach, np.inf)
    return slopes * np.minimum(1.0, np.min(room, axis=1, initial=np.inf))[:, None, None, None]


def _conditional_factors(kind, z, step, fits, log_density, slope_cols):
    """``(x_chol, x_chol_slope)`` of the design's dense conditionals (``(None, None)`` where they
    are structured; no slopes on a central composite design or above :data:`CHOL_SLOPE_MAX`)."""
    if fits.cov is None:
        return None, None
    cov = np.asarray(fits.cov, np.float64)
    usable = np.isfinite(log_density) & np.all(np.isfinite(cov), axis=(1, 2))
    chol = np.zeros_like(cov)
    chol[usable] = conditional_cholesky(cov[usable])
    if kind != "lattice" or cov.size * z.shape[1] > CHOL_SLOPE_MAX:
        return chol, None
    return chol, _cholesky_slopes(z, step, chol, usable, slope_cols)


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


CCD_RESIDUAL_MAX = 0.2
"""Nats by which a large model's log marginal of three hyperparameter coordinates may miss its
split-normal at the central composite design's factorial points (1.9 SDs out) for the design to
be kept (:func:`integrate`). Measured on an AR(1) trend of Poisson counts (mu, rho, sigma): 0.75
at 200 steps (the design put rho 0.38 SD off a long NUTS run, and its verdict said so), 0.31 at
2000, 0.16 at 10^4 (every mean within 0.07 SD of the lattice's 369 points, 15 fits instead)."""


CCD_FIRST_MIN = 50_000
"""Conditional coordinates from which three hyperparameter coordinates try the central composite
design first. Below, the lattice: over an AR(1) trend of 2000 and 10^4 steps the design's draws
(split normals, Gaussian tails) gave the verdict's 200 weights a k-hat of 0.23-0.77 and
0.06-0.64 over three keys where the answer was within 0.07 SD of the lattice's (k-hat
0.16-0.41): an accurate fit judged by chance. At 10^5 steps the lattice took 130 s and 10.7 GB."""


def _ccd_fits(marginal: Callable, mode, scale, x_mode):
    """The central composite design's points, their inner fits, split-normal scales, log
    densities and slopes, and the largest miss of the split normal at its factorial points (nats)."""
    d = mode.size
    z, _ = ccd_points(d)
    fits = marginal(mode + z @ scale.T, np.broadcast_to(np.asarray(x_mode), (len(z),) + np.shape(x_mode)), True)
    logp = np.asarray(fits.log_density, np.float64)
    sigma = _split_normal_scales(z, logp)
    side = np.where(z < 0, sigma[:, 0], sigma[:, 1])
    miss = np.abs(logp - (logp[0] - 0.5 * np.sum((z / side) ** 2, axis=1)))[1 + 2 * d:]
    finite = np.isfinite(logp)
    slope = _least_squares_slope(z[finite], np.asarray(fits.x + fits.shift, np.float64)[finite])
    slopes = np.broadcast_to(slope, (len(z),) + slope.shape)
    return z, fits, sigma, logp, slopes, float(np.max(miss, initial=0.0))


def _quadratic_recentre(z, logp, mode, scale):
    """``(mode, scale)`` from the full quadratic through a central composite design's log
    densities (``1 + d + d(d+1)/2`` coefficients from ``1 + 2d + 2^d`` points): the mode search's
    curvature, from central differences at one step, can miss the marginal's width (at 10^5
    AR(1) steps one axis fell 0.3 nats where a Gaussian falls 1.8); ``None`` where the quadratic
    has no maximum or a point failed."""
    if not np.all(np.isfinite(logp)):
        return None
    d = z.shape[1]
    pairs = [(i, j) for i in range(d) for j in range(i, d)]
    features = np.concatenate([np.ones((len(z), 1)), z, np.stack([z[:, i] * z[:, j] for i, j in pairs], 1)], 1)
    coef = np.linalg.lstsq(features, logp, rcond=None)[0]
    hess = np.zeros((d, d))
    for (i, j), c in zip(pairs, coef[1 + d:]):
        hess[i, j] = hess[j, i] = 2 * c if i == j else c
    eigval, eigvec = np.linalg.eigh(-hess)
    if not np.all(eigval > 0):
        return None
    centre = np.linalg.solve(-hess, coef[1:1 + d])
    return mode + scale @ centre, scale @ (eigvec / np.sqrt(eigval))


def integrate(marginal: Callable, search: ModeSearch, theta_index, x_index, slope_cols, coarse: bool = False,
              batch: int = BATCH, interpolate: bool = False):
    """The :class:`NestedDesign` around the mode of the hyperparameters' marginal (``coarse``,
    ``batch``, ``interpolate``: :func:`~.lattice.lattice`'s).

    A lattice up to three coordinates, a central composite design beyond. For a large model
    (``coarse``) with three and a long field (:data:`CCD_FIRST_MIN`), each point an expensive
    inner fit, the central composite design first: kept where the marginal is Gaussian enough
    (:data:`CCD_RESIDUAL_MAX`), else once more around the mode and curvature of the quadratic
    through its points (:func:`_quadratic_recentre`), else the lattice's hundreds of points.

    ``slope_cols (Dx,)``: the coordinates whose conditional mean follows ``theta`` linearly
    between design points (those drawn from their conditional Gaussians).
    """
    mode, x_mode = search.theta, search.x
    d = mode.size
    eigval, eigvec = np.linalg.eigh(search.precision)
    scale = eigvec / np.sqrt(eigval)
    ccd, evaluations = d not in LATTICE or (coarse and d == 3 and len(x_index) >= CCD_FIRST_MIN), 0
    if ccd:
        z, fits, sigma, logp, slopes, miss = _ccd_fits(marginal, mode, scale, x_mode)
        recentred = _quadratic_recentre(z, logp, mode, scale) if d in LATTICE and not miss <= CCD_RESIDUAL_MAX else None
        if recentred is not None:
            evaluations, (mode, scale) = len(z), recentred
            z, fits, sigma, logp, slopes, miss = _ccd_fits(marginal, mode, scale, x_mode)
        ccd = d not in LATTICE or miss <= CCD_RESIDUAL_MAX
        evaluations += 0 if ccd else len(z)
    if ccd:
        kind, step, log_w = "ccd", 0.0, logp + ccd_points(d)[1]
        edge = np.zeros(len(z), bool)
        g = c = np.zeros_like(z)
    else:
        kind, sigma = "lattice", np.ones((d, 2))
        step, z, fits, edge, slopes, (g, c) = lattice(marginal, mode, scale, x_mode, coarse, batch, interpolate)
        # the cell's mass: log p~ at the point times the integral of its local quadratic
        log_w = np.asarray(fits.log_density, np.float64) + np.sum(cell_moments(g, c, step)[0] - np.log(step), 1)
    ok = np.isfinite(log_w) & np.all(np.isfinite(fits.var), axis=1)
    log_w = np.where(ok, log_w, -np.inf)
    log_w = log_w - (np.max(log_w) + np.log(np.sum(np.exp(log_w - np.max(log_w)))))
    w = np.exp(log_w)
    keep = log_w > np.log(1e-12)  # points that carry no mass
    # every point kept (the usual case): no copy of the conditionals (1 GB over a 50 x 50 grid)
    kept = fits if np.all(keep) else jax.tree.map(lambda a: np.asarray(a)[keep], fits)
    chol, chol_slope = _conditional_factors(kind, z, step, fits, log_w, slope_cols)
    return NestedDesign(
        kind=kind, theta_index=theta_index, x_index=x_index, mode=mode, scale=scale, step=step, sigma=sigma,
        z=z[keep], theta=mode + z[keep] @ scale.T, log_weights=log_w[keep] - np.log(np.sum(w[keep])),
        x_mode=np.asarray(kept.x, np.float64), x_mean=np.asarray(kept.x + kept.shift, np.float64),
        x_cov=None if kept.cov is None else np.asarray(kept.cov, np.float64),
        x_slope=np.asarray(slopes)[keep] * slope_cols[:, None], cell_slope=g[keep], cell_curvature=c[keep],
        point_params=kept.params, uncoupled=np.all(kept.uncoupled, axis=0), edge_mass=float(np.sum(w[edge])),
        num_outer_iter=search.num_iter, num_evaluations=search.num_evaluations + evaluations + len(z),
        x_var=np.asarray(kept.var, np.float64), x_curvature=kept.curvature,
        x_chol=None if chol is None else chol[keep], x_chol_slope=None if chol_slope is None else chol_slope[keep],
    )
