"""The scores of the thesis' appendix C for attributed multilayer networks, and the folds.

- :func:`kfold_masks`: 5-fold cross-validation over the ``(l, i, j)`` triples and over each
  attribute's entries (C.3: "covering 80% of the triples ... and 80% of the categorical
  vector entries"), as 0/1 training masks;
- held-out edges: AUC (Bernoulli and Poisson layers: an entry above 0 is positive, scored by
  its expected value), MAE (Poisson), RMSE (Gaussian); attributes: accuracy (categorical,
  the most probable category), MAE, RMSE;
- communities: :func:`align` finds the relabelling of the inferred communities that best
  matches the truth (communities are exchangeable), :func:`cosine_similarity` is the mean
  over nodes of the cosine of inferred and true membership rows (C.3), :func:`coverage` the
  share of true memberships inside their credible intervals.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..nn.metrics import auroc

__all__ = ["kfold_masks", "edge_scores", "attribute_scores", "align", "cosine_similarity", "coverage"]


def kfold_masks(num_layers, num_nodes, num_attributes, num_folds=5, seed=0):
    """``[(edge_mask (L, N, N), attribute_mask (P, N))] * num_folds``: 1 for training entries."""
    rng = np.random.default_rng(seed)
    edge_fold = rng.integers(0, num_folds, (num_layers, num_nodes, num_nodes))
    attribute_fold = rng.integers(0, num_folds, (num_attributes, num_nodes))
    return [((edge_fold != f).astype(np.float32), (attribute_fold != f).astype(np.float32)) for f in range(num_folds)]


def edge_scores(layers, layer_kinds, means, test_mask):
    """Per layer ``{"auc"|"mae"|"rmse": value}`` on the held-out entries (``test_mask`` 1),
    self-loops excluded."""
    out = []
    n = np.shape(layers[0])[0]
    off = ~np.eye(n, dtype=bool)
    for a, kind, mean, mask in zip(layers, layer_kinds, np.asarray(means), np.asarray(test_mask)):
        a, pick = np.asarray(a), (mask > 0) & off
        truth, score = a[pick], mean[pick]
        scores = {}
        if kind in ("bernoulli", "poisson"):
            scores["auc"] = auroc(score[truth > 0], score[truth == 0])
        if kind == "poisson":
            scores["mae"] = float(np.mean(np.abs(truth - score)))
        if kind == "gaussian":
            scores["rmse"] = float(np.sqrt(np.mean((truth - score) ** 2)))
        out.append(scores)
    return out


def attribute_scores(attributes, attribute_kinds, means, test_mask):
    """Per attribute ``{"accuracy"|"mae"|"rmse": value}`` on the held-out nodes."""
    out = []
    for x, kind, mean, mask in zip(attributes, attribute_kinds, means, np.asarray(test_mask)):
        pick = mask > 0
        truth, mean = np.asarray(x)[pick], np.asarray(mean)[pick]
        if kind == "categorical":
            out.append({"accuracy": float(np.mean(mean.argmax(-1) == truth))})
        elif kind == "poisson":
            out.append({"mae": float(np.mean(np.abs(truth - mean)))})
        else:
            out.append({"rmse": float(np.sqrt(np.mean((truth - mean) ** 2)))})
    return out


def _row_cosine(a, b):
    return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def align(inferred, truth):
    """The column permutation of ``inferred (N, K)`` (a list; apply as ``inferred[:, perm]``)
    with the highest mean row cosine to ``truth``; every permutation is tried (K <= 7)."""
    k = truth.shape[1]
    if k > 7:
        raise ValueError(f"align tries all K! relabellings; K = {k} is too many")
    return list(max(itertools.permutations(range(k)),
                    key=lambda p: float(np.mean(_row_cosine(np.asarray(inferred)[:, list(p)], truth)))))


def cosine_similarity(inferred, truth, permutation=None):
    """Mean over nodes of the cosine of inferred and true membership rows, after ``align``."""
    permutation = align(inferred, truth) if permutation is None else permutation
    return float(np.mean(_row_cosine(np.asarray(inferred)[:, permutation], truth)))


def coverage(lower, upper, truth, permutation):
    """Share of the true memberships inside ``[lower, upper]`` after relabelling."""
    lower, upper = np.asarray(lower)[:, permutation], np.asarray(upper)[:, permutation]
    return float(np.mean((truth >= lower) & (truth <= upper)))
