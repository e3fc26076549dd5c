r"""The auto-pilot: the cheapest approximation whose verdict passes, with the trail that led there.

``LaplaceMatching(model)`` (``strategy="auto"``) tries these candidates and stops at the
first whose verdict (:mod:`numpyro_lm.checks.verdict`) is *trusted*:

1. ``"nested"``, where the model has hyperparameters: nested Laplace over them
   (:mod:`numpyro_lm.approximations.nested`; :func:`numpyro_lm.core.structure.hyper_sites` finds them from
   the model's dependency structure, :mod:`numpyro_lm.core.structure`: global scales and shapes
   that set another latent site's prior or enter a likelihood with other latent sites).
   Over hyperparameters the joint mode is the wrong summary (a hierarchical scale's joint
   mode is dragged towards zero, a noise scale's is offset from its marginal mode), and
   on the trust suite the nested fit was also faster than the joint fit and the PSIS steps
   that tried to repair it (fewer candidates tried, fewer programs compiled).
2. ``"laplace"``: the joint Laplace Matching fit (:func:`numpyro_lm.approximations.joint.run_joint`):
   first where there are no hyperparameters.
3. ``"psis"``: the Gaussian whose mean and covariance in the LM basis are the Pareto
   smoothed importance-weighted moments of the Laplace draws (tried where those weights
   are reliable: k-hat at most the threshold and an importance ESS of at least
   ``20 D``). Moment matching minimises :math:`\mathrm{KL}(p\,\|\,q)` within the
   Gaussians, the direction that gets marginals right; each site's matched family follows
   from it as from a Laplace fit. Its own fresh draws and weights give its verdict.
4. ``"nested"`` again where the joint fit failed and no constrained hyperparameter was
   found, over the real-valued global sites that set another site's prior (a log-scale
   written on the real line: Neal's funnel has no joint mode).
5. ``"refine"``: the Laplace Gaussian refined against a fixed-draw evidence lower bound
   (:mod:`numpyro_lm.posterior.refine`, ``"dadvi"``: mean and covariance eigenvalues, 300 fixed
   draws, Newton from the Laplace fit; two to three times a plain fit's cost on
   ``benchmarks/refine.py``'s models), where the joint fit ran and nothing else was trusted;
   not among the :data:`DEFAULT_CANDIDATES`.

6. ``"lattice"``, for a model of at most three coordinates where nothing above was trusted: its
   posterior integrated on a lattice (nested over every site: :mod:`numpyro_lm.approximations.nested`),
   trusted only where nothing lies beyond the lattice's reach (:mod:`.nested.reach`). On NumPyro's
   test models it answered a GP regression's three hyperparameters (0.021 NUTS SDs; Laplace 0.196,
   untrusted) and a change point (0.024; Laplace 0.114, untrusted).

The PSIS step is repeated once from its own fresh draws where they are reliable
(adaptive importance sampling with the Gaussians in the LM basis).

Each attempt is recorded (candidate, trusted, k-hat, worst importance shift, seconds,
reasons) in ``diagnostics()["trail"]``. If none is trusted, the attempt with the smallest
failure is kept and ``run`` warns, naming the call that runs NUTS warm-started from it.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..core.curvature_choice import StructureError
from ..core.structure import hyper_sites, local_scales
from ..curvature import DenseCurvature
from ..mode.laplace_state import LaplaceState
from ..runtime.programs import program
from .joint import JointResult, run_joint
from .joint_fit import FitOptions, JointFit, matched_fit, refine_fit
from .nested import run_nested
from .nested.lattice_design import LATTICE
from .nested.reach import unreached

__all__ = ["Attempt", "CANDIDATES", "DEFAULT_CANDIDATES", "moment_fit", "run_auto"]

CANDIDATES = ("nested", "laplace", "psis", "refine", "lattice")
DEFAULT_CANDIDATES = ("nested", "laplace", "psis", "lattice")
"""What ``strategy="auto"`` tries. ``"refine"`` (``run_auto(..., candidates=CANDIDATES)``)
is left out: on the trust suite it was tried on one model only (the others were trusted
earlier), did not make it trusted, and its first call compiles a refinement program of its own."""

PSIS_STEPS = 2

REFINE = dict(refine="dadvi", refine_num_samples=None)
"""The refinement the auto-pilot tries (:data:`numpyro_lm.posterior.refine.DADVI_DRAWS` fixed draws)."""


class Attempt(NamedTuple):
    """One rung of the auto-pilot: what was tried and what its verdict said."""

    candidate: str
    trusted: bool
    pareto_k: float
    max_shift: float
    seconds: float
    reasons: tuple

    def line(self) -> str:
        verdict = "trusted" if self.trusted else "not trusted: " + "; ".join(self.reasons)
        khat = "" if np.isnan(self.pareto_k) else f", k-hat {self.pareto_k:.2f}"
        return f"{self.candidate} ({self.seconds:.2f} s{khat}): {verdict}"


def moment_fit(info, fitted: JointFit, flat, log_weights, args, kwargs) -> JointFit:
    """The :class:`~numpyro_lm.approximations.joint_fit.JointFit` of the Gaussian with the importance-weighted mean
    and covariance of the draws ``flat (S, D)`` (basis coordinates), normalised
    ``log_weights``; the search's flags are kept."""
    w = jnp.exp(log_weights - jax.scipy.special.logsumexp(log_weights)).astype(flat.dtype)
    mean = w @ flat
    centred = flat - mean
    cov = (centred * w[:, None]).T @ centred
    state = fitted.state
    return matched_fit(info, LaplaceState(mean, DenseCurvature.from_covariance(cov), state.log_density, state.info))


def _attempt(name: str, result, seconds: float) -> Attempt:
    verdict = result.verdicts()[0]
    khat = float(result.weights()[2].khat)
    shifts = [v for v in verdict.shift.values() if not np.isnan(v)]  # NaN: weights too unreliable to say
    return Attempt(name, verdict.trusted, khat, max(shifts, default=float("nan") if verdict.shift else 0.0),
                   seconds, verdict.reasons)


def _badness(attempt: Attempt, result) -> tuple:
    """Order of the untrusted attempts: a reliable k-hat first, then the smallest shift; among
    those whose weights are too unreliable to measure a shift, the candidates' own order
    (nested Laplace over hyperparameters is the right summary by construction)."""
    threshold = result.verdicts()[0].khat_threshold
    if attempt.pareto_k <= threshold:
        return (False, attempt.max_shift, attempt.pareto_k)
    return (True, CANDIDATES.index(attempt.candidate), attempt.pareto_k)


def run_auto(info, options: FitOptions, rng_key, args, kwargs, init_params=None, *, num_samples: int,
             compiler_options, progress_bar: bool = True, candidates=DEFAULT_CANDIDATES):
    """``(result, trail)``: the first trusted candidate's result (module docstring), else the
    least bad one, and the list of :class:`Attempt` s."""
    common = dict(num_samples=num_samples, compiler_options=compiler_options, progress_bar=progress_bar)
    trail, results, first_error = [], [], None

    def record(name, make):
        nonlocal first_error
        t0 = time.perf_counter()
        try:
            result = make()
            result.verdicts()
        except StructureError:  # the curvature, not the candidate, failed: LaplaceMatching changes it
            raise
        except ValueError as error:  # a candidate that cannot be fitted: the next may be
            first_error = first_error or error
            trail.append(Attempt(name, False, float("nan"), float("nan"), time.perf_counter() - t0, (str(error),)))
            return None
        attempt = _attempt(name, result, time.perf_counter() - t0)
        trail.append(attempt)
        results.append((attempt, result))
        return result

    def attempt(name, make):
        """Try a candidate: ``(its result or None where it raised, trusted)``."""
        result = record(name, make)
        return result, result is not None and trail[-1].trusted

    hyper = _hyper(info)
    if "nested" in candidates and hyper is not None:
        # over hyperparameters the joint mode is the wrong summary (numpyro_lm.core.structure)
        result, ok = attempt("nested", lambda: run_nested(info, options, hyper, rng_key, args, kwargs, init_params,
                                                          **common))
        if ok or (result is not None and options.curvature != "dense"):
            # a large model: its joint mode is the wrong summary over the hyperparameters, and
            # joint importance weights over 10^3-10^5 coordinates are unreliable for any
            # approximation (small errors per coordinate add up), so no rung below can do better
            return result, trail

    laplace, ok = attempt("laplace", lambda: run_joint(info, options, rng_key, args, kwargs, init_params, **common))
    if ok:
        return laplace, trail

    # PSIS moments, twice at most: the second from the first one's fresh draws (adaptive
    # importance sampling; the programs are the same, so it costs no compilation)
    source = laplace
    for step in range(PSIS_STEPS if "psis" in candidates else 0):
        if source is None or not _reweighting_reliable(source, info.size):
            break
        source, ok = attempt("psis", lambda s=source, k=step: _psis_result(s, jax.random.fold_in(rng_key, 5 + k),
                                                                            compiler_options, num_samples))
        if ok:
            return source, trail

    if "refine" in candidates and laplace is not None and options.curvature == "dense":  # the dense eigenbasis
        result, ok = attempt("refine", lambda: _refined_result(laplace, compiler_options, num_samples))
        if ok:
            return result, trail

    located = _hyper(info, locations=True) if "nested" in candidates and laplace is None else None
    if located is not None and located != hyper:
        # the joint fit failed and no constrained hyperparameter was found: a scale written on
        # the real line (Neal's funnel's log-scale y) has no joint mode either; nested over it
        result, ok = attempt("nested", lambda: run_nested(info, options, located, rng_key, args, kwargs,
                                                          init_params, **common))
        if ok:
            return result, trail

    if "lattice" in candidates and info.size <= max(LATTICE):
        result, ok = _lattice_rung(attempt, info, options, (hyper, located), rng_key, args, kwargs, init_params, common)
        if ok:
            return result, trail

    if not results:
        raise _no_fit_error(info, trail, first_error)
    _, result = min(results, key=lambda ar: _badness(*ar))
    return result, trail


def _lattice_rung(attempt, info, options, tried_hyper, rng_key, args, kwargs, init_params, common):
    """``attempt``'s ``(result, trusted)`` of the nested fit over every site of a model of at most
    three coordinates (a lattice over the posterior itself: nothing to condition on), with what
    lies beyond its reach among its verdict's reasons (:func:`~numpyro_lm.approximations.nested.reach.unreached`);
    ``(None, False)`` where a nested fit over every site was already tried (``tried_hyper``)."""
    sites = [s.name for s in info.layout.sites]
    if sites in tried_hyper:
        return None, False

    def fit():
        result = run_nested(info, options, sites, rng_key, args, kwargs, init_params, **common)
        result.unreached = unreached(result)
        return result

    return attempt("lattice", fit)


def _no_fit_error(info, trail, first_error: ValueError) -> ValueError:
    """The error when no candidate could be fitted: the first one's, or where the model has
    scales inside a plate (:func:`numpyro_lm.core.structure.local_scales`), that cause named."""
    funnels = local_scales(info.layout, info.parents)
    if not funnels:
        return first_error
    scale, plate, child = funnels[0]
    tried = "; ".join(f"{a.candidate}: {a.reasons[0].split('. ')[0]}" for a in trail if a.reasons)
    error = ValueError(
        f"site {scale!r} is a scale inside plate {plate!r} that sets site {child!r}'s prior: each entry is a "
        "funnel of its own with no joint mode (as a horseshoe's local scales), which no Laplace approximation "
        f"serves. Use NUTS (numpyro.infer.MCMC(NUTS(model))), or a prior for {child!r} whose scale mixture has "
        f"a closed form (Student-t or Laplace in place of Normal(0, scale)). Tried: {tried}.")
    error.__cause__ = first_error
    return error


def _reweighting_reliable(result, dim: int) -> bool:
    weights = result.weights()[2]
    return bool(weights.khat <= result.verdicts()[0].khat_threshold and weights.ess >= 20 * dim)


def _psis_result(source: JointResult, key, compiler_options, num_samples: int) -> JointResult:
    """The PSIS-moments fit from ``source``'s weighted draws, with fresh draws from ``key``
    (an honest verdict: not the draws the moments were estimated from)."""
    flat = source.draws(source.num_diagnostic_samples)[1]
    log_weights = jnp.asarray(source.weights()[2].log_weights, flat.dtype)
    fitted = program(moment_fit, source.info, compiler_options=compiler_options)(
        (source.fit, flat, log_weights), source.args, source.kwargs)
    return JointResult(source.info, source.options, source.args, source.kwargs, key, key, fitted, num_samples,
                       compiler_options)


def _hyper(info, locations: bool = False) -> Optional[list]:
    """The model's hyperparameter sites, or None where none are found."""
    try:
        return hyper_sites(info.layout, "auto", info.parents, locations)
    except ValueError:
        return None


def _refined_result(source: JointResult, compiler_options, num_samples: int) -> JointResult:
    """``source``'s Laplace fit refined (:data:`REFINE`), without a new mode search."""
    options = source.options._replace(**REFINE)
    fitted = program(refine_fit, source.info, options, compiler_options=compiler_options)(
        (source.fit.state, source.keys), source.args, source.kwargs)
    return JointResult(source.info, options, source.args, source.kwargs, source.rng_key, source.keys, fitted,
                       num_samples, compiler_options)
