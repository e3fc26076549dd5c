"""The scores laplace-torch users expect for a classifier's predictive: NLL, ECE, Brier, OOD AUROC.

All take class probabilities ``(n, K)`` and integer labels ``(n,)`` (AUROC: two score arrays)
and return floats; NumPy, so they run on anything array-like.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

__all__ = ["nll", "ece", "brier", "auroc", "confidence"]


def _check(probabilities, labels):
    p, y = np.asarray(probabilities, np.float64), np.asarray(labels)
    if p.ndim != 2 or y.shape != p.shape[:1]:
        raise ValueError(f"probabilities must be (n, K) and labels (n,); got {p.shape} and {y.shape}")
    return p, y.astype(int)


def nll(probabilities, labels) -> float:
    """Mean negative log probability of the true class (probabilities clipped at 1e-12)."""
    p, y = _check(probabilities, labels)
    return float(-np.mean(np.log(np.clip(p[np.arange(len(y)), y], 1e-12, 1.0))))


def ece(probabilities, labels, num_bins: int = 10) -> float:
    """Expected calibration error: the top class's confidence against its accuracy, in
    ``num_bins`` equal-width bins of confidence, weighted by the bins' shares (Guo et al. 2017)."""
    p, y = _check(probabilities, labels)
    top, correct = p.max(1), (p.argmax(1) == y).astype(float)
    bins = np.minimum((top * num_bins).astype(int), num_bins - 1)
    return float(sum(np.mean(bins == b) * abs(correct[bins == b].mean() - top[bins == b].mean())
                     for b in range(num_bins) if np.any(bins == b)))


def brier(probabilities, labels) -> float:
    """Mean squared distance between the probabilities and the one-hot label (summed over classes)."""
    p, y = _check(probabilities, labels)
    return float(np.mean(np.sum((p - np.eye(p.shape[1])[y]) ** 2, 1)))


def confidence(probabilities) -> np.ndarray:
    """The top class's probability per input: the usual in-distribution score for OOD detection."""
    return np.asarray(probabilities, np.float64).max(-1)


def auroc(in_scores, out_scores) -> float:
    """Area under the ROC curve for telling in-distribution inputs (higher ``in_scores``) from
    out-of-distribution ones: the Mann-Whitney statistic, ties counted half."""
    a, b = np.asarray(in_scores, np.float64).ravel(), np.asarray(out_scores, np.float64).ravel()
    ranks = rankdata(np.concatenate([a, b]))
    return float((ranks[: len(a)].sum() - len(a) * (len(a) + 1) / 2) / (len(a) * len(b)))
