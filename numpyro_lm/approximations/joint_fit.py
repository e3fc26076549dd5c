r"""The joint Laplace Matching fit of a model: pure functions of a :class:`~numpyro_lm.core.model.ModelInfo`.

One data set's pipeline, each step a pure function that :func:`numpyro_lm.runtime.programs.program`
compiles (and vmaps over data sets for ``run_many``):

1. :func:`start`: the initial point (the basis origin, or a numpyro init strategy's point)
   and the Newton mode search up to ``until`` evaluations; :func:`resume` continues it
   (a chunk at a time, for a progress bar);
2. :func:`finish`: the :class:`~numpyro_lm.mode.laplace_state.LaplaceState` at the mode, the MVI
   refinement if asked (:mod:`numpyro_lm.posterior.refine`), each site's matched family
   (:func:`numpyro_lm.posterior.marginals.matched_params`): a :class:`JointFit`;
3. :func:`draw`: joint draws through the Gaussian copula (:mod:`numpyro_lm.posterior.copula`),
   mapped to the model's sites; :func:`weigh`: ``log p`` and ``log q`` of draws, for PSIS.

:func:`fit` runs 1 and 2 in one program (the common case: the search converges within the
first chunk); the draws are a program of their own, which every Gaussian of the same shapes
reuses (the PSIS candidate's). Keys: the init strategy uses ``fold_in(key, 0)``, the
draws ``fold_in(key, 1)``, the refinement ``fold_in(key, 2)``.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import jaxprs_in_params
from numpyro.infer.initialization import init_to_uniform, init_to_value

from ..core.curvature_choice import hessian_for
from ..core.model import ModelInfo
from ..core.starts import origin_point, spread_mask, spread_points
from ..curvature import Gaussian
from ..mode.laplace_state import LaplaceState, laplace_finish, laplace_init, laplace_update
from ..mode.newton import NewtonState, default_tol, newton_many
from ..posterior.copula import copula_draws, copula_log_density
from ..posterior.marginals import finite_params, matched_params
from ..posterior.refine import Refinement, refine
from ..runtime.programs import merge_inputs

__all__ = ["FitOptions", "Starts", "JointFit", "initial_point", "start", "resume", "finish", "polish", "refine_fit", "matched_fit", "fit", "fit_many", "draw", "weigh", "log_densities", "constrained", "map_rows", "largest_intermediate", "ROW_BUDGET",
           "CPU_ROW_NUMBERS", "rows_at_once", "runs_loops", "row_profile"]


class FitOptions(NamedTuple):
    """The options of a joint fit (hashable: they key compiled programs)."""

    method: str = "newton"  # "newton" or "lbfgs" (an L-BFGS warm start)
    tol: Optional[float] = None  # Newton decrement, posterior SDs (None: default_tol)
    max_iter: int = 200
    regularize: Optional[float] = None
    refine: Optional[str] = None
    refine_num_samples: Optional[int] = None  # None: the method's default (refine.DADVI_DRAWS / MVI_DRAWS)
    refine_max_iter: int = 200
    init_strategy: Optional[Callable] = None  # None: the basis origin, else init_to_uniform
    num_starts: int = 1  # mode searches: from the initial point and num_starts - 1 spread_points
    curvature: str = "dense"  # "dense" or "arrowhead" (numpyro_lm.mode.hessian)
    plate: Optional[str] = None  # the arrowhead's plate (None: the largest, hessian.plate_structure)
    field_band: bool = False  # curvature chosen automatically: a nested fit may find its field's band

    def tolerance(self, dtype) -> float:
        return default_tol(dtype) if self.tol is None else self.tol


class Starts(NamedTuple):
    r"""Where the mode searches of a multi-start fit ended (one row per start; the first
    started at the initial point): point, log density, converged, positive definite
    curvature, and half the log-determinant of the curvature (for the Laplace mass
    :math:`\log p(y^*) - \tfrac12\log\det H`)."""

    x: jnp.ndarray
    log_density: jnp.ndarray
    converged: jnp.ndarray
    positive: jnp.ndarray
    half_logdet: jnp.ndarray


class JointFit(NamedTuple):
    """A joint fit (device arrays): the Laplace state (refined if asked), the matched
    families' parameters, the refinement's record, and which sites' parameters are finite."""

    state: LaplaceState
    params: dict
    refinement: Optional[Refinement]
    finite_params: dict

    @property
    def gaussian(self) -> Gaussian:
        return self.state.gaussian


def _log_density(info: ModelInfo, args, kwargs):
    return partial(info.log_density, args=args, kwargs=kwargs)


def _hessian(info: ModelInfo, options: FitOptions, args, kwargs):
    """The fit's Hessian strategy (:func:`numpyro_lm.core.curvature_choice.hessian_for`), bound to the
    model's prior at these arguments where it needs it (the low-rank update)."""
    hessian = hessian_for(info.layout, options.curvature, options.plate, by_site=True)
    return hessian.bind(lambda x: -info.log_prior(x, args, kwargs))


def initial_point(info: ModelInfo, options: FitOptions, rng_key, init_params, args, kwargs):
    """Basis coordinates of ``init_params`` (constrained values), else of the init strategy's
    point (``init_to_uniform`` by default)."""
    strategy = options.init_strategy or init_to_uniform
    if init_params is not None:
        strategy = init_to_value(values=init_params)
    return info.init(jax.random.fold_in(rng_key, 0), args, kwargs, strategy)


def _origin_start(info: ModelInfo, options: FitOptions) -> np.ndarray:
    """The first search's start: the basis origin itself where other searches follow (the
    multi-start of small models: exact where the origin is the mode, as for symmetric
    conjugate models), else :func:`~numpyro_lm.core.starts.origin_point`."""
    return np.zeros(info.size) if options.num_starts > 1 else origin_point(info.layout)


def start(info: ModelInfo, options: FitOptions, at_origin: bool, until: int, rng_key, init_params, args,
          kwargs):
    """The mode search from the initial point up to ``until`` Newton evaluations:
    ``(NewtonState, Starts or None)``. With ``options.num_starts > 1`` the searches from
    starting points (:func:`~numpyro_lm.core.starts.spread_points`) run one after another in the program and the
    state of the highest log density is kept; :class:`Starts` records where each ended.

    ``at_origin``: start at or next to the basis origin (:func:`_origin_start`: no model
    trace, no PRNG program to compile);
    else at :func:`initial_point`.
    """
    dtype = jnp.result_type(float)
    if at_origin:
        x0 = jnp.asarray(_origin_start(info, options), dtype)
    else:
        x0 = initial_point(info, options, rng_key, init_params, args, kwargs)
    log_density = _log_density(info, args, kwargs)
    tol = options.tolerance(dtype)
    hessian = _hessian(info, options, args, kwargs)

    def search(x):
        state = laplace_init(log_density, x, method=options.method, tol=tol, max_iter=options.max_iter,
                             hessian=hessian)
        return laplace_update(log_density, state, tol=tol, max_iter=until, hessian=hessian)

    if options.num_starts <= 1:
        return search(x0), None
    # more starting points spread over (-2, 2) in the basis (spread_points: constants, no PRNG
    # program to compile), searched one after another (lax.map, not vmap: compiled like a
    # single search, and each stops when it converges); the highest density reached is kept
    others = jnp.asarray(spread_points(options.num_starts - 1, info.size), dtype)
    others = jnp.where(spread_mask(info.layout), others, x0)  # two-to-one bases stay at x0
    states = lax.map(search, jnp.concatenate([x0[None], others]))
    value = jnp.where(jnp.isfinite(states.value), states.value, jnp.inf)
    best = jnp.argmin(value)
    starts = Starts(states.x, -states.value, states.converged, states.positive, hessian.half_logdet(states.chol))
    return jax.tree.map(lambda a: a[best], states), starts


def resume(info: ModelInfo, options: FitOptions, chunk: int, state: NewtonState, args, kwargs) -> NewtonState:
    """Continue the mode search for up to ``chunk`` more Newton evaluations (``max_iter`` in all)."""
    until = jnp.minimum(state.num_iter + chunk, options.max_iter)
    return laplace_update(_log_density(info, args, kwargs), state, tol=options.tolerance(state.x.dtype),
                          max_iter=until, hessian=_hessian(info, options, args, kwargs))


def finish(info: ModelInfo, options: FitOptions, state: NewtonState, rng_key, args, kwargs) -> JointFit:
    """The Laplace state at the mode, refined if asked, and each site's matched family."""
    laplace_state = laplace_finish(state, regularize=options.regularize, hessian=_hessian(info, options, args, kwargs))
    return refine_fit(info, options, laplace_state, rng_key, args, kwargs)


def polish(info: ModelInfo, options: FitOptions, x, rng_key, args, kwargs) -> JointFit:
    """:func:`finish` from Newton's search started at ``x``, a mode found in another precision:
    its first evaluation recomputes the value, gradient and Hessian in this program's, and one
    or two steps reach its own tolerance (the float64 retry of a float32 fit whose curvature
    float32 did not resolve: :func:`numpyro_lm.approximations.joint.run`)."""
    dtype = jnp.result_type(float)
    log_density, hessian, tol = _log_density(info, args, kwargs), _hessian(info, options, args, kwargs), \
        options.tolerance(dtype)
    state = laplace_init(log_density, jnp.asarray(x, dtype), tol=tol, max_iter=options.max_iter, hessian=hessian)
    state = laplace_update(log_density, state, tol=tol, max_iter=options.max_iter, hessian=hessian)
    return finish(info, options, state, rng_key, args, kwargs)


def refine_fit(info: ModelInfo, options: FitOptions, laplace_state: LaplaceState, rng_key, args,
               kwargs) -> JointFit:
    """A Laplace state refined as ``options.refine`` asks (none: as it is), and each site's
    matched family (the auto-pilot refines a finished fit this way, without a new search)."""
    refinement = None
    if options.refine is not None:
        laplace_state, refinement = refine(
            _log_density(info, args, kwargs), laplace_state, options.refine, jax.random.fold_in(rng_key, 2),
            num_samples=options.refine_num_samples, max_iter=options.refine_max_iter,
            gtol=jnp.sqrt(options.tolerance(laplace_state.mode.dtype)), tol=options.tolerance(laplace_state.mode.dtype),
        )
    return matched_fit(info, laplace_state, refinement)


def matched_fit(info: ModelInfo, laplace_state: LaplaceState, refinement: Optional[Refinement] = None) -> JointFit:
    """A :class:`JointFit` of ``laplace_state``: each site's matched family and whether its parameters are finite."""
    params = matched_params(info.layout, laplace_state.gaussian)
    return JointFit(laplace_state, params, refinement, finite_params(params))


def fit(info: ModelInfo, options: FitOptions, at_origin: bool, until: int, rng_key, init_params, args, kwargs):
    """:func:`start` then :func:`finish`: ``(NewtonState, JointFit, Starts or None)`` in one
    program (the fit is final when the search converged or stalled within ``until`` evaluations)."""
    state, starts = start(info, options, at_origin, until, rng_key, init_params, args, kwargs)
    return state, finish(info, options, state, rng_key, args, kwargs), starts


def fit_many(info: ModelInfo, options: FitOptions, at_origin: bool, block: int, axes: tuple, input_key,
             inputs, rng_keys, init_params):
    """:func:`fit` for a batch of data sets in one program (``program(..., vectorized=True)``).

    ``inputs``: the array leaves of the model's arguments, batched where ``axes`` says. The
    mode searches run as :func:`~numpyro_lm.mode.newton.newton_many`: the stragglers of the
    batch continue gathered into a block of ``block`` entries, so the batch costs about its
    median search, not its slowest. Returns ``(NewtonState, JointFit)``, both batched.
    """
    shared = [x for x, b in zip(inputs, axes) if not b]

    def arguments(batched):
        batched, others = iter(batched), iter(shared)
        return merge_inputs([next(batched) if b else next(others) for b in axes], input_key)

    data = [x for x, b in zip(inputs, axes) if b]
    dtype = jnp.result_type(float)
    tol = options.tolerance(dtype)

    def begin(key, params, d):
        args, kwargs = arguments(d)
        x0 = (jnp.asarray(_origin_start(info, options), dtype) if at_origin
              else initial_point(info, options, key, params, args, kwargs))
        return laplace_init(_log_density(info, args, kwargs), x0, method=options.method, tol=tol,
                            max_iter=options.max_iter, hessian=_hessian(info, options, args, kwargs))

    state = jax.vmap(begin)(rng_keys, init_params, data)
    state = newton_many(lambda x, d: -info.log_density(x, *arguments(d)), state, data, tol, options.max_iter, block,
                        hessian_for(info.layout, options.curvature, options.plate, by_site=True))
    fitted = jax.vmap(lambda s, key, d: finish(info, options, s, key, *arguments(d)))(state, rng_keys, data)
    return state, fitted


ROW_BUDGET = 2**24
"""Numbers per intermediate array when the model runs on many rows at once (draws, weights):
rows are vmapped in chunks of ``ROW_BUDGET // (numbers in one row's largest array)`` so that a
model with 10^6 observations does not hold 4000 copies of them (128 MiB per array in float64),
nor a latent GP 4000 copies of its n x n kernel matrix."""


def largest_intermediate(fn, row) -> int:
    """Numbers in the largest array ``fn(row)`` computes (its jaxpr's outputs, sub-programs
    included): a GP's kernel matrix, where the model's data and latent values are small."""
    return row_profile(fn, row)[0]


def runs_loops(fn, row) -> bool:
    """Whether ``fn(row)`` runs a loop (``scan``, ``while``: a Markov chain written with ``scan``)."""
    return row_profile(fn, row)[1]


def row_profile(fn, row):
    """``(largest array's numbers, whether it loops)`` of ``fn``'s jaxpr at ``row``'s shape: one trace
    for :func:`largest_intermediate` and :func:`runs_loops`."""

    def walk(jaxpr):
        size, loops = 1, False
        for eqn in jaxpr.eqns:
            loops = loops or eqn.primitive.name in ("scan", "while")
            for var in eqn.outvars:
                size = max(size, int(np.prod(getattr(var.aval, "shape", ()))))
            for sub in jaxprs_in_params(eqn.params):
                sub_size, sub_loops = walk(sub)
                size, loops = max(size, sub_size), loops or sub_loops
        return size, loops

    return walk(jax.make_jaxpr(fn)(jax.ShapeDtypeStruct(row.shape, row.dtype)).jaxpr)


CPU_ROW_NUMBERS = 2**17
"""On a CPU, numbers (latent and observed) of the rows evaluated at once: 0.5 MiB of float32 per
array, about a core's cache. Vmapping more runs slower, not faster: each of the model's
operations then streams rows x D numbers through memory. The gradient of the Poisson
random-effect model (N = 5 000, 10^4 numbers a row), microseconds per row at 1 / 4 / 16 / 64 /
400 rows at once: 41 / 38 / 39 / 51 / 97; at N = 25 000: 221 / 197 / 202 / 284 / 467. The
verdict's 4000 log densities of a Student-t regression with 5000 observations: 0.33 s all at
once, 0.14 s so; with 200 observations (500 rows at once) as fast as before. An accelerator
runs whole batches (:data:`ROW_BUDGET`), and so does a CPU where the model runs a loop
(:func:`runs_loops`): each step of a ``scan`` costs a fixed time per operation, whatever the rows,
so fewer, wider steps win (an AR(1) trend over 200 steps, 4000 log densities in float64: 0.22 s
in chunks of 250 rows, 0.018 s all at once)."""


def rows_at_once(per_row: int, n: int, loops: bool = False) -> int:
    """Rows of ``n`` to evaluate at once (vmapped) where one row holds ``per_row`` numbers in its
    largest array: :data:`ROW_BUDGET` numbers on an accelerator or where the rows run ``loops``,
    :data:`CPU_ROW_NUMBERS` on a CPU otherwise; a divisor of ``n`` where one is at least half that (``lax.map`` compiles a remainder
    apart: a second copy of the model in the program)."""
    rows = max(1, ROW_BUDGET // per_row)
    if jax.default_backend() == "cpu" and not loops:
        rows = min(rows, max(1, CPU_ROW_NUMBERS // per_row))
    rows = min(rows, n)
    return next((r for r in range(rows, (rows - 1) // 2, -1) if n % r == 0), rows)


def map_rows(info: ModelInfo, fn, flat):
    """``fn`` over the rows of ``flat (n, D)``: vmapped, in chunks (:func:`rows_at_once`)."""
    largest, loops = row_profile(fn, flat[0])
    rows = rows_at_once(max(info.layout.observed_size + info.size + 1, largest), flat.shape[0], loops)
    if rows >= flat.shape[0]:
        return jax.vmap(fn)(flat)
    return lax.map(fn, flat, batch_size=rows)


def constrained(info: ModelInfo, flat, args, kwargs) -> dict:
    """The model's latent and deterministic sites at each row of ``flat (n, D)``."""
    return map_rows(info, lambda y: info.constrain(y, args, kwargs), flat)


def log_densities(info: ModelInfo, flat, args, kwargs):
    """``log p`` (LM basis) at each row of ``flat (n, D)``."""
    return map_rows(info, lambda y: info.log_density(y, args, kwargs), flat)


def draw(info: ModelInfo, num_samples: int, rng_key, gaussian: Gaussian, params, args, kwargs):
    """``(samples, flat)``: ``num_samples`` copula draws, as sites and in basis coordinates."""
    flat = copula_draws(jax.random.fold_in(rng_key, 1), gaussian, info.layout, params, num_samples)
    return constrained(info, flat, args, kwargs), flat


def weigh(info: ModelInfo, draw_dtype: str, rng_key, gaussian: Gaussian, params, flat, args, kwargs):
    """``(log p, log q)`` of the draws :func:`draw` made with ``rng_key`` in ``draw_dtype``
    (basis coordinates); run in float64 for weights free of float32 round-off."""
    log_q = copula_log_density(flat, jax.random.fold_in(rng_key, 1), gaussian, info.layout, params, draw_dtype)
    return log_densities(info, flat, args, kwargs), log_q
