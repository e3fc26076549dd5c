r"""How far reweighting moves a marginal: the Wasserstein-1 distance between a coordinate's draws
under ``q`` and the same (or other) draws weighted towards the posterior ``p``, in units of the
posterior's SD.

This is the score the benchmarks give a fit against a long NUTS run (W1 over the NUTS SD), estimated
from importance weights alone: :func:`importance_shift` reweights ``q``'s own draws
(:mod:`numpyro_lm.checks.verdict`), :func:`two_sample_shift` weights another proposal's
(:mod:`numpyro_lm.checks.wide`). The posterior's SD is the weighted draws' own estimate: ``q``'s
SD overstated the error by their ratio where ``q`` is too narrow (a Normal's unknown scale from
n = 8 points, fitted at the joint mode: 0.89 against the exact 0.54; 0.54 so).
"""

from __future__ import annotations

import numpy as np

__all__ = ["importance_shift", "two_sample_shift", "normalised_weights", "weighted_sd", "per_sd"]


def importance_shift(values, log_weights):
    r"""Per column of ``values (S, K)``: the Wasserstein-1 distance between its ``S`` draws
    with equal weights and with ``exp(log_weights)``, over the weighted draws' SD (the
    posterior's, as the benchmarks score a fit against a long NUTS run).

    On sorted values :math:`x_{(1)} \le \dots \le x_{(S)}` with cumulative weights :math:`W_i`,
    :math:`W_1 = \sum_i |W_i - i/S|\,(x_{(i+1)} - x_{(i)})`. Columns with zero spread get 0.
    """
    # (K, S): each column's draws contiguous, sorted along rows (faster than along axis 0)
    x = np.asarray(values, np.float64).reshape(len(log_weights), -1).T
    w = normalised_weights(log_weights)
    order = np.argsort(x, axis=1)
    xs = np.take_along_axis(x, order, axis=1)
    gap = np.cumsum(w[order] - 1.0 / x.shape[1], axis=1)[:, :-1]
    w1 = np.einsum("ks,ks->k", np.abs(gap), np.diff(xs, axis=1))
    return per_sd(w1, weighted_sd(x.T, w), np.std(x, axis=1))


def two_sample_shift(q_values, p_values, log_weights):
    r"""Per column: the Wasserstein-1 distance between ``q_values (S, K)`` with equal weights and
    ``p_values (T, K)`` with ``exp(log_weights)``, over the weighted ``p_values``' SD (the
    posterior's, as :func:`importance_shift`).

    On the pooled sorted values :math:`x_{(i)}`, :math:`W_1 = \sum_i |F_q(x_{(i)}) - F_p(x_{(i)})|
    \,(x_{(i+1)} - x_{(i)})`. Columns with zero spread under both get 0.
    """
    q = np.asarray(q_values, np.float64).reshape(len(q_values), -1)
    p = np.asarray(p_values, np.float64).reshape(len(p_values), -1)
    w = normalised_weights(log_weights)
    pooled = np.concatenate([q, p]).T  # (K, S + T)
    mass = np.concatenate([np.full(len(q), 1.0 / len(q)), -w])
    order = np.argsort(pooled, axis=1)
    xs = np.take_along_axis(pooled, order, axis=1)
    gap = np.cumsum(mass[order], axis=1)[:, :-1]
    w1 = np.einsum("ks,ks->k", np.abs(gap), np.diff(xs, axis=1))
    return per_sd(w1, weighted_sd(p, w), np.std(q, axis=0))


def normalised_weights(log_weights):
    """``exp(log_weights)`` summing to one, in float64."""
    lw = np.asarray(log_weights, np.float64)
    w = np.exp(lw - np.max(lw))
    return w / np.sum(w)


def weighted_sd(x, w):
    """Per column of ``x (S, K)``: the SD under the normalised weights ``w (S,)``."""
    mean = w @ x
    return np.sqrt(np.maximum(w @ (x - mean) ** 2, 0.0))


def per_sd(w1, sd, fallback_sd):
    """``w1 / sd``; where ``sd`` is zero (the weights on one draw) over ``fallback_sd``; 0 where both are."""
    scale = np.where(sd > 0, sd, fallback_sd)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, w1 / scale, 0.0)
