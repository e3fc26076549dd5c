"""Running a nested Laplace fit: inner fits in compiled batches, the outer design on the host.

:func:`run_nested` splits the flat coordinates into the hyperparameters' and the rest
(:func:`nested_coordinates`), compiles the inner step for a batch of points once per model and
shapes (:mod:`.inner`: :class:`~.inner.MarginalAtPoints`), searches the mode of the
hyperparameters' Laplace marginal (:mod:`.search`), lays the integration design around it
(:mod:`.design`) and matches each site's family to the mixture's moments (:mod:`.mixture`). No
joint fit is made. Nested fits are for one data set: ``run_many`` refuses them.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ...checks.errors import FitChecks, check_fit
from ...core.curvature_choice import StructureError, check_dense_memory
from ...core.starts import origin_point
from ...core.structure import hyper_sites
from ...core.trace import is_elementwise
from ...curvature import DenseCurvature, DiagonalCurvature, Gaussian
from ...families import get_family
from ...marginal.conditional import banded_inner_hessian, conditional_hessian
from ...marginal.laplace_marginal import scalar_blocks
from ...mode.hessian import DenseHessian, LowRankHessian
from ...posterior.marginals import finite_params, matched_params
from ...runtime.programs import program
from ...runtime.progress import progress
from ...runtime.random import host_generator
from ..joint_fit import FitOptions, constrained, initial_point, log_densities
from ..result import Result, verdict_draws
from .coordinates import Coordinates, nested_coordinates
from .field import FIELD_DRAWS, border_joins_hyper, field_weights, find_field
from .design import NestedDesign, integrate
from .blocks import block_shifts, collapsed_draws, collapsed_weights, find_blocks
from .inner import MarginalAtPoints, inner_program, model_loops
from .mixture import MixtureDraws, draw, mixture_block, mixture_moments, mixture_variances
from .search import COARSE_MODE_TOL, COARSE_STENCIL_SDS, ModeSearch, NonFiniteStart, explore

__all__ = ["NestedResult", "Coordinates", "nested_coordinates", "design_draws", "run_nested"]


def _match_diagonal(info, mean, var, block_index, block_cov, args, kwargs):
    """:func:`_match` for a mixture summarised by its variances and the event sites' covariance."""
    gaussian = Gaussian(mean, DiagonalCurvature(1.0 / var, block_index, block_cov))
    params = matched_params(info.layout, gaussian)
    return gaussian, params, finite_params(params), gaussian.curvature.positive()


def _match(info, mean, cov, args, kwargs):
    """The mixture's Gaussian in the basis and each site's matched family."""
    gaussian = Gaussian(mean, DenseCurvature.from_covariance(cov))
    params = matched_params(info.layout, gaussian)
    finite = finite_params(params)
    return gaussian, params, finite, gaussian.curvature.positive()


class NestedResult(Result):
    """A nested Laplace fit (:class:`~numpyro_lm.approximations.result.Result`): the design, its
    mixture's Gaussian in the basis and the matched families (``matched``: :func:`_match`'s), and
    the design's draws made so far (``design_draws``: ``{n: (flat, log q)}``, host arrays: taken
    by the first :meth:`draws` of that number)."""

    def __init__(self, info, args, kwargs, rng_key, hyper: list, design: NestedDesign, search: ModeSearch,
                 matched: tuple, num_samples: int, compiler_options, design_draws=None, blocks=None, field=None):
        super().__init__(info, args, kwargs, rng_key, num_samples, compiler_options)
        self.hyper, self.design, self.search, self.blocks, self.field = hyper, design, search, blocks, field
        self._gaussian, self._params, self._finite, self._positive = matched
        self._design_draws, self._log_q, self._block_distance = dict(design_draws or {}), {}, {}
        self._nonfinite = {}
        self.unreached = []  # reasons from beyond a lattice over every coordinate (.reach.unreached)

    @property
    def collapsed_weights(self) -> bool:
        return self.blocks is not None or self.field is not None

    @property
    def num_diagnostic_samples(self) -> int:
        """Draws behind the verdict: with scalar blocks :func:`collapsed_draws` (the first of
        get_samples' draws where there are fewer than ``num_samples``)."""
        if self.field is not None:
            return min(FIELD_DRAWS, super().num_diagnostic_samples)
        if self.blocks is None:
            return super().num_diagnostic_samples
        return collapsed_draws(self.info, super().num_diagnostic_samples)

    @property
    def gaussian(self):
        return self._gaussian

    @property
    def params(self):
        return self._params

    def _new_draws(self, num_samples: int):
        # the host draws go to the device once and are not kept (n x D float64: 0.8 GB at 10^5
        # coordinates); their density stays, for the weights
        made = self._design_draws.pop(num_samples, None)
        made = made or design_draws(self.design, self.info.layout, self.rng_key, num_samples)
        self._log_q[num_samples] = made._replace(flat=None)
        flat = made.flat if isinstance(made.flat, jax.Array) else jax.device_put(np.asarray(made.flat,
                                                                                          jnp.result_type(float)))
        return self.call(constrained, (self.info,), (flat,), points=num_samples), flat

    def draws(self, num_samples=None):
        # the verdict's draws are get_samples' first ones: where more were made with the fit,
        # those are taken first (not a second set from the mixture)
        n = self.num_samples if num_samples is None else num_samples
        if n not in self._draws:
            pending = [m for m in self._design_draws if m > n]
            if pending:
                super().draws(min(pending))
        return super().draws(num_samples)

    def _draws_made(self, num_samples: int) -> MixtureDraws:
        """The :class:`MixtureDraws` (less ``flat``) of the first ``num_samples`` draws."""
        if num_samples not in self._log_q:
            more = self._log_q[min(m for m in self._log_q if m > num_samples)]  # draws() sliced the flat ones
            self._log_q[num_samples] = MixtureDraws(None, lambda: more.log_q()[:num_samples], more.point[:num_samples],
                                                    more.offset[:num_samples], more.log_q_hyper[:num_samples],
                                                    more.mapped[:num_samples])
        return self._log_q[num_samples]

    def _new_weights(self, num_samples: int, flat):
        made = self._draws_made(num_samples)
        if self.field is not None:  # the field integrated out (.field)
            return field_weights(self.field, self.design, made, flat)
        if self.blocks is None:
            log_p = np.asarray(self.call(log_densities, (self.info,), (flat,), float64=True, points=num_samples))
            return log_p, np.asarray(made.log_q(), np.float64)
        # the blocks integrated out: weights of the hyperparameters and globals, whose spread
        # does not grow with the number of blocks (.blocks)
        log_p, log_q, self._block_distance[num_samples] = collapsed_weights(
            self.call, self.info, self.design, self.blocks, made, flat, num_samples)
        self._nonfinite[num_samples] = int(np.sum(~np.isfinite(log_p)))
        return log_p, log_q

    def structure_reasons(self, i: int) -> list:
        n = self.num_diagnostic_samples
        if self.blocks is None or not self._nonfinite.get(n):
            return list(self.unreached)
        return list(self.unreached) + [f"the density with the blocks integrated out is not finite at {self._nonfinite[n]} of {n} draws "
                "(a block's quadrature left the support): the draws of the hyperparameters and globals reach "
                "where the model is not defined"]

    def block_shifts(self) -> dict:
        """The blocks' sites' shifts (:func:`.blocks.block_shifts`), a field's (:class:`.field.Field`), or ``{}``."""
        if self.field is not None:
            return dict(self.field.shift)
        if self.blocks is None:
            return {}
        n = self.num_diagnostic_samples
        self.weights(n)
        return block_shifts(self.info.layout, self.design, self.blocks, self._block_distance[n])

    def verdict_condition(self):
        """A diagonal summary (large models: :class:`~numpyro_lm.curvature.DiagonalCurvature`) is
        never factorised but for its dense block: independent coordinates of very different scales
        (a slope's SD 6e-4 beside a random effect's 1: condition 2.4e6) lose no digit. Its
        block's correlation matrix's condition number (1 without one); others as the base class."""
        curvature = self.gaussian.curvature
        if not isinstance(curvature, DiagonalCurvature):
            return super().verdict_condition()
        if curvature.block_index is None or curvature.block_index.shape[-1] < 2:
            return np.ones(1)
        cov = np.asarray(jax.device_get(curvature.block_cov), np.float64)
        sd = np.sqrt(np.diagonal(cov))
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.linalg.eigvalsh(cov / np.outer(sd, sd))
            return np.atleast_1d(np.where(w[0] > 0, w[-1] / w[0], np.inf))

    def checks(self) -> FitChecks:
        finite, positive = jax.device_get((self._finite, self._positive))
        s = self.search
        return FitChecks(True, positive, {k: bool(v) for k, v in finite.items()}, True, s.num_iter, s.decrement,
                         s.grad_norm)

    def fit_diagnostics(self) -> dict:
        d, s = self.design, self.search
        return {
            "finite": True, "positive_definite": True, "num_iter": int(s.num_iter), "converged": True,
            "newton_decrement": float(s.decrement), "grad_norm": float(s.grad_norm),
            "log_density_at_mode": float(s.log_density), "refine": None, "hyper": self.hyper,
            "nested_design": d.kind, "nested_design_points": int(d.theta.shape[0]), "nested_edge_mass": d.edge_mass,
            "nested_outer_iter": d.num_outer_iter, "nested_inner_fits": d.num_evaluations,
        }

    def search_summary(self, d: dict) -> str:
        return (f"Nested Laplace over {d['hyper']}: {d['nested_design']} of {d['nested_design_points']} points "
                f"({d['nested_inner_fits']} inner fits; the marginal's mode search took {d['num_iter']} "
                f"iterations, last step {d['newton_decrement']:.1e} SDs).")


def design_draws(design: NestedDesign, layout, rng_key, num_samples: int) -> MixtureDraws:
    """The design mixture's draws (host; their ``log q`` a function, on request), the same for
    the same key and number."""
    return draw(host_generator(rng_key, stream=num_samples), design, layout, num_samples)


def run_nested(info, options: FitOptions, hyper, rng_key, args, kwargs, init_params=None, *, num_samples: int,
               compiler_options, progress_bar: bool = True) -> NestedResult:
    """The nested Laplace fit over the ``hyper`` sites (module docstring), checked."""
    layout = info.layout
    split = nested_coordinates(layout, hyper_sites(layout, hyper, info.parents))
    hyper_key = tuple(int(i) for i in split.theta_index)
    hessian = conditional_hessian(layout, hyper_key, options.curvature, options.plate)
    common = dict(num_samples=num_samples, compiler_options=compiler_options, progress_bar=progress_bar)
    # no plate's structure (dense, or the low-rank update the joint fit tries above ARROWHEAD_MIN_DIM
    # coordinates, whose rank grows with the observations): a Markov field's band?
    if isinstance(hessian, (DenseHessian, LowRankHessian)) and options.field_band:
        banded = banded_inner_hessian(info, hyper_key, origin_point(layout), args, kwargs)
        if banded is not None:
            joined, banded = border_joins_hyper(info, split, banded, args, kwargs) if banded.glob else (split, banded)
            # a band read with fewer probes (its zero diagonals) where the full band held; a
            # diagonal zero at both points it was read at, nonzero elsewhere, fails the check
            for band in (banded, banded._replace(offsets=())) if banded.offsets else (banded,):
                try:
                    return _nested_fit(info, options, joined, band, band, rng_key, args, kwargs, init_params,
                                       **common)
                except StructureError:
                    # the band held at the start but not at other hyperparameters (a field whitened
                    # by its prior's Cholesky factor, banded where rho = 0 alone): the dense Hessian
                    pass
    return _nested_fit(info, options, split, options.curvature, hessian, rng_key, args, kwargs, init_params, **common)


def _nested_fit(info, options: FitOptions, split: Coordinates, curvature, hessian, rng_key, args, kwargs, init_params,
                *, num_samples: int, compiler_options, progress_bar: bool) -> NestedResult:
    """:func:`run_nested` over the coordinates ``split`` with the inner fits' ``curvature`` and
    ``hessian`` strategy."""
    layout, dtype = info.layout, jnp.result_type(float)
    hyper_key = tuple(int(i) for i in split.theta_index)
    structured = not isinstance(hessian, DenseHessian)
    if not structured and options.curvature != "dense":
        check_dense_memory(layout, np.dtype(dtype).itemsize, "the nested fit's hyperparameters lie in the plate.")
    block_index = _event_columns(layout, split.theta_index) if structured else None  # refused before any fit
    loops = structured and model_loops(info, args, kwargs)  # a dense fit's points are cheap: lax.map
    inner, entries = inner_program(info, options.tolerance(dtype), options.max_iter, hyper_key,
                                   tuple(bool(c) for c in split.gaussian_cols), curvature, options.plate,
                                   args, kwargs, compiler_options, loops)
    bar = progress(progress_bar, desc="nested Laplace inner fits", unit="fit")
    marginal = MarginalAtPoints(inner, structured, layout, options, dtype, bar, args, kwargs,
                                () if entries is None else entries.ids, loops)
    with bar:
        search = _mode_search(marginal, info, options, split, rng_key, init_params, args, kwargs, compiler_options)
        # the globals' collapsed mode of scalar blocks costs two to three inner fits a point: at the
        # lattice's anchors alone, interpolated between them
        design = integrate(marginal, search, split.theta_index, split.x_index, split.gaussian_cols,
                           coarse=structured, batch=marginal.batch, interpolate=scalar_blocks(hessian))
    marginal.bar = progress(False)  # the field's verdict fits again, silently
    if design.edge_mass > 1e-3:
        warnings.warn(
            f"nested Laplace: {design.edge_mass:.1%} of the hyperparameters' mass lies on the edge of the "
            "integration design; the marginal reaches beyond the lattice's extent or inner fits failed there, "
            "and the tail beyond it is missing.",
            stacklevel=3,
        )
    # the verdict's draws (get_samples' are their first num_samples: one program to compile)
    n = verdict_draws(info, args, kwargs, num_samples)
    blocks = find_blocks(layout, hessian, split.x_index, split.gaussian_cols, entries) if structured else None
    field = None if blocks is not None else find_field(info, hessian, design, split.x_index, split.gaussian_cols,
                                                       marginal, args, kwargs, compiler_options)
    if blocks is not None:  # the verdict's draws are get_samples' first ones, or the other way round
        n = max(num_samples, collapsed_draws(info, n))
    elif field is not None:
        n = max(num_samples, min(FIELD_DRAWS, n))
    draws = {n: design_draws(design, layout, rng_key, n)}
    matched = _mixture_matched(info, design, split, block_index, draws[n], args, kwargs, compiler_options)
    result = NestedResult(info, args, kwargs, rng_key, split.hyper, design, search, matched, num_samples,
                          compiler_options, draws, blocks, field)
    check_fit(layout, result.checks(), result.gaussian.curvature)
    return result


def _mode_search(marginal: MarginalAtPoints, info, options, split: Coordinates, rng_key, init_params, args, kwargs,
                 compiler_options) -> ModeSearch:
    """The mode of the hyperparameters' Laplace marginal (:func:`~.search.explore`), from the basis
    origin, or from the init strategy's point where that is asked for or the origin lies outside
    the density's support (e.g. the sqrt basis)."""
    def start_point():
        point = program(initial_point, info, options, compiler_options=compiler_options)(
            (rng_key, init_params), args, kwargs)
        return np.asarray(point, np.float64)

    at_origin = options.init_strategy is None and init_params is None
    start = origin_point(info.layout) if at_origin else start_point()
    # large models' fits are structured and costly: a wider stencil and a looser stop
    steps = dict(one_at_a_time=marginal.batch == 1)
    if marginal.structured:
        steps.update(tol=COARSE_MODE_TOL, stencil_sds=COARSE_STENCIL_SDS)
    try:
        return explore(marginal, start[split.theta_index], start[split.x_index], **steps)
    except NonFiniteStart:
        if not at_origin:
            raise
        start = start_point()
        return explore(marginal, start[split.theta_index], start[split.x_index], **steps)


def _mixture_matched(info, design: NestedDesign, split: Coordinates, block_index, made: MixtureDraws, args, kwargs,
                     compiler_options):
    """The mixture's Gaussian in the basis and each site's matched family (:func:`_match`): the
    Gaussian-mixture moments for sites drawn from their conditional Gaussians, the draws' (``made``)
    where the draws went through each design point's matched family. ``block_index``: for a
    structured fit, the coordinates matched per event vector (:func:`_event_columns`), else ``None``."""
    size, mapped, dtype = info.layout.size, split.mapped, jnp.result_type(float)
    if block_index is not None:
        # large models: each coordinate's mean and variance (the matched families are
        # elementwise); the draws keep the mixture's correlations
        mean_all, var_all = mixture_variances(design, size)
        drawn = np.asarray(made.mapped, np.float64)  # flat[:, mapped], kept on the host
        mean_all[mapped] = drawn.mean(0)
        var_all[mapped] = drawn.var(0, ddof=1)
        position = np.full(size, -1)
        position[split.x_index] = np.arange(split.x_index.size)
        block_cov = mixture_block(design, position[block_index]) if block_index.size else np.zeros((0, 0))
        moments = (np.asarray(mean_all, dtype), np.asarray(var_all, dtype), block_index.astype(np.int32),
                   np.asarray(block_cov, dtype))
        return program(_match_diagonal, info, compiler_options=compiler_options)(moments, args, kwargs)
    flat = np.asarray(made.flat, np.float64)
    mean_all, cov_all = mixture_moments(design, size)
    mean_all[mapped] = flat[:, mapped].mean(0)
    cov_draws = np.cov(flat.T).reshape(size, size)
    cov_all[mapped, :] = cov_draws[mapped, :]
    cov_all[:, mapped] = cov_draws[:, mapped]
    # host arrays throughout: an eager jnp conversion compiles a program of its own
    return program(_match, info, compiler_options=compiler_options)(
        (np.asarray(mean_all, dtype), np.asarray(cov_all, dtype)), args, kwargs)


EVENT_BLOCK_MAX = 2000
"""Most coordinates of sites matched per event vector in a large nested fit (their joint covariance is dense)."""


def _event_columns(layout, theta_index) -> np.ndarray:
    """Flat coordinates of the sites a large nested fit matches per event vector (their
    covariance is kept dense: :class:`~numpyro_lm.curvature.DiagonalCurvature`'s block);
    refuses such sites among the hyperparameters, or too many of them."""
    hyper = set(int(i) for i in theta_index)
    cols = []
    for site in layout.sites:
        family = get_family(site.family, site.basis)
        if is_elementwise(site, family):
            continue
        if site.offset in hyper:
            raise ValueError(
                f"site {site.name!r}: a hyperparameter matched per event vector ({site.family!r}) is not supported "
                "by a nested fit with a structured (block-arrowhead) curvature. Leave it out of hyper=, or use "
                "strategy='laplace'.")
        cols.append(np.arange(site.offset, site.offset + site.size))
    cols = np.concatenate(cols) if cols else np.zeros(0, int)
    if cols.size > EVENT_BLOCK_MAX:
        raise ValueError(
            f"a nested fit with a structured curvature keeps a dense covariance over the sites matched per event "
            f"vector; this model has {cols.size} such coordinates (at most {EVENT_BLOCK_MAX}). Use "
            "strategy='laplace', or families={site: 'gaussian'} with an elementwise basis.")
    return cols
