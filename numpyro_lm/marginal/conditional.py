r"""Nested Laplace's inner step: the Laplace fit of the latent field given the hyperparameters.

At a point :math:`\theta` the conditional :math:`p(x \mid \theta, y)` is fitted by the conditional
Laplace marginal's inner search (:func:`~.laplace_marginal.inner_search`, one copy of the model
in the compiled program), its curvature a :class:`~numpyro_lm.curvature.CholeskyCurvature`; the Laplace
marginal :math:`\log\tilde p(\theta\mid y)` follows, corrected by the matched families where
a coordinate is coupled to no other (:func:`matched_normaliser`), and the conditional mean
is moved from the mode towards the mean where the conditional is skewed (:func:`mean_shift`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..core.trace import is_elementwise, site_values
from ..curvature import CholeskyCurvature, covariance
from ..families import get_family
from ..families.registry import basis_log_prob
from ..mode.derivatives import hvp
from ..mode.banded_hessian import BandedHessian, band_offsets, column_reach, cyclic_colours, smallest_width
from ..mode.hessian import (GLOBAL_MAX, ArrowheadHessian, DenseHessian, PlateStructure, diagonal_structure,
                           lowrank_hessian, plate_structure, structure_tol)
from ..runtime.programs import program
from .field_correction import log_det_gradient, second_order_correction
from .laplace_marginal import inner_search, quadrature_correction, scalar_blocks
from .quadrature import SHIFT_NODES, add_at, as_slice, block_quadrature_correction

__all__ = ["PointFits", "x_positions", "quantile_sites", "conditional_hessian", "conditional_fit", "point_params",
           "matched_normaliser", "mean_shift", "structured_mean_shift", "banded_mean_shift"]


class PointFits(NamedTuple):
    """The inner Laplace fits at K points (what the vectorised marginal returns)."""

    log_density: np.ndarray  # (K,) log p~(theta_k | y) + const
    x: np.ndarray  # (K, Dx) conditional modes
    cov: np.ndarray  # (K, Dx, Dx); None where the curvature is structured (see curvature)
    precision_diagonal: np.ndarray  # (K, Dx) diagonal of the conditional precision H
    uncoupled: np.ndarray  # (K, Dx) coordinates H couples to no other
    params: dict  # {site: matched params (K, ...)} of the quantile sites, see point_params
    shift: np.ndarray  # (K, Dx) conditional mean - mode (mean_shift), zero where not computed
    var: np.ndarray = None  # (K, Dx) conditional variances
    curvature: object = None  # the K structured curvatures (numpyro_lm.mode.hessian), None for dense ones
    structure_error: np.ndarray = None  # (K,) the structured Hessian's check (numpyro_lm.mode.hessian)
    gain: np.ndarray = None  # (K,) what the globals' shift added to log_density (structured_mean_shift)


def conditional_hessian(layout, theta_index: tuple, curvature: str, plate=None):
    """The conditional fits' Hessian strategy over the coordinates outside ``theta_index``: dense,
    or the plate's block-arrowhead structure with the hyperparameters taken out of its globals
    (dense where a hyperparameter lies inside the plate); for ``curvature="lowrank"`` that
    structure (each coordinate its own block where no plate gives one) under a low-rank update,
    unbound (:meth:`~numpyro_lm.mode.hessian.LowRankHessian.bind`). ``curvature``: the joint
    fit's choice (:func:`~numpyro_lm.core.curvature_choice.curvature_candidates`), or a
    :class:`~numpyro_lm.mode.banded_hessian.BandedHessian` found for the field (:func:`banded_inner_hessian`)."""
    if isinstance(curvature, BandedHessian):
        return curvature
    if curvature == "dense":
        return DenseHessian()
    structure = plate_structure(layout, plate)
    hyper = np.asarray(theta_index, int)
    position = np.full(layout.size, -1)
    x_index = np.setdiff1d(np.arange(layout.size), hyper)
    position[x_index] = np.arange(x_index.size)
    if structure is None or np.any(position[structure.local_index] < 0):
        if curvature != "lowrank" or structure is not None:
            return DenseHessian()
        inner = diagonal_structure(x_index.size)
    else:
        glob = position[structure.global_index]
        inner = PlateStructure(structure.plate, position[structure.local_index].astype(np.int32),
                               glob[glob >= 0].astype(np.int32))
    if curvature == "lowrank":
        return lowrank_hessian(layout, inner, x_index.size)
    return ArrowheadHessian(inner)


SECOND_POINT_SHIFT = 0.37
"""Where :func:`banded_inner_hessian` reads the band's diagonals a second time: the start moved by
this much in every coordinate (and the field by a cosine of it), an arbitrary point off the start."""

BANDED_MIN_DIM = 64
"""Field coordinates from which ``curvature="auto"`` looks for a band where no plate gives a
structure (below, the dense Hessian's ``D`` products cost what the band's search would)."""


def banded_inner_hessian(info, theta_index, start, args, kwargs) -> Optional[BandedHessian]:
    """The field's banded Hessian strategy where the conditional density's Hessian at ``start``
    (flat) holds a band (:func:`~numpyro_lm.mode.banded_hessian.find_half_width`: a latent Markov
    chain, an AR trend written with ``scan``), else ``None``. The field is the largest site
    outside ``theta_index``; the other sites' coordinates (an intercept, coefficients: at most
    :data:`~numpyro_lm.mode.hessian.GLOBAL_MAX`) are its dense border."""
    theta_index = np.asarray(theta_index)
    x_index = np.setdiff1d(np.arange(info.size), theta_index)
    columns = x_positions(info.layout, theta_index)
    field = max(columns.values(), key=len, default=np.zeros(0, int))
    glob = np.setdiff1d(np.arange(x_index.size), field)
    if field.size < BANDED_MIN_DIM or glob.size > GLOBAL_MAX:
        return None
    glob, key = tuple(int(i) for i in glob), tuple(int(i) for i in theta_index)
    dtype = jnp.result_type(float)  # the working precision, as the probe of every inner fit
    point = (np.asarray(start[theta_index], dtype), np.asarray(start[x_index], dtype))

    def probe(width, at):  # compiled once per model, width and shapes: a warm call compiles nothing
        return program(_band_probe, info, key, width, glob)(at, args, kwargs)

    start = program(_band_reach, info, key, glob)(point, args, kwargs)
    width = smallest_width(lambda w: probe(w, point)[0], x_index.size, len(glob), structure_tol(dtype),
                           start=int(start))
    if width is None:
        return None
    # the band's nonzero diagonals at the start and at a second point (a coefficient that
    # vanishes at the start, an AR(1)'s rho = 0, does not vanish at both)
    other = (point[0] + SECOND_POINT_SHIFT, point[1] + SECOND_POINT_SHIFT * np.cos(np.arange(point[1].size)))
    bands = np.stack([np.asarray(probe(width, at)[1], np.float64) for at in (point, other)])
    offsets = band_offsets(bands, float(np.finfo(dtype).eps))
    sparse = cyclic_colours(width, offsets) <= width  # half the band's probes or fewer
    return BandedHessian(width, glob, offsets=offsets if sparse else ())


def _conditional_neg(info, theta_index, theta, args, kwargs):
    def neg(y):
        return -info.log_density(site_values(info.layout, np.asarray(theta_index), theta, y), args, kwargs)

    return neg


def _band_reach(info, theta_index, glob, theta, x, args, kwargs):
    """:func:`~numpyro_lm.mode.banded_hessian.column_reach` on the conditional density at ``(theta, x)``."""
    return column_reach(_conditional_neg(info, theta_index, theta, args, kwargs), x, glob)


def _band_probe(info, theta_index, width, glob, theta, x, args, kwargs):
    """The probe of a band of ``width`` (and border ``glob``) on the conditional density at ``(theta, x)``:
    ``(its relative error, the band)``."""
    _, _, (band, _, _), error = BandedHessian(width, glob).evaluate(_conditional_neg(info, theta_index, theta, args,
                                                                                      kwargs), x)
    return error, band


def conditional_fit(neg_log_density: Callable, theta, x0, tol: float, max_iter: int, hessian=DenseHessian(),
                    blocks: Optional[Callable] = None):
    """Inner Laplace at ``theta``: ``(PointFits, curvature)`` (``params`` and ``shift`` left empty).

    ``neg_log_density(theta, x)``. The search is the conditional Laplace marginal's
    (:func:`~.laplace_marginal.inner_search`), whose convergence check already evaluated the
    Hessian at ``x*`` (one copy of the model in the compiled program): its Cholesky factor is the
    curvature's. Points whose inner fit did not converge get ``log p~ = -inf`` (no weight).
    ``hessian``: the search's strategy (:mod:`numpyro_lm.mode.hessian`); a structured one's
    curvature is kept in place of the dense covariance. ``blocks(theta, x) -> (J,)``: with scalar
    blocks, each block's own terms of the log density (:mod:`.block_terms`) for their quadrature.
    """
    log_density = lambda x, t: -neg_log_density(t, x)  # noqa: E731 - the marginal's argument order
    if x0.shape[-1] == 0:
        # nothing left to condition on (every coordinate a hyperparameter): the marginal is the density
        value = log_density(x0, theta)
        empty = jnp.zeros((0, 0), x0.dtype)
        curvature = CholeskyCurvature(empty, empty)
        return PointFits(jnp.where(jnp.isfinite(value), value, -jnp.inf), x0, empty, x0, jnp.zeros(0, bool), {},
                         x0, x0), curvature
    state = inner_search(log_density, theta, x0, tol, max_iter, hessian)
    if not isinstance(hessian, DenseHessian):
        values = None if blocks is None else (lambda x, t: blocks(t, x))
        return _structured_fit(log_density, theta, state, hessian, values)
    ok = state.positive & state.converged
    curvature = CholeskyCurvature(state.hess, jnp.where(ok, state.chol, jnp.nan))
    log_marginal = -state.value - 0.5 * curvature.logdet()
    log_marginal = jnp.where(ok & jnp.isfinite(log_marginal), log_marginal, -jnp.inf)
    off_diagonal = state.hess * (1 - jnp.eye(state.hess.shape[-1], dtype=state.hess.dtype))
    uncoupled = jnp.all(off_diagonal == 0, axis=-1)
    fits = PointFits(log_marginal, state.x, covariance(curvature), jnp.diagonal(state.hess), uncoupled, {},
                     jnp.zeros_like(state.x), curvature.variance())
    return fits, curvature


def _structured_fit(log_density: Callable, theta, state, hessian, values=None):
    """:func:`conditional_fit` with a structured Hessian: the curvature travels with the fits;
    a fit whose structure check failed (:func:`numpyro_lm.mode.hessian.structure_tol`) gets no weight."""
    curvature = hessian.curvature(state.hess)
    ok = curvature.positive() & state.converged & (state.structure_error <= structure_tol(state.x.dtype))
    log_marginal = -state.value - 0.5 * curvature.logdet()
    if scalar_blocks(hessian):
        # scalar local blocks: each one's integral by adaptive Gauss-Hermite, not one Gaussian
        log_marginal = log_marginal + quadrature_correction(log_density, theta, state.x, hessian, state.hess, False,
                                                            values)
    elif isinstance(hessian, BandedHessian):
        # a Markov field: the expansion's next terms, whose change with theta tilts its marginal;
        # with a border (a level), over the field's linear predictors (field_correction)
        border = (hessian.glob, *state.hess[1:]) if hessian.glob else None
        log_marginal = log_marginal + second_order_correction(lambda x: -log_density(x, theta), state.x,
                                                              state.hess[0], hessian.half_width, border)
    log_marginal = jnp.where(ok & jnp.isfinite(log_marginal), log_marginal, -jnp.inf)
    fits = PointFits(log_marginal, state.x, None, curvature.diagonal(), curvature.uncoupled(), {},
                     jnp.zeros_like(state.x), curvature.variance(), curvature, state.structure_error)
    return fits, curvature


def point_params(layout, theta_index, x, var) -> dict:
    """Matched family params of each quantile site's conditional marginals (per point),
    from the conditional modes ``x`` and variances ``var`` (each ``(..., Dx)``)."""
    positions = x_positions(layout, theta_index)
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


def mean_shift(neg_log_density: Callable, theta, x, curvature):
    r"""Move the conditional mode towards the conditional mean (skewed conditionals).

    The Gaussian :math:`q = N(m, \Sigma)` closest in KL to the conditional satisfies
    :math:`E_q[\nabla f] = 0` (Stein), :math:`f` the negative log density in ``x``. One
    Newton step from the mode with the Laplace covariance, the expectation by sigma points
    :math:`x^* \pm a_i`, :math:`a_i` the columns of any square root of :math:`\Sigma`
    (``curvature.inv_sqrt``: the third-derivative term only sees :math:`\sum_i a_i a_i^T = \Sigma`),

    .. math:: \delta = -\Sigma\Big(\nabla f(x^*) + \tfrac12 \sum_i
              \big[\nabla f(x^* + a_i) + \nabla f(x^* - a_i) - 2\nabla f(x^*)\big]\Big)
              \approx -\tfrac12 \Sigma\, \nabla_x \log\det H(x^*),

    a mean correction in the spirit of the simplified Laplace approximation (Rue et al.
    2009, sec. 3.2.3), its third derivatives by differences of gradients. Capped at one conditional
    SD per coordinate; zero where a gradient is not finite. ``2 Dx + 1`` gradients.
    """
    # any square root of the covariance serves (sum_i a_i a_i' = cov): the curvature's
    axes = curvature.inv_sqrt(jnp.eye(x.shape[-1], dtype=x.dtype))
    points = jnp.concatenate([x + axes, x - axes, x[None]])
    grads = jax.vmap(jax.grad(lambda y: neg_log_density(theta, y)))(points)
    n = x.shape[-1]
    g0 = grads[2 * n]
    expected = g0 + 0.5 * jnp.sum(grads[:n] + grads[n : 2 * n] - 2 * g0, axis=0)
    sd = jnp.sqrt(curvature.variance())
    shift = jnp.clip(-curvature.solve(expected), -sd, sd)
    return jnp.where(jnp.all(jnp.isfinite(shift)), shift, 0.0)


def banded_mean_shift(neg_log_density: Callable, theta, x, curvature, hessian: BandedHessian):
    r"""``(shift, ok)``: :func:`structured_mean_shift`'s :math:`\delta = -\tfrac12 \Sigma\,\nabla_x
    \log\det H(x^*)` for a Markov field whose terms beyond the second order are each a function of
    one linear predictor (counts or binary data over the field), its gradient from the third
    derivatives' diagonal (:func:`~.field_correction.log_det_gradient`: one forward pass instead of
    reverse mode through the band's products), capped at one conditional SD as there. ``ok``: the
    derivatives' check held and the shift is finite; else the caller takes
    :func:`structured_mean_shift`."""
    gradient, error = log_det_gradient(lambda y: neg_log_density(theta, y), x, curvature, hessian.glob)
    sd = jnp.sqrt(curvature.variance())
    shift = jnp.clip(-0.5 * curvature.solve(gradient), -sd, sd)
    return shift, (error <= structure_tol(x.dtype)) & jnp.all(jnp.isfinite(shift))


COLLAPSED_STEPS = 3
"""Further quasi-Newton steps of the globals towards the collapsed density's mode at most
(:func:`structured_mean_shift`): each leaves the fraction of the last that the Schur complement
misses of the collapsed density's curvature (about 2 % on a binary GLMM with 20 observations a
group), so one more step serves every model measured; the third is a guard."""
COLLAPSED_STEP_TOL = 3.5
"""A globals' step under this many conditional SDs is the last one, taken without a refit: the
refit and the next slope cost what the first step did (on the crossed GLMM of
``benchmarks/scale.py``, 82 design points whose first steps are 3.0 SD, they doubled the call to
250 s for a 0.07 SD move). At the fractions of a step measured missed (2-2.5 % on the logistic
GLMMs there, 5.7 % on binary groups of four) it leaves at most 0.09 and 0.2 SD."""


def structured_mean_shift(neg_log_density: Callable, theta, x, curvature, hessian, with_gain: bool = False,
                          blocks: Optional[Callable] = None):
    r""":func:`mean_shift` for a structured curvature: the same correction
    :math:`\delta = -\tfrac12 \Sigma\, \nabla_x \log\det H(x^*)` with the gradient of the
    log-determinant taken exactly, by reverse-mode differentiation through the structured
    Hessian (its ``b + G + 1`` Hessian-vector products and block factorisation: third
    derivatives of the model for a few gradients' cost) instead of ``2 D`` sigma points.

    With scalar local blocks the globals :math:`\beta` move to the mode of their collapsed
    density (:func:`_collapsed_mode`): the blocks integrated out by Laplace with the blocks'
    Gauss-Hermite correction :math:`C` (:mod:`numpyro_lm.marginal.quadrature`), and the local
    means follow them, :math:`-U\,\delta_G` (:math:`(H^{-1})_{GL} = -S^{-1}B^\top A^{-1}`).
    With ``with_gain`` it also returns what the move adds to the Laplace marginal: the
    collapsed density's rise from the joint mode to its own. Over the blocks it sums to several
    nats that change with the hyperparameters (a logistic GLMM's slope moves by more than one
    SD): left out, it put a 10^3-group GLMM's scale 0.07 SD low. ``blocks``: as :func:`conditional_fit`'s."""
    if isinstance(hessian, (ArrowheadHessian, BandedHessian)):
        # the structure was probed at the fit's mode; here its products are differentiated, and
        # the probe was a fifth of the slope's cost (GLMM, 10^4 groups: 44 -> 35 ms)
        hessian = hessian._replace(check=False)

    def logdet(y):  # log det H(y), with H's blocks as the gradient's aux (a refit's curvature reads them)
        hess = hessian.evaluate(lambda z: neg_log_density(theta, z), y)[2]
        return hessian.curvature(hess).logdet(), hess

    gain = jnp.zeros((), x.dtype)
    sd = jnp.sqrt(curvature.variance())
    if scalar_blocks(hessian):
        # a local coordinate keeps its own skewness correction, -A^-1 (grad log det H)_L / 2; the
        # globals' move to their collapsed mode (and the locals' response) replaces the rest
        gain, end, g_logdet = _collapsed_mode(neg_log_density, theta, x, curvature, hessian, logdet,
                                              sd[hessian.structure.global_index], blocks)
        local = as_slice(hessian.structure.local_index[:, 0])
        shift = add_at(end - x, local, -0.5 * g_logdet[local] / curvature.a[:, 0, 0])
    else:
        shift = -0.5 * curvature.solve(jax.grad(logdet, has_aux=True)(x)[0])
    # a local coordinate's shift is its own skewness correction, a fraction of its SD (clipped
    # there against a wild third derivative); a global's sums every block's contribution and
    # grows like sqrt(J) in posterior SDs (a 10^3-group logistic GLMM's slope moves by 1.4 SD)
    limit = sd.at[hessian.structure.global_index].set(jnp.inf) if hasattr(hessian, "structure") else sd
    shift = jnp.clip(shift, -limit, limit)
    finite = jnp.all(jnp.isfinite(shift)) & jnp.isfinite(gain)
    if with_gain:
        return jnp.where(finite, shift, 0.0), jnp.where(finite, gain, 0.0)
    return jnp.where(finite, shift, 0.0)


def _collapsed_mode(neg_log_density: Callable, theta, x, curvature, hessian, logdet: Callable, sd, blocks=None):
    r"""``(gain, end point, gradient of log det H at x)``: the globals' quasi-Newton steps to
    the mode of their collapsed density from the joint conditional mode ``x`` (``sd``: the
    globals' conditional SDs there, ``curvature`` the curvature, ``logdet(y) -> (log det H(y), H)``).

    With the blocks integrated out the globals' integrand is :math:`e^{F(\beta)}`,
    :math:`F = \log p(\beta, \hat z(\beta)) + c(\beta)`, :math:`c = -\tfrac12\log\det H + C`
    (:math:`\hat z(\beta)` the blocks' conditional modes). Its slope along
    :math:`\hat z(\beta)` is :math:`t = v_G - U^\top v_L`, :math:`v = \nabla\log p + \nabla c`
    (zero in the first term at the joint mode), and each step is :math:`\delta = S^{-1} t`,
    :math:`S` the Schur complement: Newton's step but for the curvature of :math:`c`, which
    grows with the blocks as :math:`S` does (on a binary GLMM with 20 observations a group the
    first step falls 2 % short: 0.09 posterior SD at 10^4 groups, 0.3 at 10^5). After a step
    of more than :data:`COLLAPSED_STEP_TOL` SD the blocks are refitted at the moved globals
    (two Newton steps on each block from the linear prediction :math:`\hat z - U\delta`) and
    the next step taken from there, at most :data:`COLLAPSED_STEPS` more. The gain,
    :math:`F` at the end less :math:`F(\beta^*)`, by the trapezoid rule along the steps,
    :math:`\sum_k \tfrac12 (t_k + t_{k+1})^\top\delta_k` (the last :math:`t` taken as 0):
    exact for a quadratic :math:`F`; on that GLMM at 10^4 groups 0.05 nats from the exact rise
    of 14.4, where the one-step :math:`\tfrac12 t^\top S^{-1} t` is 0.23 short."""
    glob, local = hessian.structure.global_index, as_slice(hessian.structure.local_index[:, 0])

    def neg(z):
        return neg_log_density(theta, z)

    def log_density(z):
        return -neg(z)

    ones = add_at(jnp.zeros_like(x), local, jnp.ones(x[local].shape, x.dtype))

    def correction(z):
        # the blocks' precisions alone: one coloured product (scalar blocks couple to no other
        # block), not the strategy's b + G of them, whose reverse pass is most of the slope
        precision = hvp(neg, z, ones)[local]
        values = None if blocks is None else (lambda y: blocks(theta, y))
        return block_quadrature_correction(log_density, z, local, precision, num_nodes=SHIFT_NODES, values=values)

    def refit(y):  # the blocks' conditional modes at the moved globals: Newton, block by block
        for _ in range(2):
            g, hv = jax.grad(log_density)(y), hvp(log_density, y, ones)
            y = add_at(y, local, jnp.where(hv[local] < 0, -g[local] / hv[local], 0.0))
        return y

    def going(state):
        k, _, _, d, _, _ = state
        far = jnp.max(jnp.abs(d[glob]) / sd) > COLLAPSED_STEP_TOL
        return (k == 0) | ((k <= COLLAPSED_STEPS) & far & jnp.all(jnp.isfinite(d)))

    def next_point(state):  # traced once: the slope's reverse passes are most of the program
        k, y, t, d, gain, g_first = state
        y = jax.lax.cond(k > 0, lambda: refit(y + d), lambda: y)
        # two gradients, not one pullback applied twice: a pullback runs back through both terms
        # whatever the cotangent (a zero one included), and the quadrature's is the larger part;
        # a refit point's curvature from the Hessian the log-determinant's slope evaluated there
        g_logdet, hess = jax.grad(logdet, has_aux=True)(y)
        curv = jax.lax.cond(k > 0, lambda: hessian.curvature(hess), lambda: curvature)
        v = jax.grad(log_density)(y) - 0.5 * g_logdet + jax.grad(correction)(y)
        t_new = v[glob] - curv.u[:, 0, :].T @ v[local]
        step = curv.solve(jnp.zeros_like(x).at[glob].set(t_new))  # S^-1 t on the globals, -U S^-1 t
        gain = gain + 0.5 * jnp.dot(t + t_new, d[glob])
        return k + 1, y, t_new, step, gain, jnp.where(k == 0, g_logdet, g_first)

    zeros = jnp.zeros(glob.shape, x.dtype)
    start = (jnp.zeros((), jnp.int32), x, zeros, jnp.zeros_like(x), jnp.zeros((), x.dtype), jnp.zeros_like(x))
    _, y, t, d, gain, g_first = jax.lax.while_loop(going, next_point, start)
    return gain + 0.5 * jnp.dot(t, d[glob]), y + d, g_first


def quantile_sites(layout, hyper_index):
    """Sites outside the hyperparameters matched coordinate by coordinate (Gamma, Beta...)."""
    hyper = set(int(i) for i in hyper_index)
    out = []
    for site in layout.sites:
        family = get_family(site.family, site.basis)
        if site.offset not in hyper and family.copula == "quantile" and is_elementwise(site, family):
            out.append((site, family))
    return out
