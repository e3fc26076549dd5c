"""The lattice over up to three hyperparameter coordinates (:mod:`.design`'s first design):
points explored outwards from the mode while the Laplace marginal stays within a drop of its
top, each cell's log density its local quadratic (:func:`cell_moments`, :func:`cell_draws`).

A large model's inner fits are expensive and the globals' shift and gain at each point
(:func:`~numpyro_lm.marginal.conditional.structured_mean_shift`) cost two to three fits more;
both vary smoothly over the few posterior SDs the lattice spans (a 10^5-group GLMM: the gain
rises 0.22 nats an SD, a quadratic through three points misses it by 0.003 nats and the shift by
0.0005 SD at every other point). There the shift and gain are computed at :func:`shift_anchors`
alone, the quadratic through them stands in at the other points, and one more point checks it
(:data:`INTERPOLATION_GAIN_TOL`, :data:`INTERPOLATION_SHIFT_TOL`); where it misses, every point
is computed.
"""

from __future__ import annotations

import itertools
from typing import Callable

import jax
import numpy as np

__all__ = ["joined", "LATTICE", "LATTICE_COARSE", "LATTICE_LONG", "LONG_LATTICE_MIN", "MAX_HALF", "BATCH",
           "CELL_BOUND", "PRUNE_MARGIN", "SHIFT_ANCHOR", "CHECK_DROP", "INTERPOLATION_GAIN_TOL", "INTERPOLATION_SHIFT_TOL",
           "shift_anchors", "lattice", "lattice_slopes", "cell_moments", "cell_draws"]

# (step, log-density drop) of the lattice in standardised units, by dimension
LATTICE = {1: (0.5, 8.0), 2: (0.75, 9.0), 3: (1.0, 10.5)}
# ... for large models, where each point is an expensive inner fit (marginal.coarse): the
# cells' local quadratics integrate a near-Gaussian marginal as well at twice the step
LATTICE_COARSE = {1: (1.0, 8.0), 2: (1.0, 9.0), 3: (1.25, 10.5)}
# ... and for three coordinates over a long field (LONG_LATTICE_MIN conditional coordinates or
# more), whose marginal the data make Gaussian enough for a step of 1.5: over an AR(1) trend of
# 2000 steps the three hyperparameters' gaps to a NUTS run of 4000 draws were 0.05 / 0.08 / 0.07
# SD at 1.5 and 0.04 / 0.12 / 0.16 at 1.25 (Monte Carlo error 0.12 / 0.04 / 0.06), a CAR field
# over a 50 x 50 grid 266 points instead of 427 with tau 0.00 SD from NUTS's (0.01 at 1.25);
# over 200 steps sigma moved 0.12 SD away from NUTS's at 1.5, so shorter fields keep 1.25
LATTICE_LONG = {3: (1.5, 10.5)}
LONG_LATTICE_MIN = 2000
MAX_HALF = 10.0  # the lattice's extent, standardised units from the mode
BATCH = 8  # inner fits per compiled call (one program for the stencil, the line search and the design)
CELL_BOUND = 20.0  # |g| h and c h^2 of a lattice cell's log density (cell_moments is exact below)
PRUNE_MARGIN = 1.0
"""Nats below the cut (the top less the drop) at which a neighbour of an expanded point is left
out: where the line through the point and the one behind it already reaches there. On a
log-concave marginal the line lies above the density, so such a point lies further below; a
point beyond the cut carries less than ``e^-drop`` of the top's weight and is not expanded, and
the cells beside it take their shape from the other side (:func:`_cell_shapes`). At the coarse
steps a Gaussian's outermost ring is then left out, a fit a point (in one coordinate the line
through 3 and 4 SDs puts 5 SDs 3.5 nats below the cut of 8; the density there is 4.5 below)."""


SHIFT_ANCHOR = 2
"""Lattice steps from the centre to the points whose shift and gain a coarse lattice computes
(:func:`shift_anchors`): two steps either side span the bulk, and the quadratic through them
extrapolates to four (at one step the 10^3-group GLMM's gain missed by 0.017 nats five steps out,
at two 0.002)."""

CHECK_DROP = 0.75
"""The interpolation's check is the farthest point whose log density lies within this fraction of
the lattice's drop from the top (3 SDs of a Gaussian in one coordinate, 1.7 steps beyond the
anchors), where the quadratic extrapolates."""

INTERPOLATION_GAIN_TOL = 0.02
"""Nats by which the interpolated gain may miss the computed one at the check point."""

INTERPOLATION_SHIFT_TOL = 0.02
"""Conditional SDs by which an interpolated shift may miss the computed one at the check point."""


def shift_anchors(d: int) -> list:
    """Lattice points (integer steps) that determine a quadratic in ``d`` coordinates: the centre,
    :data:`SHIFT_ANCHOR` steps either way along each axis, and each pair of axes' ``(+, +)``
    corner (``1 + d + d (d + 1) / 2`` points: 3, 6, 10)."""
    points = [(0,) * d]
    for a, s in itertools.product(range(d), (-SHIFT_ANCHOR, SHIFT_ANCHOR)):
        points.append(tuple(s if i == a else 0 for i in range(d)))
    for a, b in itertools.combinations(range(d), 2):
        points.append(tuple(SHIFT_ANCHOR if i in (a, b) else 0 for i in range(d)))
    return points


def _quadratic_features(z) -> np.ndarray:
    """``(K, 1 + d + d (d + 1) / 2)``: 1, ``z_i`` and ``z_i z_j`` (``i <= j``) of ``z (K, d)``."""
    d = z.shape[1]
    squares = [z[:, i] * z[:, j] for i in range(d) for j in range(i, d)]
    return np.stack([np.ones(len(z)), *z.T, *squares], axis=1)


def _neighbours(point):
    d = len(point)
    return [point[:a] + (point[a] + s,) + point[a + 1 :] for a, s in itertools.product(range(d), (-1, 1))]


def _put_row(part, i, other, j):
    """``part`` with its row ``i`` replaced by ``other``'s row ``j`` (copies: fetched arrays are read-only)."""
    def put(a, b):
        a = np.array(a)
        a[i] = b[j]
        return a

    return jax.tree.map(put, part, other)


class _Grid:
    """The lattice's points as they are fitted: the inner fits by call (``parts``), where each
    point's row is (``where``), and with ``interpolate`` the quadratic that stands in for the
    shift and gain away from the anchors (``model``)."""

    def __init__(self, marginal: Callable, mode, scale, step: float, drop: float, batch: int, interpolate: bool):
        self.marginal, self.mode, self.scale = marginal, mode, scale
        self.step, self.drop, self.batch = step, drop, batch
        self.limit = int(round(MAX_HALF / step))
        self.points, self.parts, self.where = [], [], {}
        self.anchors = shift_anchors(mode.size) if interpolate else None
        self.model = None  # (P, 1 + Dx) coefficients of the gain and the shift, once checked
        self.shifted = set()  # points whose shift and gain were computed
        self.expanded = set()  # points whose neighbours were sent to be fitted (a frontier reads each once)
        self.pruned = {}  # points left out beyond the cut: {point: (its neighbour, the one behind that)}

    def row(self, point, field: str):
        p, i = self.where[point]
        return np.asarray(getattr(self.parts[p], field))[i]

    def inner(self, points, starts, with_shift: bool) -> list:
        """``marginal`` at lattice ``points`` (their gain zeros where it has none), in the pieces its
        calls return (``marginal.pieces``, :class:`~.inner.MarginalAtPoints`') where it has them."""
        z = np.array(points, np.float64) * self.step
        pieces = getattr(self.marginal, "pieces", None)
        thetas = self.mode + z @ self.scale.T
        parts = pieces(thetas, starts, with_shift) if pieces else [self.marginal(thetas, starts, with_shift)]
        return [p if p.gain is not None else p._replace(gain=np.zeros(len(p.log_density))) for p in parts]

    def values(self) -> np.ndarray:
        """The points' log densities (the parts hold the points in order)."""
        return np.concatenate([np.asarray(part.log_density, np.float64) for part in self.parts])

    def fit(self, wave: list, starts: list):
        """Inner fits at the lattice points ``wave`` from ``starts``: with their shift and gain
        where there is no interpolation or the point is an anchor, else the model's (once known)."""
        shifted = [self.anchors is None or p in self.anchors for p in wave]
        for flag in (True, False):
            chosen = [i for i, s in enumerate(shifted) if s == flag]
            if not chosen:
                continue
            points, first = [wave[i] for i in chosen], 0
            for fits in self.inner(points, np.stack([starts[i] for i in chosen]), flag):
                here = points[first:first + len(fits.log_density)]
                first += len(here)
                if not flag and self.model is not None:
                    fits = self._interpolated(fits, np.array(here, np.float64) * self.step)
                for i, point in enumerate(here):
                    self.where[point] = (len(self.parts), i)
                    self.points.append(point)
                self.parts.append(fits)
            self.shifted.update(points if flag else ())

    def expand(self):
        """Fit the neighbours of every point within ``drop`` of the top until none is left."""
        wave, starts = self._frontier()
        while wave:
            self.fit(wave, starts)
            wave, starts = self._frontier()

    def comparable(self) -> np.ndarray:
        """:meth:`values`, less the gain before the interpolation: only the anchors carry theirs
        then (140 nats at 10^5 groups), and the cut compares the points without it."""
        values = self.values()
        if self.anchors is None or self.model is not None:
            return values
        return values - np.concatenate([np.asarray(part.gain, np.float64) for part in self.parts])

    def _frontier(self):
        values = self.comparable()
        top = np.max(values)
        value_at = dict(zip(self.points, values))
        cut = top - self.drop - PRUNE_MARGIN

        def below(point, behind):  # the line through behind and point falls below the cut one step on
            return 2 * value_at[point] - value_at[behind] < cut

        following = {}
        # a point left out before is fitted after all where its prediction now clears the cut
        # (the gains' interpolation, or a new top, moved the values)
        for n, (point, behind) in list(self.pruned.items()):
            if not below(point, behind):
                del self.pruned[n]
                following[n] = self._start(point, behind)
        for point, value in zip(self.points, values):
            # below the cut (or not finite): not expanded; expanded before: its neighbours are all fitted
            if point in self.expanded or not value >= top - self.drop:
                continue
            self.expanded.add(point)
            for n in _neighbours(point):
                if max(abs(c) for c in n) <= self.limit and n not in self.where and n not in following:
                    behind = tuple(2 * p - q for p, q in zip(point, n))
                    if behind in value_at and below(point, behind):
                        # beyond the cut even extrapolated linearly (above a concave marginal): not fitted
                        self.pruned[n] = (point, behind)
                        continue
                    self.pruned.pop(n, None)
                    following[n] = self._start(point, behind)
        # fill the last batch of inner fits with the next ring out (free: padding otherwise)
        ring, room = list(following.items()), -len(following) % self.batch
        while room and ring:
            ahead = {}
            for point, x in ring:
                for n in _neighbours(point):
                    if (len(ahead) < room and max(abs(c) for c in n) <= self.limit and n not in self.where
                            and n not in following and n not in ahead and n not in self.pruned):
                        ahead[n] = x
            following.update(ahead)
            ring, room = list(ahead.items()), room - len(ahead)
        return list(following), list(following.values())

    def _start(self, point, behind):
        """The warm start of the lattice point beyond ``point`` from ``behind``: x* extrapolated
        linearly from the two."""
        x = self.row(point, "x")
        back = self.row(behind, "x") if behind in self.where else None
        return x if back is None or not np.all(np.isfinite(back)) else 2 * x - back

    def interpolate(self):
        """The anchors' quadratic for the shift and gain at the other points, checked at the
        farthest point within :data:`CHECK_DROP` of the drop; where an anchor or a point to check
        is missing or the check fails, every point computed. Then the lattice grows where the gain
        lifts points above the cut."""
        values = self.comparable()
        if any(a not in self.where or not np.isfinite(self.row(a, "log_density")) for a in self.anchors):
            return self._shift_all()
        z = np.array(self.anchors, np.float64) * self.step
        targets = np.stack([np.concatenate([[self.row(a, "gain")], self.row(a, "shift")]) for a in self.anchors])
        self.model = np.linalg.solve(_quadratic_features(z), np.asarray(targets, np.float64))
        near = [(np.sum(np.square(p)), p) for p, v in zip(self.points, values)
                if p not in self.shifted and v >= np.max(values) - CHECK_DROP * self.drop]
        if not near:  # nothing to check the quadratic against: the few points there are computed
            return self._shift_all()
        check = max(near)[1]
        fits = joined(self.inner([check], self.row(check, "x")[None], True))
        predicted = _quadratic_features(np.array([check], np.float64) * self.step) @ self.model
        sd = np.sqrt(np.asarray(fits.var, np.float64)[0])
        gain_miss = abs(float(fits.gain[0]) - predicted[0, 0])
        shift_miss = np.max(np.abs(np.asarray(fits.shift, np.float64)[0] - predicted[0, 1:]) / sd, initial=0.0)
        self._replace(check, fits)
        if not (gain_miss <= INTERPOLATION_GAIN_TOL and shift_miss <= INTERPOLATION_SHIFT_TOL):
            return self._shift_all()
        for p, part in enumerate(self.parts):
            rows = [i for i, point in enumerate(self.points) if self.where[point][0] == p
                    and point not in self.shifted]
            if rows:
                z = np.array([self.points[i] for i in rows], np.float64) * self.step
                self.parts[p] = self._interpolated(part, z, [self.where[self.points[i]][1] for i in rows])
        self.expand()

    def _interpolated(self, fits, z, rows=None):
        """``fits`` (computed without their shift) with the model's gain and shift at ``z`` (their
        ``rows``, all by default)."""
        rows = np.arange(len(z)) if rows is None else np.asarray(rows)
        predicted = _quadratic_features(z) @ self.model
        log_density, gain, shift = (np.array(a) for a in (fits.log_density, fits.gain, fits.shift))
        log_density[rows] += predicted[:, 0].astype(log_density.dtype)
        gain[rows] = predicted[:, 0]
        shift[rows] = predicted[:, 1:]
        return fits._replace(log_density=log_density, gain=gain, shift=shift)

    def _replace(self, point, fits):
        p, i = self.where[point]
        self.parts[p] = _put_row(self.parts[p], i, fits, 0)
        self.shifted.add(point)

    def _shift_all(self):
        """Every point's shift and gain computed (the interpolation could not stand in)."""
        self.anchors, self.model = None, None
        todo = [p for p in self.points if p not in self.shifted]
        if todo:
            fits = joined(self.inner(todo, np.stack([self.row(p, "x") for p in todo]), True))
            for j, point in enumerate(todo):
                p, i = self.where[point]
                self.parts[p] = _put_row(self.parts[p], i, fits, j)
                self.shifted.add(point)
        self.expand()

    def fits(self):
        return joined(self.parts)


def joined(parts: list):
    """Fits of several pieces as one (one piece as it is)."""
    return parts[0] if len(parts) == 1 else jax.tree.map(lambda *a: np.concatenate(a), *parts)


def lattice(marginal: Callable, mode, scale, x_mode, coarse: bool = False, batch: int = BATCH,
            interpolate: bool = False):
    """Explore the lattice outwards from the mode (module docstring); ``coarse``: the coarser steps
    of large models (:data:`LATTICE_COARSE`, :data:`LATTICE_LONG`); ``interpolate``: the shift
    and gain computed at :func:`shift_anchors` and interpolated elsewhere (module docstring:
    where they cost more than the fits, the globals' collapsed mode of scalar blocks);
    ``batch``: the inner fits ``marginal`` makes per call.

    Returns ``(step, z (K, d), PointFits of the K points, on-edge mask (K,), slopes, cell shapes)``.
    """
    d = mode.size
    table = LATTICE_COARSE if coarse else LATTICE
    if coarse and np.size(x_mode) >= LONG_LATTICE_MIN:
        table = {**table, **LATTICE_LONG}
    step, drop = table[d]
    grid = _Grid(marginal, mode, scale, step, drop, batch, interpolate)
    grid.fit([(0,) * d], [np.asarray(x_mode)])
    grid.expand()
    if interpolate:
        grid.interpolate()
    points, fits = np.array(grid.points, np.int64), grid.fits()
    logp = np.asarray(fits.log_density, np.float64)
    usable = np.isfinite(logp)
    # the edge: points with a neighbour not fitted, where a point left out below the cut is not missing
    known = np.concatenate([points, np.array(list(grid.pruned), np.int64).reshape(-1, d)])
    present = np.concatenate([usable, np.ones(len(known) - len(points), bool)])
    edge = np.any([_steps_along(known, present, k)[:len(points)] < 0 for k in (-1, 1)], axis=(0, 2))
    slopes = _lattice_slopes(points, usable, np.asarray(fits.x + fits.shift), step)
    shape = _cell_shapes(points, usable, logp, step)
    return step, points.astype(np.float64) * step, fits, edge, slopes, shape


def _steps_along(points, usable, k: int) -> np.ndarray:
    """``(K, d)``: the index of the ``usable`` lattice point ``k`` steps (``|k| <= 2``) from each of
    ``points (K, d)`` (integers) along each axis, ``-1`` where there is none (a dense table of the
    lattice's box: a dictionary lookup per point and axis took 0.1 s over GARCH(1,1)'s 1643 points)."""
    low = points.min(0) - 2
    table = np.full(points.max(0) - low + 3, -1, np.int64)
    table[tuple((points[usable] - low).T)] = np.flatnonzero(usable)
    out = np.empty(points.shape, np.int64)
    for a in range(points.shape[1]):
        moved = points - low
        moved[:, a] += k
        out[:, a] = table[tuple(moved.T)]
    return out


def _lattice_slopes(points, usable, x, step):
    """``(K, Dx, d)`` derivatives of the conditional means ``x (K, Dx)`` in ``z``: central differences
    between a point's ``usable`` lattice neighbours, one-sided where one is missing, zero if both are."""
    own = np.arange(len(points))
    up, down = _steps_along(points, usable, 1), _steps_along(points, usable, -1)
    slopes = np.zeros(x.shape + (points.shape[1],))
    for a in range(points.shape[1]):
        width = step * ((up[:, a] >= 0).astype(np.int64) + (down[:, a] >= 0))  # 2h, h, or none
        high, low = np.where(up[:, a] >= 0, up[:, a], own), np.where(down[:, a] >= 0, down[:, a], own)
        some = width > 0
        slopes[some, :, a] = (x[high[some]] - x[low[some]]) / width[some, None]
    return slopes


def lattice_slopes(z, step, values, usable):
    """``(K, ..., d)`` derivatives in ``z`` of per-point ``values (K, ...)`` at lattice points ``z (K, d)``
    (multiples of ``step``): :func:`_lattice_slopes`' differences between ``usable`` neighbours."""
    points = np.rint(np.asarray(z) / step).astype(np.int64)
    flat = _lattice_slopes(points, np.asarray(usable, bool), np.asarray(values).reshape(len(points), -1), step)
    return flat.reshape(np.shape(values) + (points.shape[1],))


def _cell_shapes(points, usable, logp, step):
    """``(g, c)``, each ``(K, d)``: gradient and curvature of ``log p~`` in ``z`` at each point.

    Along each axis, the quadratic through the point and its two neighbours, or where one
    is missing (the design's edge) through the point and the next two on the other side,
    or the line through two points: exact for a Gaussian marginal. The curvature is
    floored at zero (a convex stretch is drawn from its tangent) and both are bounded
    (``|g| h <= 20``, ``c h^2 <= 20``) so that :func:`cell_moments` stays exact; the same
    values define the draws' density.
    """
    up, down = _steps_along(points, usable, 1), _steps_along(points, usable, -1)
    own = np.broadcast_to(np.arange(len(points))[:, None], up.shape)
    both = (up >= 0) & (down >= 0)
    # one side only: the nearer point and the one beyond it on that side
    side = np.where(up >= 0, 1, -1)
    near = np.where(up >= 0, up, down)
    far = np.where(up >= 0, _steps_along(points, usable, 2), _steps_along(points, usable, -2))
    at = logp[own]
    with np.errstate(invalid="ignore"):  # -inf at failed points, which are masked
        c_both = -(logp[up] - 2 * at + logp[down]) / step**2
        g_both = (logp[up] - logp[down]) / (2 * step)
        c_side = np.where((near >= 0) & (far >= 0), -(logp[far] - 2 * logp[near] + at) / step**2, 0.0)
        # f(s h) = f(0) + g s h - c h^2 / 2
        g_side = np.where(near >= 0, side * ((logp[near] - at) / step + 0.5 * c_side * step), 0.0)
    g, c = np.where(both, g_both, g_side), np.where(both, c_both, c_side)
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


