"""Running the joint fit: compiled programs, the chunked mode search, the checks.

:func:`run_joint` drives the pure pipeline of :mod:`numpyro_lm.fit` for one data set or a
batch: one compiled program for the common case (the search converges within the first
chunk of Newton evaluations), further chunks with a progress bar when it does not, a
restart from the init strategy where the basis origin lies outside the density's support.
The flags of the fit become the package's errors (:mod:`numpyro_lm.errors`) before any
result is handed back, so a failed call leaves the caller's state as it was.
"""

from __future__ import annotations

import warnings
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from . import fit as joint_fit
from .batch import Batch, pad, take
from .errors import FitChecks, check_fit, convergence_warning, fit_error
from .fit import FitOptions, JointFit
from .programs import program
from .result import Result

__all__ = ["JointResult", "run_joint"]


class JointResult(Result):
    """A joint fit (:class:`~numpyro_lm.result.Result`): the Laplace state and matched families."""

    def __init__(self, info, options: FitOptions, args, kwargs, rng_key, keys, fit: JointFit, num_samples: int,
                 compiler_options, batch: Optional[Batch] = None):
        super().__init__(info, args, kwargs, rng_key, num_samples, compiler_options, batch)
        self.options, self.keys, self.fit = options, keys, fit

    @property
    def gaussian(self):
        return self.fit.gaussian

    @property
    def params(self):
        return self.fit.params

    @property
    def state(self):
        return self.fit.state

    def _new_draws(self, num_samples: int):
        return self.call(joint_fit.draw, (self.info, num_samples), (self.keys, self.gaussian, self.params))

    def _new_weights(self, num_samples: int, flat):
        return jax.device_get(self.call(joint_fit.weigh, (self.info,), (self.keys, self.gaussian, self.params, flat)))

    def checks(self) -> list:
        """:class:`~numpyro_lm.errors.FitChecks` of each data set."""
        info, finite = jax.device_get(self.unpad((self.state.info, self.fit.finite_params)))
        rows = 1 if self.batch is None else self.batch.size
        info, finite = jax.tree.map(lambda a: np.reshape(np.asarray(a), (rows,)), (info, finite))
        return [FitChecks(info.finite[i], info.positive[i], {k: bool(v[i]) for k, v in finite.items()},
                          info.converged[i], info.num_iter[i], info.decrement[i], info.grad_norm[i])
                for i in range(rows)]

    def _fit_diagnostics(self) -> dict:
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

    def _search_summary(self, d: dict) -> str:
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
        keys = pad(jax.random.split(rng_key, batch.size), batch)

    def prog(fn, *static):
        return program(fn, *static, compiler_options=compiler_options, axes=axes, mesh=mesh)

    chunk = min(options.max_iter, 25 if info.size <= 500 else 5)
    at_origin = options.init_strategy is None and init_params is None
    state, fitted = prog(joint_fit.fit, info, options, at_origin, chunk)((keys, init_params), args, kwargs)
    if at_origin:
        # where the basis origin lies outside the density's support (e.g. the sqrt basis)
        finite = np.asarray(jax.device_get(jnp.isfinite(state.value)))
        if not np.all(finite):
            retry = prog(joint_fit.fit, info, options, False, chunk)((keys, init_params), args, kwargs)
            state, fitted = retry if finite.ndim == 0 else _select(jnp.asarray(finite), (state, fitted), retry)

    def needs_more(s):
        converged, stalled, num_iter = (np.asarray(a) for a in jax.device_get((s.converged, s.stalled, s.num_iter)))
        todo = np.atleast_1d(~(converged | stalled) & (num_iter < options.max_iter))
        return bool(np.any(todo[: None if batch is None else batch.size]))

    if needs_more(state):
        with tqdm(total=options.max_iter, initial=int(np.min(jax.device_get(state.num_iter))),
                  desc="LaplaceMatching mode search", disable=not progress_bar, delay=2.0) as bar:
            while needs_more(state):
                done = int(np.min(jax.device_get(state.num_iter)))
                state = prog(joint_fit.resume, info, options, chunk)((state,), args, kwargs)
                bar.update(int(np.min(jax.device_get(state.num_iter))) - done)
                bar.set_postfix(step_sd=f"{float(np.max(jax.device_get(state.decrement))):.2e}")
        fitted = prog(joint_fit.finish, info, options)((state, keys), args, kwargs)
    result = JointResult(info, options, args, kwargs, rng_key, keys, fitted, num_samples, compiler_options, batch)
    _check(result, on_failure)
    return result


def _check(result: JointResult, on_failure: str):
    checks, layout = result.checks(), result.info.layout
    if result.batch is None:
        check_fit(layout, checks[0], result.state.curvature)
        return
    failed, unconverged = {}, []
    for i, c in enumerate(checks):
        error = fit_error(layout, c, lambda i=i: take(result.state.curvature, i), data_set=i)
        if error is not None and on_failure == "raise":
            raise error
        if error is not None:
            failed[i] = str(error)
        elif convergence_warning(c) is not None:
            unconverged.append(i)
    if unconverged:
        warnings.warn(f"the mode search did not converge on {len(unconverged)} of {len(checks)} data sets "
                      f"({unconverged[:10]}{' ...' if len(unconverged) > 10 else ''}); see diagnostics()['converged']. "
                      "Increase max_iter or use float64.", stacklevel=4)
    if failed:
        warnings.warn(f"{len(failed)} of {len(checks)} data sets failed and have no usable fit "
                      f"({sorted(failed)[:10]}); the first: {next(iter(failed.values()))}", stacklevel=4)
