"""The nested fit's lattice (numpyro_lm/approximations/nested/lattice_design.py): a coarse lattice computes
the globals' shift and gain at its anchors alone and interpolates them, checked, elsewhere."""

import numpy as np
import pytest

from numpyro_lm.approximations.nested.lattice_design import (INTERPOLATION_GAIN_TOL, INTERPOLATION_SHIFT_TOL, lattice,
                                                      shift_anchors)
from numpyro_lm.marginal.conditional import PointFits

SD = 0.5  # the conditional SD of the three fake latent coordinates


class FakeMarginal:
    """A Gaussian Laplace marginal ``-|theta|^2 / 2`` whose points, fitted with their shift, gain
    ``gain(theta)`` and have their conditional means moved by ``shift(theta)``; counts the points
    fitted with and without it."""

    def __init__(self, gain, shift):
        self.gain, self.shift, self.shifted, self.plain = gain, shift, 0, 0

    def __call__(self, theta, x0, with_shift):
        theta = np.asarray(theta, np.float64)
        k = len(theta)
        base = -0.5 * np.sum(theta**2, 1)
        if with_shift:
            self.shifted += k
            gain, shift = self.gain(theta), self.shift(theta)
        else:
            self.plain += k
            gain, shift = np.zeros(k), np.zeros((k, 3))
        return PointFits(base + gain, np.zeros((k, 3)), None, np.ones((k, 3)), np.ones((k, 3), bool), {}, shift,
                         np.full((k, 3), SD**2), gain=gain)


def smooth_shift(theta):
    return 0.1 * np.stack([theta[:, 0], theta[:, 0] ** 2, np.sum(theta, 1)], 1)


def run(marginal, d, coarse=True):
    step, z, fits, edge, _, _ = lattice(marginal, np.zeros(d), np.eye(d), np.zeros(3), coarse=coarse, batch=1,
                                          interpolate=coarse)
    return z, fits, edge


@pytest.mark.parametrize("d", [1, 2])
def test_a_smooth_gain_is_computed_at_the_anchors_and_one_check_alone(d):
    """A gain and shift quadratic in theta (with a small cubic, 0.002 nats at 3 SDs, inside the
    check's tolerance): the shift is computed at the 1 + d + d (d + 1) / 2 anchors and one check,
    and every other point's log density and shift are the quadratic's (exact for the quadratic part,
    the cubic's at most 0.01 nats and 0.001 SD beyond the anchors out to 5 SDs)."""
    def gain(theta):
        return 3.0 + 0.25 * theta[:, 0] - 0.05 * np.sum(theta, 1) ** 2 + 1e-4 * theta[:, 0] ** 3

    marginal = FakeMarginal(gain, smooth_shift)
    z, fits, _ = run(marginal, d)
    assert marginal.shifted == len(shift_anchors(d)) + 1
    assert marginal.plain >= len(z) - marginal.shifted  # every point fitted (anchors once, with the shift)
    assert len(z) >= 2 * marginal.shifted  # the interpolation covered most of the lattice (9 points in 1-D)
    exact = -0.5 * np.sum(z**2, 1) + gain(z)
    cubic = 1e-4 * np.max(np.abs(z[:, 0])) ** 3  # the part the quadratic cannot follow
    np.testing.assert_allclose(fits.log_density, exact, atol=cubic + 1e-9)
    np.testing.assert_allclose(fits.gain, gain(z), atol=cubic + 1e-9)
    np.testing.assert_allclose(fits.shift, smooth_shift(z), atol=1e-9)


def test_a_kinked_gain_fails_the_check_and_every_point_is_computed():
    """A gain with a kink at the mode (0.5 |theta|): the quadratic through 0 and +-2 misses it by
    0.75 nats at 3 SDs, beyond INTERPOLATION_GAIN_TOL, so every point is fitted with its shift and
    the lattice's log densities are exact."""
    def gain(theta):
        return 0.5 * np.abs(theta[:, 0])

    marginal = FakeMarginal(gain, smooth_shift)
    z, fits, _ = run(marginal, 1)
    assert 0.75 > INTERPOLATION_GAIN_TOL
    assert marginal.shifted == len(z)
    np.testing.assert_allclose(fits.log_density, -0.5 * z[:, 0] ** 2 + gain(z), atol=1e-12)


def test_a_shift_the_quadratic_misses_fails_the_check():
    """The shift's check: a shift with a kink (0.2 |theta| SDs of one coordinate) misses the
    quadratic by 0.15 SD at 3 SDs, beyond INTERPOLATION_SHIFT_TOL: every point is computed."""
    def shift(theta):
        return np.stack([0.2 * SD * np.abs(theta[:, 0]), 0 * theta[:, 0], 0 * theta[:, 0]], 1)

    marginal = FakeMarginal(lambda theta: np.zeros(len(theta)), shift)
    z, fits, _ = run(marginal, 1)
    assert 0.15 > INTERPOLATION_SHIFT_TOL
    assert marginal.shifted == len(z)
    np.testing.assert_allclose(fits.shift, shift(z), atol=1e-12)


def test_a_gain_that_tilts_the_marginal_grows_the_lattice_on_its_side():
    """A gain of 2 theta moves the marginal's mode 2 SDs up: the lattice, cut without the gain at
    first, grows until the points 8 nats below the new top (theta = 2 +- 4) are in, and its edge
    points carry no mass (log density more than 8 nats below the top)."""
    marginal = FakeMarginal(lambda theta: 2.0 * theta[:, 0], smooth_shift)
    z, fits, edge = run(marginal, 1)
    assert marginal.shifted == len(shift_anchors(1)) + 1
    assert np.max(z) >= 6.0 and np.min(z) <= -2.0  # theta = 2 -+ 4: -(z - 2)^2 / 2 >= -8
    np.testing.assert_allclose(fits.log_density, -0.5 * z[:, 0] ** 2 + 2.0 * z[:, 0], atol=1e-9)
    top = np.max(fits.log_density)
    assert np.all(fits.log_density[edge] < top - 8.0 + 1e-9)


def test_without_interpolation_every_points_shift_is_computed():
    """Without scalar blocks (a small model's fine lattice, a field's band) every point is fitted
    with its shift: nothing interpolated."""
    marginal = FakeMarginal(lambda theta: 0.3 * theta[:, 0], smooth_shift)
    z, fits, _ = run(marginal, 1, coarse=False)
    assert marginal.plain == 0 and marginal.shifted == len(z)


def _blob(d, seed=0):
    """Integer lattice points of a random blob in ``d`` coordinates, a fifth of them unusable (failed fits)."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.arange(-4, 5)] * d, indexing="ij"), -1).reshape(-1, d)
    keep = np.sum((grid / np.array([4.0, 3.0, 2.5][:d])) ** 2, 1) <= 1 + 0.3 * rng.uniform(size=len(grid))
    points = grid[keep]
    return points, rng.uniform(size=len(points)) > 0.2


@pytest.mark.parametrize("d", [1, 2, 3])
def test_lattice_slopes_are_exact_on_a_linear_function_and_zero_without_a_neighbour(d):
    """A linear function's differences are its slope whichever neighbours a point has (both, one),
    and zero where it has no usable one along an axis: checked against a per-point dictionary."""
    from numpyro_lm.approximations.nested.lattice_design import lattice_slopes

    points, usable = _blob(d)
    step, slope = 0.75, np.array([1.5, -2.0, 0.25])[:d]
    z = points * step
    values = np.stack([z @ slope, 3.0 * z[:, 0]], 1)  # (K, 2)
    got = lattice_slopes(z, step, values, usable)
    where = {tuple(p): i for i, p in enumerate(points.tolist()) if usable[i]}
    for i, p in enumerate(points.tolist()):
        for a in range(d):
            moved = [tuple(p[:a] + [p[a] + s] + p[a + 1:]) for s in (-1, 1)]
            expected = [slope[a], 3.0 * (a == 0)] if any(m in where for m in moved) else [0.0, 0.0]
            np.testing.assert_allclose(got[i, :, a], expected, atol=1e-12)


@pytest.mark.parametrize("d", [1, 2, 3])
def test_cell_shapes_are_exact_on_a_quadratic_wherever_two_neighbours_exist(d):
    """``log p~`` quadratic along each axis: a usable point with both neighbours, or two on one side,
    reads its gradient and curvature exactly; with one neighbour alone, the line (curvature zero)."""
    from numpyro_lm.approximations.nested.lattice_design import _cell_shapes

    points, usable = _blob(d, seed=1)
    step, centre, curvature = 0.5, np.array([0.3, -0.6, 0.1])[:d], np.array([2.0, 0.5, 1.0])[:d]
    z = points * step
    logp = np.where(usable, -0.5 * np.sum(curvature * (z - centre) ** 2, 1), -np.inf)
    g, c = _cell_shapes(points, usable, logp, step)
    where = {tuple(p) for i, p in enumerate(points.tolist()) if usable[i]}
    for i, p in enumerate(points.tolist()):
        if not usable[i]:  # a failed point carries no weight (the design drops it)
            continue
        for a in range(d):
            def has(s):
                return tuple(p[:a] + [p[a] + s] + p[a + 1:]) in where
            exact_g = -curvature[a] * (z[i, a] - centre[a])
            if (has(1) and has(-1)) or (has(1) and has(2)) or (has(-1) and has(-2)):
                np.testing.assert_allclose([g[i, a], c[i, a]], [exact_g, curvature[a]], atol=1e-9)
            elif has(1) or has(-1):
                s = 1 if has(1) else -1  # the secant's slope at the point
                np.testing.assert_allclose([g[i, a], c[i, a]], [exact_g - 0.5 * s * curvature[a] * step, 0.0], atol=1e-9)
            else:
                assert g[i, a] == 0.0 and c[i, a] == 0.0


class PiecewiseMarginal(FakeMarginal):
    """The same marginal, also in one-point pieces (``MarginalAtPoints.pieces``)."""

    def pieces(self, theta, x0, with_shift):
        return [self(theta[i:i + 1], x0[i:i + 1], with_shift) for i in range(len(theta))]


@pytest.mark.parametrize("d", [1, 2])
def test_a_lattice_kept_in_pieces_is_the_lattice_kept_whole(d):
    """Fits taken in the pieces the marginal's calls return (each point its own, as a large model's
    one-point calls) make the same lattice, point for point, anchors, interpolation and check
    included, as fits concatenated wave by wave."""
    def gain(theta):
        return 3.0 + 0.25 * theta[:, 0] - 0.05 * np.sum(theta, 1) ** 2

    whole, pieces = FakeMarginal(gain, smooth_shift), PiecewiseMarginal(gain, smooth_shift)
    (z, fits, edge), (z_p, fits_p, edge_p) = run(whole, d), run(pieces, d)
    np.testing.assert_array_equal(z_p, z)
    np.testing.assert_array_equal(edge_p, edge)
    for field in ("log_density", "gain", "shift", "x"):  # the interpolation's products in other batches: round-off
        np.testing.assert_allclose(getattr(fits_p, field), getattr(fits, field), rtol=1e-12, atol=1e-12)
    assert (pieces.shifted, pieces.plain) == (whole.shifted, whole.plain)


class ShapedMarginal(FakeMarginal):
    """A Laplace marginal ``log_density(theta)`` without shift or gain."""

    def __init__(self, log_density):
        super().__init__(lambda theta: np.zeros(len(theta)), lambda theta: np.zeros((len(theta), 3)))
        self.log_density = log_density

    def __call__(self, theta, x0, with_shift):
        fits = super().__call__(theta, x0, with_shift)
        theta = np.asarray(theta, np.float64)
        return fits._replace(log_density=self.log_density(theta))


def test_a_gaussians_outer_ring_beyond_the_cut_is_left_out(monkeypatch):
    """One coordinate, coarse steps of 1 SD and a cut 8 nats below the top: the points out to 4 SDs
    are fitted, the ones at 5 SDs (12.5 nats below, 3.5 below the cut on the line through 3 and 4
    SDs) are not, and the outermost fitted points are not the lattice's edge; without the
    pruning (an infinite margin) those two are fitted too."""
    import numpyro_lm.approximations.nested.lattice_design as lattice_design

    def gaussian(theta):
        return -0.5 * np.sum(theta**2, 1)

    z, _, edge = run(ShapedMarginal(gaussian), 1)
    np.testing.assert_array_equal(np.sort(z[:, 0]), np.arange(-4.0, 5.0))
    assert not np.any(edge)
    monkeypatch.setattr(lattice_design, "PRUNE_MARGIN", np.inf)
    z_all, _, _ = run(ShapedMarginal(gaussian), 1)
    np.testing.assert_array_equal(np.sort(z_all[:, 0]), np.arange(-5.0, 6.0))


def _skewed(theta):  # a log-gamma-like coordinate and a Gaussian one: concave, skewed
    return 3.0 * theta[:, 0] - 3.0 * (np.exp(theta[:, 0] / 1.7) - 1) * 1.7 - 0.5 * np.sum(theta[:, 1:] ** 2, 1)


def _heavy(theta):  # a Student-t-like tail (convex beyond sqrt(2) SDs), crossing the cut near 4 SDs
    return -4.0 * np.sum(np.log1p(theta**2 / 2.0), 1)


def _ridge(theta):  # a curved ridge (Rosenbrock-like, not concave across it) in the first two coordinates
    x, y = theta[:, 0], theta[:, 1]
    return -0.5 * (x**2 + 4.0 * (y - 0.3 * x**2) ** 2) - 0.5 * np.sum(theta[:, 2:] ** 2, 1)


@pytest.mark.parametrize("log_density, d", [(_skewed, 1), (_skewed, 2), (_skewed, 3), (_heavy, 1), (_heavy, 2),
                                            (_heavy, 3), (_ridge, 2), (_ridge, 3)])
def test_the_pruned_lattice_keeps_every_point_above_the_cut(monkeypatch, log_density, d):
    """Skewed, heavy-tailed (convex) and curved-ridge marginals: the lattice without the points left
    out beyond the cut holds every point the full lattice finds above the cut, their log densities
    the same, and fits fewer points; its edge carries nothing above the cut."""
    import numpyro_lm.approximations.nested.lattice_design as lattice_design

    pruned = ShapedMarginal(log_density)
    z, fits, edge = run(pruned, d)
    monkeypatch.setattr(lattice_design, "PRUNE_MARGIN", np.inf)
    full = ShapedMarginal(log_density)
    z_all, fits_all, _ = run(full, d)
    drop = lattice_design.LATTICE_COARSE[d][1]

    def above(points, values):
        top = np.max(values)
        return {tuple(p) for p, v in zip(np.round(points, 6).tolist(), values) if v >= top - drop}

    assert above(z_all, fits_all.log_density) == above(z, fits.log_density)
    assert full.plain > pruned.plain
    assert np.all(fits.log_density[edge] < np.max(fits.log_density) - drop)
