r"""Did the approximation work? Pareto smoothed importance sampling of ``log p - log q``.

With draws :math:`y_s \sim q` (the Laplace Matching posterior in basis coordinates) and
the model's unnormalised log density :math:`\log p(y_s)` in the same coordinates, the
importance log-weights :math:`\log w_s = \log p(y_s) - \log q(y_s)` are constant exactly
when ``q`` is the posterior. PSIS (Vehtari, Simpson, Gelman, Yao and Gabry 2024, "Pareto
smoothed importance sampling", JMLR) fits a generalised Pareto distribution to the
largest weights; its shape :math:`\hat k` measures how heavy the tail of ``p/q`` is, and
Yao, Vehtari, Simpson and Gelman (2018, "Yes, but did it work?: Evaluating variational
inference", ICML) use it as a diagnostic of the approximation itself:

- :math:`\hat k < 0.5`: ``q`` is close to the posterior; its draws can be used as they
  are, and importance resampling corrects what remains.
- :math:`0.5 \le \hat k \le 0.7`: ``q`` misses part of the posterior, but PSIS-corrected
  estimates (``get_samples(resample="psis")``) are still reliable.
- :math:`\hat k > 0.7`: ``q`` misses the posterior (typically a tail, a second mode, or
  a hierarchical funnel); neither its draws nor reweighting can be trusted: run MCMC,
  warm-started from the approximation.

:math:`\hat k` is computed with :func:`arviz.psislw` (relative efficiency 1: our draws are
independent). The unnormalised weights also give the evidence lower bound
:math:`\mathrm{ELBO} = \mathbb{E}_q[\log p - \log q]` (up to the model's normaliser).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

__all__ = [
    "KHAT_GOOD",
    "KHAT_OK",
    "PSIS",
    "psis",
    "khat_verdict",
    "importance_resample",
]

KHAT_GOOD = 0.5
KHAT_OK = 0.7


class PSIS(NamedTuple):
    """Pareto smoothed importance weights of a set of draws.

    :param log_weights: smoothed, normalised log-weights (``logsumexp = 0``).
    :param khat: the Pareto shape estimate (``-inf``: the weights are constant, i.e. the
        approximation equals the target up to rounding).
    :param ess: importance sampling effective sample size ``1 / sum(w^2)``.
    :param elbo: mean of the raw ``log p - log q`` (finite draws only).
    :param log_evidence: ``log mean exp(log p - log q)``, an estimate of the log
        normaliser of ``p`` (finite draws only).
    :param num_nonfinite: draws whose ``log p - log q`` is NaN (given zero weight).
    """

    log_weights: np.ndarray
    khat: float
    ess: float
    elbo: float
    log_evidence: float
    num_nonfinite: int


def _logsumexp(x):
    top = np.max(x)
    if not np.isfinite(top):
        return top
    return top + np.log(np.sum(np.exp(x - top)))


def psis(log_p, log_q, noise: float = 0.0) -> PSIS:
    """PSIS of draws with target log density ``log_p`` and proposal log density ``log_q``.

    :param noise: spread of ``log p - log q`` below which the weights count as constant
        (rounding: ``k-hat`` is then ``-inf``, the uniform weights are kept).
    """
    lw = np.asarray(log_p, np.float64) - np.asarray(log_q, np.float64)
    bad = np.isnan(lw)
    lw = np.where(bad, -np.inf, lw)
    n = lw.size
    finite = np.isfinite(lw)
    elbo = float(np.mean(lw[finite])) if finite.any() else float("nan")
    log_evidence = float(_logsumexp(lw[finite]) - np.log(n)) if finite.any() else float("nan")
    if finite.all() and np.ptp(lw) <= noise:
        smoothed, khat = np.full(n, -np.log(n)), -np.inf
    elif not np.isfinite(np.max(lw)):
        # +inf weights (q = 0 where p > 0) or no finite weight at all
        smoothed, khat = np.full(n, -np.log(n)), np.inf
    else:
        import arviz as az  # heavy import, only when a diagnostic is asked for

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # arviz warns on k > 0.7; we explain it ourselves
            smoothed, khat = az.psislw(lw.copy(), reff=1.0)
        smoothed, khat = np.asarray(smoothed), float(khat)
    w = np.exp(smoothed)
    return PSIS(smoothed, khat, float(1.0 / np.sum(w**2)), elbo, log_evidence, int(bad.sum()))


def khat_verdict(khat: float) -> str:
    """One sentence a user can act on, for a Pareto ``k-hat``."""
    if khat == -np.inf:
        return "k-hat -inf: log p - log q is constant, the approximation is the posterior (up to rounding)."
    if khat < KHAT_GOOD:
        return (
            f"k-hat {khat:.2f} < {KHAT_GOOD}: the approximation is close to the posterior; "
            "its draws can be used as they are."
        )
    if khat <= KHAT_OK:
        return (
            f"k-hat {khat:.2f} in [{KHAT_GOOD}, {KHAT_OK}]: the approximation misses part of the "
            'posterior; use get_samples(resample="psis") for corrected draws.'
        )
    return (
        f"k-hat {khat:.2f} > {KHAT_OK}: the approximation misses the posterior (a heavy tail, a "
        "second mode or a hierarchical funnel); its draws and reweighted draws cannot be "
        "trusted. Run NUTS, warm-started from this fit."
    )


def importance_resample(rng: np.random.Generator, log_weights, num_samples: int) -> np.ndarray:
    """Indices of ``num_samples`` draws picked with probability ``exp(log_weights)``.

    Systematic resampling (one uniform, evenly spaced): lower variance than multinomial
    resampling, and each draw is repeated ``floor`` or ``ceil`` of its expected count.
    """
    w = np.exp(np.asarray(log_weights, np.float64) - _logsumexp(log_weights))
    cumulative = np.cumsum(w)
    cumulative[-1] = 1.0
    points = (rng.uniform() + np.arange(num_samples)) / num_samples
    index = np.searchsorted(cumulative, points, side="right")
    return rng.permutation(np.minimum(index, w.size - 1))
