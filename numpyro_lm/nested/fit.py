"""Running a nested Laplace fit: inner fits in compiled batches, the outer design on the host.

:func:`run_nested` splits the flat coordinates into the hyperparameters' and the rest,
compiles the inner step for a batch of points (:mod:`.inner`: conditional fits, mean shifts,
matched normalisers) once per model and shapes, searches the mode of the hyperparameters' Laplace
marginal (:mod:`.search`), lays the integration design around it (:mod:`.design`) and
matches each site's family to the mixture's moments (:mod:`.mixture`). No joint fit is
made. Nested fits are for one data set: ``run_many`` refuses them.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..curvature import DenseCurvature, DiagonalCurvature, Gaussian
from ..progress import progress
from ..families import get_family
from ..curvature_choice import StructureError, check_dense_memory, structure_message
from ..hessian import (ArrowheadHessian, PlateStructure, diagonal_structure, lowrank_hessian, plate_structure,
                       structure_tol)
from ..marginals import is_elementwise
from ..errors import FitChecks, check_fit
from ..fit import FitOptions, constrained, initial_point, log_densities, origin_point
from ..marginals import finite_params, matched_params
from ..programs import in_float64, program
from ..random import host_generator
from ..structure import hyperparameters
from ..result import Result
from .design import BATCH, MAX_CCD_DIM, NestedDesign, ccd_points, integrate
from .inner import (conditional_fit, matched_normaliser, mean_shift, point_params, quantile_sites, scalar_blocks,
                    site_values, structured_mean_shift)
from .mixture import draw, mixture_block, mixture_moments, mixture_variances
from .search import ModeSearch, NonFiniteStart, explore

__all__ = ["NestedResult", "hyper_sites", "run_nested"]


def hyper_sites(layout, hyper, parents=None, locations: bool = False) -> list:
    """The hyperparameter sites: the names given, or for ``"auto"`` the model's global scales
    and shapes. Candidates are the constrained sites (positive, interval, ... : not a
    real-valued location) of at most two coordinates each that lie outside every plate;
    of these, where the model's dependency structure ``parents`` is known
    (:attr:`~numpyro_lm.model.ModelInfo.parents`), those that set another latent site's
    prior or enter a likelihood with other latent coordinates
    (:func:`numpyro_lm.structure.hyperparameters`); at most ten coordinates in all, with
    at least one latent coordinate left for the conditional fits. Noise scales of a
    likelihood, prior scales of other latent sites (hierarchical or non-centred, with or
    without plates), kernel hyperparameters and shape parameters (degrees of freedom,
    concentrations) are such sites; locations and regression coefficients are left to the
    conditional Laplace step, where they are Gaussian given the hyperparameters in linear
    models. A Poisson rate that is the only parameter of its likelihood is not.
    ``locations=True`` admits real-valued sites too (a log-scale written on the real line,
    as Neal's funnel's ``y`` sets ``x ~ Normal(0, exp(y / 2))``): the auto-pilot's last
    rung where the joint fit failed.
    """
    names = [s.name for s in layout.sites]
    if hyper != "auto":
        unknown = [h for h in hyper if h not in names]
        if unknown:
            raise ValueError(f"hyper names {unknown}, which are not latent sites; the latent sites are {names}")
        return list(hyper)
    candidates = [s.name for s in layout.sites if not s.plates and s.size <= 2 and (locations or s.basis != "identity")]
    chosen = hyperparameters(parents, names, candidates)
    size = sum(layout.site(n).size for n in chosen)
    if not chosen or size > MAX_CCD_DIM or size == layout.size:
        raise ValueError(
            'hyper="auto" looks for global constrained sites of at most two coordinates each (scales, '
            "shapes) that set another latent site's prior or enter a likelihood with other latent sites, at "
            f"most {MAX_CCD_DIM} coordinates in all and not every latent site; it found {chosen} "
            f"({size} of {layout.size} coordinates) among the candidates {candidates}. Name them: hyper=[...]."
        )
    return chosen


def inner_hessian(layout, theta_index: tuple, curvature: str, plate=None):
    """The inner fits' Hessian strategy over the coordinates outside ``theta_index``: dense
    (``None``), or the plate's block-arrowhead structure with the hyperparameters taken out of
    its globals (``None`` where a hyperparameter lies inside the plate: the inner fits are then
    dense); for ``curvature="lowrank"`` that structure (each coordinate its own block where no
    plate gives one) under a low-rank update, unbound (:meth:`~numpyro_lm.hessian.LowRankHessian.bind`)."""
    if curvature == "dense":
        return None
    structure = plate_structure(layout, plate)
    hyper = np.asarray(theta_index, int)
    position = np.full(layout.size, -1)
    x_index = np.setdiff1d(np.arange(layout.size), hyper)
    position[x_index] = np.arange(x_index.size)
    if structure is None or np.any(position[structure.local_index] < 0):
        if curvature != "lowrank" or structure is not None:
            return None
        inner = diagonal_structure(x_index.size)
    else:
        glob = position[structure.global_index]
        inner = PlateStructure(structure.plate, position[structure.local_index].astype(np.int32),
                               glob[glob >= 0].astype(np.int32))
    if curvature == "lowrank":
        return lowrank_hessian(layout, inner, x_index.size)
    return ArrowheadHessian(inner)


def _inner(info, tol, max_iter, theta_index: tuple, gaussian_cols: tuple, curvature: str, plate, thetas, x0s,
           with_shift, args, kwargs):
    """The inner fits at a batch of points (the program :func:`run_nested` compiles)."""
    hessian = inner_hessian(info.layout, theta_index, curvature, plate)
    layout, theta_index, gaussian_cols = info.layout, np.asarray(theta_index), np.asarray(gaussian_cols, bool)

    def neg(theta, x):
        return -info.log_density(site_values(layout, theta_index, theta, x), args, kwargs)

    def at(theta):  # the strategy at theta (the low-rank update needs the prior there)
        if not hasattr(hessian, "bind"):
            return hessian
        return hessian.bind(lambda x: -info.log_prior(site_values(layout, theta_index, theta, x), args, kwargs))

    # one point after another (lax.map), not vmap: a point's fit compiles without the batching
    # transformation (a quarter less compile time of a nested fit, the same run time), and
    # each point's Newton iterations stop when it converges
    fits, curvature = lax.map(lambda tx: conditional_fit(neg, tx[0], tx[1], tol, max_iter, at(tx[0])), (thetas, x0s))
    shift = jnp.zeros_like(fits.x)
    if scalar_blocks(hessian):
        # the globals' shift enters the Laplace marginal too (structured_mean_shift); on the
        # design's points only (a 10^5-group fit's shifts cost as much as its inner fits): the
        # mode search centres the lattice without it, the lattice's weights carry it
        def shifts_and_gains():
            shift, gain = lax.map(lambda a: structured_mean_shift(neg, *a, at(a[0]), with_gain=True),
                                  (thetas, fits.x, curvature))
            return jnp.where(gaussian_cols, shift, 0.0), gain

        shift, gain = lax.cond(with_shift, shifts_and_gains, lambda: (shift, jnp.zeros_like(fits.log_density)))
        fits = fits._replace(log_density=fits.log_density + gain)
    elif np.any(gaussian_cols):  # only the design's points need it (not the mode search's)
        if hessian is None:
            def shifted(a):
                return mean_shift(neg, *a)
        else:
            def shifted(a):
                return structured_mean_shift(neg, *a, at(a[0]))
        shift = lax.cond(
            with_shift,
            lambda: jnp.where(gaussian_cols, lax.map(shifted, (thetas, fits.x, curvature)), 0.0),
            lambda: shift,
        )
    params = point_params(layout, theta_index, fits.x, fits.var)
    log_density = fits.log_density + matched_normaliser(
        layout, theta_index, fits.x, fits.precision_diagonal, fits.uncoupled, params
    )
    return fits._replace(log_density=log_density, params=params, shift=shift)


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
    """A nested Laplace fit (:class:`~numpyro_lm.result.Result`): the design and its mixture."""

    def __init__(self, info, args, kwargs, rng_key, hyper: list, design: NestedDesign, search: ModeSearch,
                 num_samples: int, compiler_options):
        super().__init__(info, args, kwargs, rng_key, num_samples, compiler_options)
        self.hyper, self.design, self.search = hyper, design, search
        self._gaussian = self._params = self._finite = self._positive = None
        self._log_q = {}

    def match(self, matched):
        """Set the mixture's Gaussian, the matched families and their checks (:func:`_match`)."""
        self._gaussian, self._params, self._finite, self._positive = matched

    @property
    def gaussian(self):
        return self._gaussian

    @property
    def params(self):
        return self._params

    def _new_draws(self, num_samples: int):
        rng = host_generator(self.rng_key, stream=num_samples)
        flat, self._log_q[num_samples] = draw(rng, self.design, self.info.layout, num_samples)
        flat = jax.device_put(np.asarray(flat, jnp.result_type(float)))  # no eager program to compile
        return self.call(constrained, (self.info,), (flat,), points=num_samples), flat

    def _new_weights(self, num_samples: int, flat):
        log_p = np.asarray(self.call(log_densities, (self.info,), (flat,), float64=True, points=num_samples))
        return log_p, np.asarray(self._log_q[num_samples](), np.float64)

    def checks(self) -> FitChecks:
        finite, positive = jax.device_get((self._finite, self._positive))
        s = self.search
        return FitChecks(True, positive, {k: bool(v) for k, v in finite.items()}, True, s.num_iter, s.decrement,
                         s.grad_norm)

    def _fit_diagnostics(self) -> dict:
        d, s = self.design, self.search
        return {
            "finite": True, "positive_definite": True, "num_iter": int(s.num_iter), "converged": True, "newton_decrement": float(s.decrement),
            "grad_norm": float(s.grad_norm), "log_density_at_mode": float(s.log_density), "refine": None,
            "hyper": self.hyper, "nested_design": d.kind, "nested_design_points": int(d.theta.shape[0]),
            "nested_edge_mass": d.edge_mass, "nested_outer_iter": d.num_outer_iter,
            "nested_inner_fits": d.num_evaluations,
        }

    def _search_summary(self, d: dict) -> str:
        return (f"Nested Laplace over {d['hyper']}: {d['nested_design']} of {d['nested_design_points']} points "
                f"({d['nested_inner_fits']} inner fits; the marginal's mode search took {d['num_iter']} "
                f"iterations, last step {d['newton_decrement']:.1e} SDs).")


def run_nested(info, options: FitOptions, hyper, rng_key, args, kwargs, init_params=None, *, num_samples: int,
               compiler_options, progress_bar: bool = True) -> NestedResult:
    """The nested Laplace fit over the ``hyper`` sites (module docstring), checked."""
    layout = info.layout
    hyper = hyper_sites(layout, hyper, info.parents)
    coords = {s.name: np.arange(s.offset, s.offset + s.size) for s in layout.sites}
    theta_index = np.concatenate([coords[s.name] for s in layout.sites if s.name in hyper])
    x_index = np.concatenate([coords[s.name] for s in layout.sites if s.name not in hyper] or [np.zeros(0, int)])
    if x_index.size == 0:
        raise ValueError("hyper= names every latent site: nothing is left for the conditional Laplace step")
    if theta_index.size > MAX_CCD_DIM:
        ccd_points(theta_index.size)  # refuses, naming the limit
    dtype, size = jnp.result_type(float), layout.size
    # coordinates drawn through each point's matched family (quantile sites); the others
    # come from their conditional Gaussians and get a conditional mean (mean_shift)
    mapped = np.zeros(size, bool)
    for site, _ in quantile_sites(layout, theta_index):
        mapped[site.offset : site.offset + site.size] = True
    gaussian_cols = ~mapped[x_index]

    def run(fn, *static):
        return program(fn, *static, compiler_options=compiler_options)

    hyper_key = tuple(int(i) for i in theta_index)
    structured = inner_hessian(layout, hyper_key, options.curvature, options.plate) is not None
    if not structured and options.curvature != "dense":
        check_dense_memory(layout, np.dtype(dtype).itemsize, "the nested fit's hyperparameters lie in the plate.")
    block_index = _event_columns(layout, theta_index) if structured else None
    inner = run(_inner, info, options.tolerance(dtype), options.max_iter, hyper_key,
                tuple(bool(c) for c in gaussian_cols), options.curvature, options.plate)
    bar = progress(progress_bar, desc="nested Laplace inner fits", unit="fit")
    # inner fits per compiled call: padding a batch costs whole fits, which large models
    # cannot spare; small ones share one compilation between stencil, line search and design
    batch = 1 if structured else BATCH

    def marginal(thetas, x0s, with_shift=False):
        # fixed-size batches: one compilation serves the stencil, the line search and the
        # design; padding and gathering on the host (eager JAX slicing costs more than the fit)
        bar.update(len(thetas))
        n, pad = len(thetas), -len(thetas) % batch
        arrays = [np.asarray(a, dtype) for a in (thetas, x0s)]
        arrays = [np.concatenate([a, np.broadcast_to(a[:1], (pad,) + a.shape[1:])]) for a in arrays]
        flag = np.asarray(with_shift)
        parts = [call((arrays[0][i : i + batch], arrays[1][i : i + batch], flag)) for i in range(0, n + pad, batch)]
        fits = jax.tree.map(lambda *a: np.concatenate(a)[:n], *parts)
        if structured:
            _check_structure(layout, options, fits.structure_error, dtype)
        return fits

    marginal.batch, marginal.coarse = batch, structured

    def call(arrays):
        if structured:
            # a large model's Laplace marginal is a difference of sums of 10^5-10^6 terms, below
            # float32's resolution (an ulp of 1e6 is 0.06); and a regression with more coefficients
            # than data, at a small noise scale, has a curvature of condition 10^6 and more (a
            # p = 10^4 Student-t regression's inner fits failed in float32 below sigma = 0.03):
            # the inner fits run in float64
            return in_float64(inner, arrays, args, kwargs)
        return jax.device_get(inner(arrays, args, kwargs))

    def start_point():
        point = run(initial_point, info, options)((rng_key, init_params), args, kwargs)
        return np.asarray(point, np.float64)

    at_origin = options.init_strategy is None and init_params is None
    with bar:
        start = origin_point(layout) if at_origin else start_point()
        try:
            search = explore(marginal, start[theta_index], start[x_index])
        except NonFiniteStart:
            if not at_origin:
                raise
            # the basis origin lies outside the density's support (e.g. the sqrt basis)
            start = start_point()
            search = explore(marginal, start[theta_index], start[x_index])
        design = integrate(marginal, search, theta_index, x_index, gaussian_cols)
    if design.edge_mass > 1e-3:
        warnings.warn(
            f"nested Laplace: {design.edge_mass:.1%} of the hyperparameters' mass lies on the edge of the "
            "integration design; the marginal reaches beyond the lattice's extent or inner fits failed there, "
            "and the tail beyond it is missing.",
            stacklevel=3,
        )
    # the mixture's mean and covariance in the basis: the Gaussian-mixture moments for sites
    # drawn from their conditional Gaussians, the draws' moments where the draws went
    # through each design point's matched family
    result = NestedResult(info, args, kwargs, rng_key, hyper, design, search, num_samples, compiler_options)
    # the verdict's draws (get_samples' are their first num_samples: one program to compile)
    flat = np.asarray(result.draws(result.num_diagnostic_samples)[1], np.float64)
    if structured:
        # large models: each coordinate's mean and variance (the matched families are
        # elementwise); the draws keep the mixture's correlations
        mean_all, var_all = mixture_variances(design, size)
        mean_all[mapped] = flat[:, mapped].mean(0)
        var_all[mapped] = flat[:, mapped].var(0, ddof=1)
        position = np.full(size, -1)
        position[x_index] = np.arange(x_index.size)
        block_cov = mixture_block(design, position[block_index]) if block_index.size else np.zeros((0, 0))
        moments = (np.asarray(mean_all, dtype), np.asarray(var_all, dtype), block_index.astype(np.int32),
                   np.asarray(block_cov, dtype))
        result.match(run(_match_diagonal, info)(moments, args, kwargs))
    else:
        mean_all, cov_all = mixture_moments(design, size)
        mean_all[mapped] = flat[:, mapped].mean(0)
        cov_draws = np.cov(flat.T).reshape(size, size)
        cov_all[mapped, :] = cov_draws[mapped, :]
        cov_all[:, mapped] = cov_draws[:, mapped]
        # host arrays throughout: an eager jnp conversion compiles a program of its own
        result.match(run(_match, info)((np.asarray(mean_all, dtype), np.asarray(cov_all, dtype)), args, kwargs))
    check_fit(layout, result.checks(), result.gaussian.curvature)
    return result


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


def _check_structure(layout, options, errors, dtype):
    """Refuse inner fits whose structure did not hold (:mod:`numpyro_lm.hessian`)."""
    errors = np.asarray(errors)
    dtype = errors.dtype if np.issubdtype(errors.dtype, np.floating) else dtype  # the inner fits' (float64)
    worst = float(np.nanmax(errors.astype(np.float64), initial=0.0))
    if worst > structure_tol(dtype):
        raise StructureError(structure_message(layout, options.plate, worst, dtype, options.curvature))
