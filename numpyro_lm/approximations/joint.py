"""Running the joint fit: compiled programs, the chunked mode search, the checks.

:func:`run_joint` drives the pure pipeline of :mod:`numpyro_lm.approximations.joint_fit` for one data set or a
batch: one compiled program for the common case (the search converges within the first
chunk of Newton evaluations), further chunks with a progress bar when it does not, a
restart from the init strategy where the basis origin lies outside the density's support.
The flags of the fit become the package's errors (:mod:`numpyro_lm.checks.errors`) before any
result is handed back, so a failed call leaves the caller's state as it was.
"""

from __future__ import annotations

import warnings
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..checks.covariance import failure_cause
from ..checks.boundary import boundary_hyperparameters, boundary_message
from ..checks.errors import (FitChecks, NotPositiveDefiniteError, check_fit, clearly_negative, convergence_warning,
                             fit_error)
from ..checks.verdict import distinct_modes
from ..core.curvature_choice import StructureError, structure_message
from ..curvature import DenseCurvature
from ..curvature.base import PEAKED
from ..mode.hessian import structure_tol
from ..mode.newton import running
from ..runtime.batch import Batch, pad, take, take_inputs
from ..runtime.programs import in_float64, program
from ..runtime.progress import progress
from . import joint_fit
from .joint_fit import FitOptions, JointFit
from .result import Result

__all__ = ["JointResult", "run_joint"]

# Newton evaluations per compiled call of one fit: a progress bar moves between calls
CHUNK = 25


class JointResult(Result):
    """A joint fit (:class:`~numpyro_lm.approximations.result.Result`): the Laplace state and matched families."""

    def __init__(self, info, options: FitOptions, args, kwargs, rng_key, keys, fit: JointFit, num_samples: int,
                 compiler_options, batch: Optional[Batch] = None, starts=None):
        super().__init__(info, args, kwargs, rng_key, num_samples, compiler_options, batch)
        self.options, self.keys, self.fit = options, keys, fit
        self.starts = starts  # where a multi-start fit's searches ended (joint_fit.Starts, host arrays), or None

    @property
    def gaussian(self):
        return self.fit.gaussian

    @property
    def params(self):
        return self.fit.params

    @property
    def state(self):
        return self.fit.state

    def structure_reasons(self, i: int) -> list:
        """Distinct modes of comparable mass among the multi-start searches (module verdict);
        hyperparameters at the boundary of their space (:mod:`numpyro_lm.checks.boundary`)."""
        reasons = []
        if self.batch is None:
            found = boundary_hyperparameters(self.info, self.state.mode, self.args, self.kwargs)
            if found:
                reasons.append(boundary_message(found))
        if self.starts is None:
            return reasons
        mode, variance = jax.device_get((self.state.mode, self.gaussian.curvature.variance()))
        return reasons + distinct_modes(self.starts, np.asarray(mode), np.sqrt(np.asarray(variance)), self.info.layout)

    def _new_draws(self, num_samples: int):
        return self.call(joint_fit.draw, (self.info, num_samples), (self.keys, self.gaussian, self.params),
                         host_callbacks=True, points=num_samples)

    def _new_weights(self, num_samples: int, flat):
        # float64 weights of the draws, whose normals are regenerated in the draws' precision
        return self.call(joint_fit.weigh, (self.info, str(flat.dtype)), (self.keys, self.gaussian, self.params, flat),
                         float64=True, points=num_samples)

    def flags(self, fetched=None):
        """``(LaplaceInfo, {site: finite params})`` as host arrays with one entry per data set
        (``fetched``: the same already on the host, padding included)."""
        if fetched is None:
            fetched = jax.device_get((self.state.info, self.fit.finite_params))
        rows = 1 if self.batch is None else self.batch.size
        return jax.tree.map(lambda a: np.reshape(np.asarray(a), (rows,)), self.unpad(fetched))

    def checks(self, fetched=None, rows=None) -> list:
        """:class:`~numpyro_lm.checks.errors.FitChecks` of the data sets ``rows`` (default all)."""
        info, finite = self.flags(fetched)
        rows = range(info.finite.shape[0]) if rows is None else rows
        return [FitChecks(info.finite[i], info.positive[i], {k: bool(v[i]) for k, v in finite.items()},
                          info.converged[i], info.num_iter[i], info.decrement[i], info.grad_norm[i])
                for i in rows]

    def fit_diagnostics(self) -> dict:
        info, log_density = jax.device_get(self.unpad((self.state.info, self.state.log_density)))
        one = self.batch is None

        def out(a, kind):
            return kind(a) if one else np.asarray(a)

        finite = np.all([np.asarray(v) for v in jax.device_get(self.unpad(self.fit.finite_params)).values()], axis=0)
        d = {
            "finite": out(np.asarray(info.finite) & finite, bool),
            "positive_definite": out(info.positive, bool),
            "num_iter": out(info.num_iter, int),
            "converged": out(info.converged, bool),
            "newton_decrement": out(info.decrement, float),
            "grad_norm": out(info.grad_norm, float),
            "log_density_at_mode": out(log_density, float),
            "refine": self.options.refine,
            "hyper": None,
        }
        r = self.fit.refinement
        if r is not None:
            r = jax.device_get(self.unpad(r))
            d.update(refine_elbo_before=out(r.elbo_before, float), refine_elbo_after=out(r.elbo_after, float),
                     refine_num_iter=out(r.num_iter, int), refine_grad_norm=out(r.grad_norm, float))
        return d

    def search_summary(self, d: dict) -> str:
        if self.batch is not None:
            converged = np.asarray(d["converged"])
            return (f"Mode search: {int(converged.sum())} of {converged.size} converged, "
                    f"{int(np.max(d['num_iter']))} iterations at most.")
        return (f"Mode search: {d['num_iter']} iterations, {'converged' if d['converged'] else 'NOT converged'} "
                f"(last step {d['newton_decrement']:.1e} posterior SDs, max |grad| {d['grad_norm']:.1e}).")


def _select(flags, first, second):
    """Per data set: ``first`` where ``flags``, else ``second`` (flags broadcast over each leaf)."""
    def pick(a, b):
        f = jnp.reshape(flags, flags.shape + (1,) * (jnp.ndim(a) - flags.ndim))
        return jnp.where(f, a, b)

    return jax.tree.map(pick, first, second)


def run_joint(info, options: FitOptions, rng_key, args, kwargs, init_params=None, *, num_samples: int,
              compiler_options, progress_bar: bool = True, batch: Optional[Batch] = None,
              on_failure: str = "raise") -> JointResult:
    """Fit one data set (``batch=None``) or a batch (arguments already padded); check; return.

    ``on_failure`` (batches only): ``"raise"`` the first failed data set's error, or
    ``"warn"`` and keep the others (the failed ones' results are not finite).
    """
    axes = mesh = None
    keys = rng_key
    if batch is not None:
        axes, mesh = batch.axes, batch.mesh
        # one key per data set of the whole batch, whichever process fits it (runtime.distributed)
        keys = program(_split_keys, batch.whole or batch.size, compiler_options=compiler_options)((rng_key,))
        keys = pad(keys if batch.whole is None else keys[batch.offset:batch.offset + batch.size], batch)

    def prog(fn, *static, vectorized=False):
        return program(fn, *static, compiler_options=compiler_options, axes=axes, mesh=mesh, vectorized=vectorized)

    chunk = min(options.max_iter, CHUNK if info.size <= 500 else 5)
    at_origin = options.init_strategy is None and init_params is None
    # one data set: the search's first chunk and the fit in one program, the draws in
    # another (which the PSIS candidate's fit reuses); a batch: its searches in one program
    # to the end (no progress bar), its draws on request (B x num_samples x D draws need not
    # fit in memory)
    if batch is None:
        fit_fn, static = joint_fit.fit, (chunk,)
    else:  # fit_many runs the batch's searches itself (newton_many: stragglers in blocks)
        local = batch.padded // (1 if mesh is None else mesh.devices.size)
        fit_fn, static = joint_fit.fit_many, (max(8, local // 16),)  # stragglers' block: 1/16 of the batch
    vectorized = batch is not None
    out = prog(fit_fn, info, options, at_origin, *static, vectorized=vectorized)((keys, init_params), args, kwargs)
    flags, checked = _fetch(out)
    if at_origin:
        # where the basis origin lies outside the density's support (e.g. the sqrt basis)
        finite = np.isfinite(np.asarray(flags.value))
        if not np.all(finite):
            retry = prog(fit_fn, info, options, False, *static, vectorized=vectorized)((keys, init_params), args,
                                                                                       kwargs)
            out = retry if finite.ndim == 0 else _select(jnp.asarray(finite), out, retry)
            flags, checked = _fetch(out)
    state, fitted = out[0], out[1]
    starts = jax.device_get(out[2]) if batch is None and out[2] is not None else None

    if batch is None and running(flags, options.max_iter):
        with progress(progress_bar, total=options.max_iter, initial=int(flags.num_iter),
                      desc="LaplaceMatching mode search") as bar:
            while running(flags, options.max_iter):
                state = prog(joint_fit.resume, info, options, chunk)((state,), args, kwargs)
                flags = jax.device_get(_search(state))
                bar.update(int(flags.num_iter) - bar.n)
                bar.set_postfix(step_sd=f"{float(flags.decrement):.2e}")
        fitted = prog(joint_fit.finish, info, options)((state, keys), args, kwargs)
        checked = jax.device_get((fitted.state.info, fitted.finite_params))
    result = JointResult(info, options, args, kwargs, rng_key, keys, fitted, num_samples, compiler_options, batch,
                         starts)
    try:
        _check(result, checked, on_failure)
    except NotPositiveDefiniteError:
        widened = _in_float64(result, prog(joint_fit.polish, info, options))
        if widened is None:
            raise
        result = JointResult(info, options, args, kwargs, rng_key, keys, widened, num_samples, compiler_options,
                             batch, starts)
        _check(result, jax.device_get((widened.state.info, widened.finite_params)), on_failure)
    return result


FLOAT64_RETRY_DIM = 2000
"""Coordinates up to which a float32 fit whose dense curvature float32 cannot resolve (numerically
singular, not negative) is finished again in float64 (:func:`_in_float64`): a regression with
correlated predictors (scaled eigenvalues 8.5e-4 to 400 over 600 coordinates, below float32's
floor of 1.2e-3) was refused with "use float64", which the library can do itself at this size
(a float64 eigendecomposition of 2000 coordinates takes seconds)."""


def _in_float64(result: JointResult, polish) -> Optional[JointFit]:
    """The fit finished in float64 from its float32 mode (:func:`joint_fit.polish`) and kept in
    float32, its curvature judged by float64's epsilon; ``None`` where it does not apply (a
    batch, a structured or float64 curvature, more than :data:`FLOAT64_RETRY_DIM` coordinates,
    an eigenvalue negative beyond round-off: a saddle, a curvature beyond
    :data:`~numpyro_lm.curvature.base.PEAKED`: a funnel) or float64 does not resolve it either."""
    curvature = result.state.curvature
    if (result.batch is not None or not isinstance(curvature, DenseCurvature) or curvature.dim > FLOAT64_RETRY_DIM
            or jnp.result_type(float) != jnp.float32):
        return None
    w, precision = (np.asarray(a, np.float64) for a in jax.device_get((curvature.eigenvalues, curvature.precision)))
    if (not np.all(np.isfinite(w)) or clearly_negative(w, float(np.finfo(np.float32).eps))
            or np.max(np.abs(np.diagonal(precision))) > PEAKED):
        return None  # a saddle, or a search run into a collapsing scale: no precision resolves either
    fitted = in_float64(polish, (result.state.mode, result.keys), result.args, result.kwargs)
    if not bool(fitted.state.info.positive):
        return None
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32) if np.issubdtype(np.asarray(a).dtype, np.floating)
                        else jnp.asarray(a), fitted)


def _split_keys(num, rng_key, args, kwargs):
    return jax.random.split(rng_key, num)


def _search(state):
    """The mode search's flags (one small transfer to the host)."""
    return state._replace(x=None, grad=None, hess=None, chol=None, step=None, t=None)


def _fetch(out):
    """``(search flags, (Laplace info, finite params))`` of a fit program's output, on the host."""
    return jax.device_get((_search(out[0]), (out[1].state.info, out[1].finite_params)))


def _check(result: JointResult, fetched, on_failure: str):
    layout = result.info.layout
    if result.options.curvature != "dense":  # the structure read from a plate must hold at the mode
        error = float(np.max(np.asarray(jax.device_get(result.state.info.structure_error))))
        dtype = result.state.mode.dtype
        if not error <= structure_tol(dtype):
            raise StructureError(structure_message(layout, result.options.plate, error, dtype, result.options.curvature))
    if result.batch is None:
        try:
            check_fit(layout, result.checks(fetched)[0], result.state.curvature)
        except ValueError as error:  # where the search ran off to the boundary, say so and what to do
            try:
                found = boundary_hyperparameters(result.info, result.state.mode, result.args, result.kwargs)
            except Exception:  # noqa: BLE001 - naming the boundary must never hide the fit's own error
                found = []
            if not found:
                raise
            raise type(error)(f"{error} {boundary_message(found)}") from error
        return
    info, finite = result.flags(fetched)
    usable = info.finite & info.positive & np.all([v for v in finite.values()], axis=0) & info.converged
    rows = np.flatnonzero(~usable)  # only these need a closer look
    failed, unconverged = {}, []
    for i, c in zip(rows, result.checks(fetched, rows)):
        i = int(i)
        named = i + result.batch.offset  # its index in the whole batch (a process's share: runtime.distributed)
        error = fit_error(layout, c, lambda i=i: take(result.state.curvature, i), data_set=named)
        if error is not None and not c.finite:  # the cause named as run() names it
            problem = failure_cause(result.info, *take_inputs(result.args, result.kwargs, result.batch.axes, i))
            error = error if problem is None else type(problem)(f"data set {named}: {problem}")
        if error is not None and on_failure == "raise":
            raise error
        if error is not None:
            failed[named] = str(error)
        elif convergence_warning(c) is not None:
            unconverged.append(named)
    if unconverged:
        warnings.warn(f"the mode search did not converge on {len(unconverged)} of {result.batch.size} data sets"
                      f"{_of_whole(result.batch)} "
                      f"({unconverged[:10]}{' ...' if len(unconverged) > 10 else ''}); see diagnostics()['converged']. "
                      "Increase max_iter or use float64.", stacklevel=4)
    if failed:
        warnings.warn(f"{len(failed)} of {result.batch.size} data sets{_of_whole(result.batch)} failed and have no "
                      "usable fit "
                      f"({sorted(failed)[:10]}); the first: {next(iter(failed.values()))}", stacklevel=4)


def _of_whole(batch: Batch) -> str:
    """Where a process fits a share of a batch: which share, for its warnings (every process repeats them)."""
    if batch.whole is None:
        return ""
    return f" (the share of data sets {batch.offset} to {batch.offset + batch.size - 1} of {batch.whole})"
