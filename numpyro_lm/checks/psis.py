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

:math:`\hat k` is computed as :func:`arviz.psislw` does (relative efficiency 1: our draws are
independent), by :func:`pareto_smooth`. The unnormalised weights also give the evidence lower bound
:math:`\mathrm{ELBO} = \mathbb{E}_q[\log p - \log q]` (up to the model's normaliser).
"""

from __future__ import annotations

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
        smoothed, khat = pareto_smooth(lw)
    w = np.exp(smoothed)
    return PSIS(smoothed, khat, float(1.0 / np.sum(w**2)), elbo, log_evidence, int(bad.sum()))


def pareto_smooth(log_weights):
    """``(smoothed normalised log-weights, k-hat)``: PSIS of independent draws (relative
    efficiency 1), as :func:`arviz.psislw` computes it (Vehtari et al. 2024, algorithm 1;
    Zhang and Stephens 2009 for the generalised Pareto fit), without importing ArviZ (a
    second of start-up on a first call).

    The largest ``M = ceil(min(S/5, 3 sqrt(S)))`` weights are replaced by the expected
    order statistics of the generalised Pareto distribution fitted to them, truncated at
    the largest raw weight.
    """
    x = np.array(log_weights, np.float64)
    n = x.size
    x -= np.max(x)
    cutoff = max(x[np.argsort(x)[-int(np.ceil(min(n / 5.0, 3.0 * np.sqrt(n)))) - 1]], np.log(np.finfo(float).tiny))
    tail = np.flatnonzero(x > cutoff)
    if tail.size <= 4:
        khat = np.inf  # too few tail draws to fit
    else:
        order = tail[np.argsort(x[tail])]
        excess = np.exp(x[order]) - np.exp(cutoff)
        khat, sigma = _generalised_pareto_fit(excess)
        if np.isfinite(khat) and sigma > 0:
            p = np.arange(0.5, tail.size) / tail.size
            quantiles = -np.log1p(-p) if abs(khat) < np.finfo(float).eps else np.expm1(-khat * np.log1p(-p)) / khat
            x[order] = np.log(sigma * quantiles + np.exp(cutoff))
            x[x > 0] = 0.0
    return x - _logsumexp(x), float(khat)


def _generalised_pareto_fit(sorted_excess):
    """``(k, sigma)`` of a generalised Pareto distribution fitted to sorted positive data:
    Zhang and Stephens (2009) empirical Bayes, with a weak prior on ``k`` (as ArviZ/loo)."""
    y = sorted_excess
    n = y.size
    m = 30 + int(np.sqrt(n))
    b = 1.0 - np.sqrt(m / (np.arange(1, m + 1) - 0.5))
    b = b / (3.0 * y[int(n / 4 + 0.5) - 1]) + 1.0 / y[-1]
    k = np.mean(np.log1p(-b[:, None] * y), axis=1)
    log_lik = n * (np.log(-b / k) - k - 1.0)
    w = 1.0 / np.sum(np.exp(log_lik - log_lik[:, None]), axis=1)
    keep = w >= 10 * np.finfo(float).eps
    w, b = w[keep] / np.sum(w[keep]), b[keep]
    b_post = np.sum(b * w)
    k_post = np.mean(np.log1p(-b_post * y))
    sigma = -k_post / b_post
    return (n * k_post + 10 * 0.5) / (n + 10), sigma


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
        'trusted. For a hierarchical scale try hyper="auto" (nested Laplace), for a skewed posterior '
        'refine="dadvi"; else run NUTS, warm-started from this fit (numpyro_lm.warm_nuts).'
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
