r"""Can this fit be trusted? One verdict from the importance weights and the fit's structure.

The approximation ``q`` is trusted when all of these hold (each failure is a reason, in
words a user can act on):

1. **The weights' tail is light.** The Pareto shape :math:`\hat k` of the importance ratios
   ``p/q`` (PSIS, :mod:`numpyro_lm.checks.psis`) is at most the sample-size-aware threshold
   :math:`\min(1 - 1/\log_{10} S, 0.7)` (Vehtari, Simpson, Gelman, Yao and Gabry 2024,
   "Pareto smoothed importance sampling", JMLR 25, section 3.2.3): above it, no estimate
   from ``S`` weighted draws is reliable, so nothing about ``q`` can be checked either.
2. **Reweighting moves no marginal.** Where the weights are reliable they estimate the
   posterior itself, so the distance between each coordinate's draws under ``q`` and the
   same draws reweighted towards ``p`` estimates how far ``q``'s marginal is from the
   posterior's: :func:`importance_shift` measures it as a Wasserstein-1 distance in units
   of the coordinate's posterior SD (from the weighted draws), the score our benchmarks use
   against long NUTS runs. A shift
   above :data:`SHIFT_TRUSTED` (plus its Monte Carlo noise) means ``q``'s marginals are
   off even though ``p/q`` is well behaved (e.g. the joint-vs-marginal offset of a noise
   scale), which a k-hat alone misses: adding well-identified coordinates leaves ``p/q``
   and its k-hat unchanged but not the user's error.
   Where the k-hat of ``q``'s own weights is above its threshold, a second opinion may
   still measure these shifts: importance sampling from a Student-t with ``q``'s location and
   scale (:mod:`numpyro_lm.checks.wide`), whose tails reach where ``q``'s do not. If its own
   k-hat is within the threshold, its shifts decide; if not, the k-hat's reason stands.
3. **The fit is sound**: the mode search converged, the curvature is positive definite
   and not ill-conditioned for the precision, and no coordinate's mode sits at the edge of
   its support (a scale collapsing to zero, a probability to one).

The weights themselves are computed in float64 (:func:`numpyro_lm.runtime.programs.in_float64`),
so float32 round-off can neither fake a tail nor hide one.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from .shift import importance_shift
from .wide import WIDE_DF, WideCheck

__all__ = ["NotTrustedWarning", "SHIFT_TRUSTED", "EDGE", "Verdict", "khat_threshold", "judge",
           "verdict_sentence", "NUTS_HINT", "distinct_modes", "MODE_DISTANCE", "MODE_MASS", "judge_fits",
           "NEAR_UNIFORM_ESS", "near_uniform"]

NUTS_HINT = ("run NUTS warm-started from this fit: warm = numpyro_lm.warm_nuts(lm); "
             "MCMC(warm.kernel, num_warmup=150, num_samples=1000).run(key, *args, init_params=warm.init_params, "
             "**kwargs)")



class NotTrustedWarning(UserWarning):
    """A fit whose verdict is not trusted (as NumPyro warns of divergences): its draws and
    marginals should not be used as they are. ``warnings.simplefilter("ignore",
    NotTrustedWarning)`` silences it; ``diagnostics()["trusted"]`` says the same."""


SHIFT_TRUSTED = 0.07
"""Largest importance-estimated Wasserstein-1 shift of a marginal (posterior SDs) for a trusted
fit, before the Monte Carlo allowance. Below the 0.1 SD our benchmarks call accurate because
the estimate runs low where ``q``'s tails are too light (a two-state HMM's transition
probabilities: 0.11 estimated, 0.18 against long NUTS)."""

NEAR_UNIFORM_ESS = 0.99
r"""Importance ESS (a fraction of the draws) from which the weights of a verdict over a few
coordinates (a nested fit's hyperparameters and globals with its blocks integrated out) are
uniform enough that their tail's shape is not held against the fit: by Cauchy-Schwarz a
reweighted mean differs from the plain one by at most :math:`\mathrm{sd}\sqrt{S/\mathrm{ESS} - 1}`,
0.1 SD at this ESS. There a k-hat is the shape of log-weights that vary by hundredths of a nat
(a 40-group Poisson GLMM's: ESS 997 of 1000, log-weight SD 0.05, k-hat 0.58-0.90 over four seeds:
the conditional covariance of the globals is a design point's across its lattice cell)."""

def near_uniform(ess: float, num_samples: int) -> bool:
    """Whether weights with importance ESS ``ess`` over ``num_samples`` draws are nearly uniform
    (:data:`NEAR_UNIFORM_ESS`)."""
    return bool(ess >= NEAR_UNIFORM_ESS * num_samples)


MODE_DISTANCE = 3.0
"""Two modes are distinct when some coordinate differs by more than this many posterior SDs."""

MODE_MASS = 0.1
"""A second mode counts when its Laplace mass is at least this fraction of the kept mode's."""

EDGE = 12.0
"""A log or logit basis coordinate beyond this at the mode sits at the edge of its support
(``exp(-12)`` is 6e-6 of the scale the model was written in)."""


class Verdict(NamedTuple):
    """:param trusted: whether the draws and marginals can be used as they are.
    :param reasons: why not, one sentence each (empty when trusted).
    :param khat_threshold: the k-hat threshold for the number of draws.
    :param shift: ``{site: worst importance-estimated W1 / SD over its coordinates}``.
    :param near_uniform: the weights' k-hat was above its threshold and not counted
        (:data:`NEAR_UNIFORM_ESS`).
    :param wide_khat: the k-hat of the Student-t second opinion (:mod:`numpyro_lm.checks.wide`)
        where the weights' own k-hat was above its threshold and the second opinion's was not,
        so that its shifts were judged (``NaN`` otherwise).
    """

    trusted: bool
    reasons: tuple
    khat_threshold: float
    shift: dict
    near_uniform: bool = False  # k-hat above its threshold, not counted: NEAR_UNIFORM_ESS
    wide_khat: float = float("nan")  # the Student-t second opinion's k-hat where it decided (checks.wide)


def khat_threshold(num_samples: int) -> float:
    r""":math:`\min(1 - 1/\log_{10} S, 0.7)`: the largest k-hat for which ``S`` weighted draws
    give reliable estimates (Vehtari et al. 2024)."""
    return float(min(1.0 - 1.0 / np.log10(max(num_samples, 11)), 0.7))


def shift_noise(ess: float) -> float:
    """Monte Carlo noise of :func:`importance_shift` with importance ESS ``ess``: at most
    ``1/sqrt(ess)`` SDs (measured: 0.5 to 1 times that on Gaussian draws; the W1 between two
    empirical samples of ``ess`` draws of one distribution is of that order)."""
    return 1.0 / np.sqrt(max(ess, 1.0))


def distinct_modes(starts, mode, sd, layout) -> list:
    r"""Reasons (at most one) for a multi-start fit that found a second mode of comparable mass.

    ``starts`` (:class:`numpyro_lm.approximations.joint_fit.Starts`, host arrays): where each search ended; a
    search counts where it converged to a positive definite curvature. Its mode is distinct
    from the kept ``mode`` when a coordinate differs by more than :data:`MODE_DISTANCE`
    posterior SDs ``sd``, and comparable when its Laplace mass
    :math:`\log p(y_k) - \tfrac12 \log\det H_k` is within a factor :data:`MODE_MASS` of the
    kept mode's (the highest among the searches that ended at the kept mode).
    """
    ok = np.asarray(starts.converged) & np.asarray(starts.positive) & np.isfinite(starts.log_density)
    if ok.sum() < 2:
        return []
    distance = np.max(np.abs(np.asarray(starts.x) - mode) / sd, axis=1)
    mass = np.asarray(starts.log_density) - np.asarray(starts.half_logdet)
    same = ok & (distance <= MODE_DISTANCE)
    other = ok & (distance > MODE_DISTANCE)
    if not same.any() or not other.any():
        return []
    k = np.flatnonzero(other)[np.argmax(mass[other])]
    ratio = np.exp(mass[k] - np.max(mass[same]))
    if ratio < MODE_MASS:
        return []
    where = layout.coordinate(int(np.argmax(np.abs(starts.x[k] - mode) / sd)))
    return [f"the mode search from {len(ok)} starting points found a second mode {distance[k]:.0f} SDs away "
            f"(at {where}) with {ratio:.0%} of the kept mode's Laplace mass: the posterior is multimodal"]


def judge(khat: float, num_samples: int, ess: float, shift: dict, *, converged: bool = True,
          positive: bool = True, condition: float = 1.0, precision_eps: float = np.finfo(np.float32).eps,
          edge_sites=(), structure=(), near_uniform_ok: bool = False, wide: Optional[WideCheck] = None) -> Verdict:
    """The :class:`Verdict` of one fit (module docstring).

    :param khat: the Pareto k-hat of ``p/q`` over ``num_samples`` draws, with importance ``ess``.
    :param shift: ``{site: worst importance_shift of its coordinates}``.
    :param condition: the curvature's condition number; ill-conditioned beyond ``0.1/eps`` of
        the fit's precision (its flattest directions keep less than one digit). Milder loss
        of digits shows in the float64 weights, which judge the Gaussian actually used (a
        GP prior with jitter 1e-5 has a condition number near 1e6 and accurate draws).
    :param edge_sites: sites whose mode lies at the edge of their support.
    :param structure: other reasons found in the fit's structure (:func:`distinct_modes`).
    :param near_uniform_ok: weights over a few coordinates, whose k-hat does not count where
        their ESS is at least :data:`NEAR_UNIFORM_ESS` of the draws.
    :param wide: the Student-t second opinion (:class:`~numpyro_lm.checks.wide.WideCheck`), used
        where ``khat`` is above its threshold and the second opinion's is not: its two-sample shifts
        are judged with their noise from both samples.
    """
    reasons = []
    if not converged:
        reasons.append("the mode search did not converge")
    if not positive:
        reasons.append("the curvature at the mode is not positive definite")
    elif condition > 0.1 / precision_eps:
        reasons.append(f"the curvature is ill-conditioned (condition number {condition:.1e}) for the precision")
    for site in edge_sites:
        reasons.append(f"site {site!r} has its mode at the edge of its support")
    reasons.extend(structure)
    threshold = khat_threshold(num_samples)
    uniform = bool(near_uniform_ok and not khat <= threshold and np.isfinite(khat) and near_uniform(ess, num_samples))
    wide_khat = float("nan")
    if not khat <= threshold and not uniform:
        second = wide is not None and wide.khat <= khat_threshold(wide.num_samples)
        if not second:
            reasons.append(f"k-hat {khat:.2f} > {threshold:.2f} ({num_samples} draws): the approximation misses "
                           "part of the posterior (a heavy tail, a second mode or a funnel)")
        else:
            # the two samples' W1 carries the noise of both (shift_noise of each, added in quadrature)
            shift, wide_khat = dict(wide.shift), float(wide.khat)
            limit = SHIFT_TRUSTED + float(np.hypot(shift_noise(wide.ess), shift_noise(num_samples)))
            off = [f"{site!r} by {value:.2f} SD" for site, value in shift.items() if value > limit]
            if off:
                reasons.append(f"k-hat {khat:.2f} > {threshold:.2f}, and importance sampling from a Student-t with "
                               f"q's location and scale (k-hat {wide.khat:.2f}) places marginals away from q's: "
                               f"{', '.join(off)} (more than {limit:.2f}): they are off")
    else:
        limit = SHIFT_TRUSTED + shift_noise(ess)
        for site, value in shift.items():
            if value > limit:
                reasons.append(f"reweighting towards the posterior moves site {site!r} by {value:.2f} SD "
                               f"(more than {limit:.2f}): its marginal is off")
    return Verdict(not reasons, tuple(reasons), threshold, dict(shift), uniform, wide_khat)


def judge_fits(layout, weights: list, samples: dict, mean, fit: dict, condition, structure_reasons, *,
               batched: bool = False, given_shift=None, collapsed: bool = False, wide=None,
               precision_eps: Optional[float] = None) -> list:
    """:func:`judge` for each data set of a fit: ``weights`` its PSIS (one per data set), ``samples``
    the weighted draws ``{site: array}`` (a leading data-set axis where ``batched``), ``mean`` the
    Gaussian's mean, ``fit`` the fit's diagnostics (``converged``, ``positive_definite``: a number
    or one per data set), ``condition`` the curvature's condition numbers and
    ``structure_reasons(i)`` the fit's own reasons not to trust data set ``i``. Shifts are measured
    only where the weights are reliable (NaN elsewhere); modes beyond :data:`EDGE` in a log or
    logit basis are at the edge of their support. ``given_shift``: ``{site: shift}`` the fit
    measured itself (one data set; a nested fit's scalar blocks), used for those sites in place
    of the draws' (which ``samples`` may then leave out). ``collapsed``: the weights are over a
    few coordinates with the rest integrated out (``judge``'s ``near_uniform_ok``). ``wide(i)``: data set
    ``i``'s Student-t second opinion (``judge``'s ``wide``), asked for only where its k-hat fails.
    ``precision_eps``: the machine epsilon the curvature was decomposed in (default: the mean's dtype's)."""
    given_shift = dict(given_shift or {})
    eps = float(np.finfo(np.asarray(mean).dtype).eps) if precision_eps is None else precision_eps
    mean = np.asarray(mean).astype(np.float64).reshape(len(weights), -1)
    edges = [s for s in layout.sites if s.basis in ("log", "logit")]
    verdicts = []
    for i, w in enumerate(weights):
        shift = {}
        for site in layout.sites:
            uniform = collapsed and near_uniform(w.ess, len(w.log_weights))
            if not w.khat <= khat_threshold(len(w.log_weights)) and not uniform:  # unreliable weights: not used
                shift[site.name] = float("nan")
                continue
            if site.name in given_shift:
                shift[site.name] = float(given_shift[site.name])
                continue
            x = np.asarray(samples[site.name][i] if batched else samples[site.name])
            shift[site.name] = float(np.max(importance_shift(x, w.log_weights), initial=0.0))
        edge = [s.name for s in edges if np.any(np.abs(mean[i, s.offset:s.offset + s.size]) > EDGE)]
        verdicts.append(judge(w.khat, len(w.log_weights), w.ess, shift,
                              converged=bool(np.atleast_1d(fit["converged"])[i]),
                              positive=bool(np.atleast_1d(fit["positive_definite"])[i]),
                              condition=float(condition[i]), precision_eps=eps, edge_sites=edge,
                              structure=structure_reasons(i), near_uniform_ok=collapsed,
                              wide=_second_opinion(wide, i, w, collapsed)))
    return verdicts


def _second_opinion(wide, i: int, weights, collapsed: bool):
    """Data set ``i``'s :class:`~numpyro_lm.checks.wide.WideCheck` where ``weights``' k-hat fails (else None)."""
    n = len(weights.log_weights)
    if wide is None or weights.khat <= khat_threshold(n) or (collapsed and near_uniform(weights.ess, n)):
        return None
    return wide(i)


def verdict_sentence(verdict: Verdict, khat: float, ess: float, tried=(), lattice_sites=None) -> str:
    """The verdict in words, with what to do: reweighted draws where the weights allow,
    then the cheaper fixes not yet in ``tried`` (the auto-pilot's candidates) before NUTS;
    ``lattice_sites``: a model of at most three coordinates, whose sites named as ``hyper=``
    integrate its posterior on a lattice (:func:`~numpyro_lm.approximations.nested.nested_coordinates`)."""
    if verdict.trusted:
        worst = max(verdict.shift.values(), default=0.0)
        k = "-inf (the approximation is exact up to rounding)" if khat == -np.inf else f"{khat:.2f}"
        moved = "less than 0.01" if worst < 0.01 else f"at most {worst:.2f}"
        if not np.isnan(verdict.wide_khat):
            return (f"trusted: the importance weights' k-hat {k} is above {verdict.khat_threshold:.2f} (the posterior "
                    f"has a tail q does not reach), but importance sampling from a Student-t with {WIDE_DF:.0f} "
                    f"degrees of freedom and q's location and scale (k-hat {verdict.wide_khat:.2f}) places each "
                    f"marginal {moved} SD from q's; the draws can be used as they are.")
        weights = (f"k-hat {k} <= {verdict.khat_threshold:.2f}" if not verdict.near_uniform else
                   f"the importance weights are nearly uniform (ESS {ess:.0f}: no reweighted mean can move by more "
                   f"than 0.1 SD, so their tail's k-hat {k} does not count)")
        return (f"trusted: {weights} and reweighting towards the posterior moves "
                f"each marginal by {moved} SD; the draws can be used as they are.")
    light = khat <= verdict.khat_threshold and ess >= 100
    fix = ('get_samples(resample="psis") gives reweighted draws (importance ESS '
           f'{ess:.0f}); or ' if light else "")
    if "nested" not in tried:
        fix += 'for a hierarchical scale, LaplaceMatching(model, hyper="auto") (nested Laplace); or '
    if "refine" not in tried:
        fix += 'for a skewed posterior, refine="dadvi"; or '
    if lattice_sites:
        fix += (f"with so few coordinates, LaplaceMatching(model, hyper={list(lattice_sites)!r}) integrates the "
                "posterior on a lattice (it sees no mode beyond the lattice's reach); or ")
    fix += NUTS_HINT
    return "NOT trusted: " + "; ".join(verdict.reasons) + ". To fix: " + fix + "."
