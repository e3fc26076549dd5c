r"""Pseudo-observations of LM + GP: non-Gaussian data as heteroskedastic Gaussian observations
of a latent function, through Laplace Matching (thesis chapter 3, Algorithm 2).

Each group of data points (one point, the points that share an input, or a cluster) becomes
the conjugate posterior of its observations under a weak prior, an exponential family, which
Laplace Matching maps to a Gaussian ``N(mean, noise)`` in the family's basis:

- binary labels :math:`y \in \{0, 1\}` (Bernoulli): :math:`\mathrm{Beta}(\epsilon + \sum y,\
  \epsilon + n - \sum y)`, in the logit basis :math:`\mu = \log(\alpha/\beta)`,
  :math:`\sigma^2 = (\alpha + \beta)/(\alpha\beta)` (thesis eq. 3.15);
- counts :math:`y \in \{0, 1, \dots\}` (Poisson): :math:`\mathrm{Gamma}(\epsilon + \sum y,\ n)`
  (shape, rate), in the log basis :math:`\mu = \log(\alpha/\beta)`, :math:`\sigma^2 = 1/\alpha`.

Grouping adds the sufficient statistics once to one prior (conjugacy): for a single point it
is the thesis' pseudo-likelihood, e.g. :math:`\mathrm{Beta}(y + \epsilon, 1 - y + \epsilon)`.
(Multiplying the per-point pseudo-likelihoods instead would subtract :math:`n - 1` from each
parameter, negative for groups of more than a few points when :math:`\epsilon < 1`.)

The prior's :math:`\epsilon` keeps a group with no successes (no counts) finite: its
Gaussian is then wide and far out (:math:`\mu = \log(\epsilon / (n + \epsilon))`), and the
GP's heteroskedastic noise gives it little weight.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax.numpy as jnp
import numpy as np

from ..families import get_family

__all__ = ["DATA_KINDS", "EPS", "PseudoObservations", "pseudo_observations", "group_labels"]

EPS = {"binary": 0.1, "counts": 0.1}
"""Default prior weight :math:`\\epsilon` per data kind (thesis: a small value added to each
Beta parameter; its effect is measured in the LM + GP benchmark)."""

DATA_KINDS = {"binary": ("beta", "logit"), "counts": ("gamma", "log")}
"""Data kind -> (matched family, basis)."""


class PseudoObservations(NamedTuple):
    """One Gaussian observation per group of data points.

    :param inputs: ``(m, d)`` the groups' inputs (the mean input of each group).
    :param mean: ``(m,)`` the Gaussian's mean in the family's basis.
    :param noise: ``(m,)`` its variance: the GP's heteroskedastic noise.
    :param params: the conjugate family's parameters per group (a dict of ``(m,)`` arrays).
    :param size: ``(m,)`` data points per group.
    :param kind: the data kind (:data:`DATA_KINDS`).
    """

    inputs: np.ndarray
    mean: np.ndarray
    noise: np.ndarray
    params: dict
    size: np.ndarray
    kind: str


def group_labels(inputs: np.ndarray) -> np.ndarray:
    """``(n,)`` group labels of points that share an input exactly (first appearance order)."""
    _, first, labels = np.unique(np.asarray(inputs).reshape(len(inputs), -1), axis=0, return_index=True,
                                 return_inverse=True)
    order = np.argsort(np.argsort(first))  # relabel in the order groups first appear
    return order[labels.ravel()]


def _check(kind: str, y: np.ndarray):
    if kind not in DATA_KINDS:
        raise ValueError(f"kind must be one of {sorted(DATA_KINDS)}, not {kind!r}")
    if not np.all(np.isfinite(y)):
        raise ValueError(f"y holds {int(np.sum(~np.isfinite(y)))} values that are not finite: drop them")
    if kind == "binary" and not np.all((y == 0) | (y == 1)):
        raise ValueError(f"binary labels must be 0 or 1; y holds {np.unique(y[(y != 0) & (y != 1)])[:5]}")
    if kind == "counts" and not np.all((y >= 0) & (y == np.round(y))):
        raise ValueError("counts must be non-negative integers; y holds "
                         f"{np.unique(y[(y < 0) | (y != np.round(y))])[:5]}")


def pseudo_observations(inputs, y, kind: str, labels: Optional[np.ndarray] = None,
                        eps: Optional[float] = None) -> PseudoObservations:
    """The groups' Gaussian pseudo-observations (module docstring).

    :param inputs: ``(n, d)`` or ``(n,)`` inputs.
    :param y: ``(n,)`` binary labels or counts.
    :param kind: ``"binary"`` or ``"counts"``.
    :param labels: ``(n,)`` integer group of each point (k-means clusters, users' own); default:
        points that share an input exactly (:func:`group_labels`); ``np.arange(n)`` keeps every
        point on its own.
    :param eps: the conjugate prior's weight (default :data:`EPS`).
    """
    x = np.asarray(inputs, np.float64)
    x = x[:, None] if x.ndim == 1 else x
    y = np.asarray(y, np.float64)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"inputs has {x.shape[0]} points and y {y.shape[0]}")
    _check(kind, y)
    eps = EPS[kind] if eps is None else float(eps)
    if not eps > 0:
        raise ValueError(f"eps must be positive, not {eps}")
    labels = group_labels(x) if labels is None else np.asarray(labels)
    _, labels = np.unique(labels, return_inverse=True)
    m = int(labels.max()) + 1
    size = np.bincount(labels, minlength=m).astype(np.float64)
    total = np.bincount(labels, weights=y, minlength=m)
    centre = np.stack([np.bincount(labels, weights=x[:, j], minlength=m) for j in range(x.shape[1])], 1)
    centre /= size[:, None]
    family, basis = DATA_KINDS[kind]
    if kind == "binary":
        params = {"concentration1": eps + total, "concentration0": eps + size - total}
    else:
        params = {"concentration": eps + total, "rate": size}
    mean, noise = get_family(family, basis).to_gaussian({k: jnp.asarray(v) for k, v in params.items()})
    return PseudoObservations(centre, np.asarray(mean, np.float64), np.asarray(noise, np.float64), params, size,
                              kind)
