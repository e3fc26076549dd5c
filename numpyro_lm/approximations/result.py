"""A fitted approximation: draws, importance weights, matched posterior and diagnostics on demand.

:class:`Result` holds what a fit computed (device arrays) with the model and arguments it
was fitted to, and computes the rest when asked, once: draws (for a number of samples),
their importance weights and PSIS (:mod:`numpyro_lm.checks.psis`), each site's matched
distribution (:mod:`numpyro_lm.posterior.matched`), the diagnostics dictionary and the summary.
A joint fit (:class:`numpyro_lm.approximations.joint.JointResult`) and a nested one
(:class:`numpyro_lm.approximations.nested.fit.NestedResult`) fill in how draws and weights are made.

For ``run_many`` the same object describes B data sets (:class:`numpyro_lm.runtime.batch.Batch`):
every program is vmapped over them, results carry a leading axis of size B, diagnostics
are arrays (one entry per data set).
"""

from __future__ import annotations

import copy
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np
from numpyro.distributions.distribution import validation_enabled

from ..checks.psis import KHAT_OK, importance_resample, khat_verdict, psis
from ..checks.verdict import judge_fits
from ..checks.wide import WIDE_MAX_DIM, WideCheck, student_t_draws, wide_shifts
from ..curvature import eigenvalue_range
from ..posterior.matched import MatchedPosterior, site_distribution
from ..runtime.batch import Batch, take, take_inputs
from ..runtime.programs import in_float64, options_for_work, program
from ..runtime.random import host_generator, split_chains
from .joint_fit import constrained, log_densities, row_profile
from .summary import diagnostics_of, print_summary

__all__ = ["Result", "verdict_draws", "density_profile", "diagnostic_samples", "WORK_BUDGET", "second_opinion"]


def _spectrum_range(gaussian, args, kwargs):
    """``(lowest, highest, scaled condition number)``: the last a dense curvature's (``inf``: none)."""
    curvature = gaussian.curvature
    low, high = eigenvalue_range(curvature)
    scaled = curvature.scaled_condition() if hasattr(curvature, "scaled_condition") else jnp.full_like(low, jnp.inf)
    return low, high, scaled


def _support_bounds(info, mean, args, kwargs):
    return info.support_bounds(mean, args, kwargs)


def _first_rows(n, tree, args, kwargs):
    return jax.tree.map(lambda x: x[:n], tree)


def _on_cpu(x) -> bool:
    return all(d.platform == "cpu" for d in x.devices())


def first_rows(tree, n: int):
    """The first ``n`` rows of each array of ``tree`` (device arrays): on a CPU sliced as NumPy
    views (no copy: 200 of 1000 draws of 10^5 coordinates with their flat rows in 9 ms, where a
    compiled slice took 0.13-0.2 s), elsewhere in one compiled program (an eager slice compiles
    a program per shape; a trip through the host would copy every draw twice)."""
    if all(_on_cpu(x) for x in jax.tree.leaves(tree)):
        # back where they were: a fit placed on a device of its own (runtime.placement) stays there
        return jax.tree.map(lambda x: jax.device_put(np.asarray(x)[:n], x.sharding if x.committed else None), tree)
    return program(_first_rows, n)((tree,))


WORK_BUDGET = 400_000_000
"""Numbers (latent and observed values) the verdict's log densities may touch per batch."""


def diagnostic_samples(num_samples: int, dim: int, batch_size: int = 1, work: int = 0) -> int:
    """Draws behind the verdict: at least ``num_samples`` and up to 4000 (a k-hat from 1000
    draws varies by +-0.3 between seeds near 0.7), within about 2e7 numbers per batch; for
    models of ``work`` latent and observed numbers beyond :data:`WORK_BUDGET` / 1000, fewer
    (at least 200: a 10^5-group GLMM's weights would take a minute for 1000 draws)."""
    n = int(max(num_samples, min(4000, max(1000, 20_000_000 // (dim * batch_size)))))
    return min(n, max(200, WORK_BUDGET // (max(work, 1) * batch_size)))


_PROFILES = {}


def density_profile(info, args, kwargs) -> tuple:
    """:func:`~numpyro_lm.approximations.joint_fit.row_profile` of the model's density (its largest
    array's numbers, whether it loops), once per model and argument shapes (a second ``run`` on new
    data of the same shapes does not trace again)."""
    leaves, treedef = jax.tree.flatten((args, kwargs))
    key = (info.model, info.layout, treedef,
           tuple((np.shape(x), str(getattr(x, "dtype", type(x).__name__))) for x in leaves))
    if key not in _PROFILES:
        if len(_PROFILES) > 256:  # a long session of many shapes: forget, do not grow without bound
            _PROFILES.clear()
        zeros = jax.ShapeDtypeStruct((info.size,), jax.numpy.result_type(float))
        _PROFILES[key] = row_profile(lambda r: info.log_density(r, args, kwargs), zeros)
    return _PROFILES[key]


def verdict_draws(info, args, kwargs, num_samples: int, batch: Optional[Batch] = None) -> int:
    """:func:`diagnostic_samples` of a fit: a model's work is its latent and observed numbers, or
    the largest array its density computes where that is larger (a latent GP's n x n kernel and
    its Cholesky factor at every draw)."""
    work = info.size + info.layout.observed_size
    if batch is None:
        work = max(work, density_profile(info, args, kwargs)[0])
    return diagnostic_samples(num_samples, info.size, 1 if batch is None else batch.budget_size, work)


class Result:
    """A fit of one data set, or of a batch (module docstring)."""

    def __init__(self, info, args, kwargs, rng_key, num_samples: int, compiler_options,
                 batch: Optional[Batch] = None):
        self.info, self.args, self.kwargs, self.rng_key = info, tuple(args), dict(kwargs), rng_key
        self.num_samples, self.compiler_options, self.batch = num_samples, compiler_options, batch
        self._num_diagnostic_samples = None
        self._draws, self._weights = {}, {}
        self._posterior = self._mode_trace = self._refused = self._spectrum = self._verdicts = None
        self._wide = None
        self.trail = None  # the auto-pilot's attempts (autopilot.Attempt) where it chose this fit: with_trail

    @property
    def num_diagnostic_samples(self) -> int:
        """Draws behind the verdict (:func:`verdict_draws`)."""
        if self._num_diagnostic_samples is None:
            self._num_diagnostic_samples = verdict_draws(self.info, self.args, self.kwargs, self.num_samples,
                                                         self.batch)
        return self._num_diagnostic_samples

    def with_trail(self, trail) -> "Result":
        """This fit with the auto-pilot's attempts that chose it (:mod:`.autopilot`): a copy, which
        shares what was computed so far."""
        chosen = copy.copy(self)
        chosen.trail = None if trail is None else tuple(trail)
        return chosen

    # ------------------------------------------------------------ to fill in

    @property
    def gaussian(self):
        raise NotImplementedError

    @property
    def params(self):
        raise NotImplementedError

    def _new_draws(self, num_samples: int):
        """``(samples, flat)`` (device arrays; padded batch)."""
        raise NotImplementedError

    def _new_weights(self, num_samples: int, flat):
        """``(log p, log q)`` of the draws (host arrays; padded batch)."""
        raise NotImplementedError

    def fit_diagnostics(self) -> dict:
        """The mode search's (or the nested design's) entries of :meth:`diagnostics`."""
        raise NotImplementedError

    def structure_reasons(self, i: int) -> list:
        """Reasons not to trust data set ``i`` found in the fit's structure (none by default)."""
        return []

    collapsed_weights = False
    """Whether :meth:`weights` are over a few coordinates with the rest integrated out (a nested
    fit's blocks: :mod:`numpyro_lm.marginal.collapsed`)."""

    def block_shifts(self) -> dict:
        """``{site: shift}`` measured by the fit itself instead of from the weighted draws (none by
        default; a nested fit's scalar blocks: :meth:`~.nested.fit.NestedResult.block_shifts`)."""
        return {}

    def search_summary(self, d: dict) -> str:
        """One sentence on how the fit was found, from its diagnostics ``d``."""
        raise NotImplementedError

    # -------------------------------------------------------------- programs

    def program(self, fn, *static, sharded: bool = True, points: int = 1):
        """``fn`` compiled for these arguments (vmapped, and sharded if ``sharded``, for a
        batch); ``points``: the model evaluations it makes per data set (its options:
        :func:`~numpyro_lm.runtime.programs.options_for_work`)."""
        axes = mesh = None
        if self.batch is not None:
            axes, mesh = self.batch.axes, (self.batch.mesh if sharded else None)
        work = points * (self.info.size + self.info.layout.observed_size) * (1 if self.batch is None else self.batch.padded)
        return program(fn, *static, compiler_options=options_for_work(self.compiler_options, work), axes=axes,
                       mesh=mesh)

    def call(self, fn, static: tuple, arrays: tuple, host_callbacks: bool = False, float64: bool = False,
             points: int = 1):
        """``fn(arrays, args, kwargs)`` compiled. ``host_callbacks``: ``fn`` calls the host
        (the quantile functions, the Gamma sampler), so a sharded batch runs it on its first
        device: jaxlib 0.10's ``pure_callback`` deadlocks when several CPU devices call back
        at once with large arrays (seen on 1000 x 1000 copula draws). ``float64``: traced and
        run in float64 (:func:`~numpyro_lm.runtime.programs.in_float64`), results on the host.
        ``points``: the model evaluations ``fn`` makes (:meth:`program`)."""
        if float64:
            return in_float64(self.program(fn, *static, points=points), arrays, self.args, self.kwargs)
        inputs = (arrays, self.args, self.kwargs)
        if host_callbacks and self.batch is not None and self.batch.mesh is not None:
            mesh = self.batch.mesh
            out = self.program(fn, *static, sharded=False, points=points)(*jax.device_put(inputs, mesh.devices.flat[0]))
            return jax.device_put(out, NamedSharding(mesh, PartitionSpec(mesh.axis_names[0])))
        return self.program(fn, *static, points=points)(*inputs)

    def unpad(self, tree):
        """Drop the batch's padding (identity for one data set)."""
        return tree if self.batch is None else take(tree, slice(0, self.batch.size))

    def first(self):
        """``(mean, args, kwargs)`` of the (first) data set."""
        if self.batch is None:
            return self.gaussian.mean, self.args, self.kwargs
        return self.gaussian.mean[0], *take_inputs(self.args, self.kwargs, self.batch.axes, 0)

    # ----------------------------------------------------------------- draws

    def draws(self, num_samples: Optional[int] = None):
        """``(samples, flat)`` of ``num_samples`` draws (default: ``self.num_samples``), kept."""
        n = self.num_samples if num_samples is None else num_samples
        if n < 1:
            raise ValueError(f"num_samples must be positive, not {n}")
        if n not in self._draws:
            larger = [m for m in self._draws if m > n]
            if larger and self.batch is None:  # the first n of more draws (iid; the copula's are prefix-stable)
                self._draws[n] = first_rows(self._draws[min(larger)], n)
            elif larger:  # a batch's draws stay where they are (sharded)
                self._draws[n] = jax.tree.map(lambda x: jax.lax.slice_in_dim(x, 0, n, axis=1),
                                              self._draws[min(larger)])
            else:
                self._draws[n] = self._new_draws(n)
        return self._draws[n]

    def weights(self, num_samples: Optional[int] = None):
        """``(log p, log q, PSIS)`` of the ``num_diagnostic_samples`` draws behind the verdict
        (their first ``num_samples`` are :meth:`get_samples`'s where there are as many; a list
        of PSIS for a batch), or of ``num_samples`` draws."""
        n = self.num_diagnostic_samples if num_samples is None else num_samples
        if n not in self._weights:
            flat = self.draws(n)[1]
            self.set_weights(n, *self.unpad(self._new_weights(n, flat)))
        return self._weights[n]

    def set_weights(self, n: int, log_p, log_q):
        """Keep the ``log p`` and ``log q`` of the first ``n`` draws (host arrays, one row per data
        set of a batch) with their PSIS: :meth:`weights` computes them, a batch shared by several
        processes gathers them (:mod:`.across_processes`)."""
        # constant up to the round-off of the precision they were computed in (float64)
        eps = np.finfo(np.result_type(log_p.dtype, log_q.dtype)).eps
        log_p, log_q = np.asarray(log_p, np.float64), np.asarray(log_q, np.float64)
        rows = [psis(p, q, noise=np.sqrt(eps) * (1.0 + np.max(np.abs(p))))
                for p, q in zip(log_p.reshape(-1, n), log_q.reshape(-1, n))]
        self._weights[n] = (log_p, log_q, rows[0] if self.batch is None else rows)

    def get_samples(self, num_samples=None, group_by_chain=False, resample=None, rng_key=None) -> dict:
        if resample is not None:
            samples = self._resample(num_samples, resample, rng_key)
        else:
            samples = self.unpad(self.draws(num_samples)[0])
        if group_by_chain:  # independent draws, shown as pseudo-chains (random.num_pseudo_chains)
            axis = 0 if self.batch is None else 1
            samples = jax.tree.map(lambda x: split_chains(x, axis), samples)
        return samples

    def _resample(self, num_samples, method, rng_key):
        if method != "psis":
            raise ValueError(f'resample must be None or "psis", not {method!r}')
        weights = self.weights()[2]
        rows = [weights] if self.batch is None else weights
        num_samples = self.num_samples if num_samples is None else num_samples
        bad = [i for i, w in enumerate(rows) if not w.khat <= KHAT_OK]
        if bad:
            where = "" if self.batch is None else f"data sets {bad[:10]}: "
            raise ValueError(
                f"PSIS resampling refused: {where}" + khat_verdict(rows[bad[0]].khat) + " Importance "
                "weights this heavy-tailed give estimates dominated by a few draws."
            )
        rng = host_generator(jax.random.fold_in(self.rng_key, 3) if rng_key is None else rng_key)
        # from all the weighted draws behind the verdict, num_samples of them
        samples = self.unpad(self.draws(self.num_diagnostic_samples)[0])
        index = [importance_resample(rng, w.log_weights, num_samples) for w in rows]
        if self.batch is None:
            return jax.tree.map(lambda x: x[index[0]], samples)
        index = np.stack(index)
        return jax.tree.map(lambda x: np.take_along_axis(
            np.asarray(x), index.reshape(index.shape + (1,) * (np.ndim(x) - 2)), axis=1), samples)

    def extra_fields(self, group_by_chain: bool = False) -> dict:
        n = self.num_samples  # the draws of get_samples()
        log_p, log_q, _ = self.weights(max(n, self.num_diagnostic_samples))
        log_p, log_q = log_p[..., :n], log_q[..., :n]
        fields = {"lp": log_p, "log_q": log_q, "log_weight": log_p - log_q}
        if group_by_chain:
            axis = 0 if self.batch is None else 1
            fields = {k: split_chains(v, axis) for k, v in fields.items()}
        return fields

    # ------------------------------------------------------------- posterior

    def mode_trace(self):
        """The model's trace at the (first data set's) mean: the sites' supports there."""
        if self._mode_trace is None:
            mean, args, kwargs = self.first()
            self._mode_trace = self.info.trace(mean, args, kwargs)
        return self._mode_trace

    def _refuse(self, name: str) -> Optional[str]:
        if self._refused is None:
            mean, args, kwargs = self.first()
            refused = {n: (f"site {n!r} has a support that depends on other latent sites, so its marginal has no "
                           "closed-form matched family. Use get_samples(), whose draws map the site with the drawn "
                           "values of the sites it depends on.") for n in self.info.dependent_sites(mean, args, kwargs)}
            if self.batch is not None:
                bounds = jax.device_get(self.call(_support_bounds, (self.info,), (self.gaussian.mean,)))
                for n, b in self.unpad(bounds).items():
                    if n not in refused and b.size and not np.all(b == b[:1]):
                        refused[n] = (f"site {n!r} has support bounds that differ between the data sets, so the "
                                      "batch has no one matched family for it. Use get_samples().")
            self._refused = refused
        return self._refused.get(name)

    @property
    def posterior(self) -> MatchedPosterior:
        if self._posterior is None:
            params = self.unpad(self.params)

            def build(name):
                site, transform = self.info.layout.site(name), self.info.transform(name, self.mode_trace())
                if self.batch is None or all(np.all(np.isfinite(np.asarray(p))) for p in jax.tree.leaves(params[name])):
                    return site_distribution(site, params[name], transform)
                # run_many(on_failure="warn") kept the other data sets: a failed one's parameters
                # are NaN (it was warned about), which numpyro's argument validation would refuse
                # for the whole batch
                with validation_enabled(False):
                    return site_distribution(site, params[name], transform)

            self._posterior = MatchedPosterior(build, tuple(s.name for s in self.info.layout.sites), self._refuse)
        return self._posterior

    # ----------------------------------------------------------- diagnostics

    def spectrum_range(self):
        """``(lowest, highest)`` eigenvalue of the curvature, host arrays of one entry per data set."""
        return self._spectrum_and_scaled()[:2]

    def _spectrum_and_scaled(self):
        """:meth:`spectrum_range` and a dense curvature's scaled condition number, from one program."""
        if self._spectrum is None:
            self._spectrum = tuple(np.atleast_1d(np.asarray(a, np.float64)) for a in jax.device_get(self.unpad(
                self.call(_spectrum_range, (), (self.gaussian,)))))
        return self._spectrum

    def condition_numbers(self):
        """The curvature's condition number per data set (``inf`` where it is not positive definite)."""
        low, high = self.spectrum_range()
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(low > 0, high / low, np.inf)

    def verdict_condition(self):
        """The condition numbers the verdict judges the precision by: a dense curvature's scaled
        precision's (:meth:`~numpyro_lm.curvature.DenseCurvature.scaled_condition`: what float32
        resolves), else :meth:`condition_numbers` (a nested fit's diagonal summary: its dense block's)."""
        if hasattr(self.gaussian.curvature, "scaled_condition"):
            return self._spectrum_and_scaled()[2]
        return self.condition_numbers()

    def verdicts(self) -> list:
        """One :class:`~numpyro_lm.checks.verdict.Verdict` per data set (:func:`~numpyro_lm.checks.verdict.judge_fits`),
        computed once."""
        if self._verdicts is None:
            weights = self.weights()[2]
            given = self.block_shifts()
            samples = self.unpad(self.draws(self.num_diagnostic_samples)[0])
            samples = jax.device_get({k: v for k, v in samples.items() if k not in given})
            mean = np.asarray(jax.device_get(self.unpad(self.gaussian.mean)))
            self._verdicts = judge_fits(self.info.layout, [weights] if self.batch is None else weights, samples,
                                        mean, self.fit_diagnostics(), self.verdict_condition(),
                                        self.structure_reasons, batched=self.batch is not None, given_shift=given,
                                        collapsed=self.collapsed_weights, wide=self._second_opinion(),
                                        precision_eps=self.precision_eps())
        return self._verdicts

    def precision_eps(self) -> Optional[float]:
        """The machine epsilon the curvature was decomposed in, where it says (a float32 fit finished
        in float64: :func:`~numpyro_lm.approximations.joint._in_float64`), else ``None`` (the mean's)."""
        eps = getattr(self.gaussian.curvature, "eps", None)
        return None if eps is None else float(np.max(np.asarray(jax.device_get(eps))))

    def _second_opinion(self):
        """``i -> WideCheck`` (:mod:`numpyro_lm.checks.wide`) for one data set of at most
        :data:`~numpyro_lm.checks.wide.WIDE_MAX_DIM` coordinates whose weights are not collapsed; else None."""
        if self.batch is not None or self.collapsed_weights or self.info.size > WIDE_MAX_DIM:
            return None
        return lambda i: self.wide_check()

    def wide_check(self) -> Optional[WideCheck]:
        """The Student-t second opinion of this fit (:func:`second_opinion`), computed once."""
        if self._wide is None:
            self._wide = second_opinion(self)
        return self._wide

    def diagnostics(self) -> dict:
        """The fit's diagnostics and verdict (:func:`~.summary.diagnostics_of`)."""
        return diagnostics_of(self)

    def print_summary(self, prob: float = 0.9, exclude_deterministic: bool = True):
        """The draws' summary as MCMC prints it, then the fit's diagnostics (:func:`~.summary.print_summary`)."""
        print_summary(self, prob, exclude_deterministic)


def second_opinion(result) -> Optional[WideCheck]:
    """The Student-t second opinion of ``result`` (one data set; :mod:`numpyro_lm.checks.wide`): as many
    draws as its verdict's, their float64 log densities and constrained values, against its own draws
    (``None`` where ``q``'s covariance is not positive definite)."""
    n = result.num_diagnostic_samples
    rng = host_generator(jax.random.fold_in(result.rng_key, 7))
    mean, cov = jax.device_get((result.gaussian.mean, result.gaussian.cov))
    made = student_t_draws(rng, mean, cov, n, jnp.result_type(float))
    if made is None:
        return None
    flat, log_t = jax.device_put(made[0]), made[1]
    log_p = np.asarray(result.call(log_densities, (result.info,), (flat,), float64=True, points=n), np.float64)
    weights = psis(log_p, log_t, noise=np.sqrt(np.finfo(np.float64).eps) * (1.0 + np.max(np.abs(log_t))))
    t_samples = jax.device_get(result.call(constrained, (result.info,), (flat,), points=n))
    q_samples = jax.device_get(result.draws(n)[0])
    shift = wide_shifts([s.name for s in result.info.layout.sites], q_samples, t_samples, weights.log_weights)
    return WideCheck(float(weights.khat), float(weights.ess), n, shift)
