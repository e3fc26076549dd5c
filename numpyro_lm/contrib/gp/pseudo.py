r"""Pseudo-observations of LM + GP: non-Gaussian data as heteroskedastic Gaussian observations
of a latent function, through Laplace Matching (thesis chapter 3, Algorithm 2).

Each group of data points (one point, the points that share an input, or a cluster) becomes
the conjugate posterior of its observations under a weak prior, an exponential family, which
Laplace Matching maps to a Gaussian ``N(mean, noise)`` in the family's basis:

- binary labels :math:`y \in \{0, 1\}` (Bernoulli): :math:`\mathrm{Beta}(\epsilon + \sum y,\
  \epsilon + n - \sum y)`, in the logit basis :math:`\mu = \log(\alpha/\beta)`,
  :math:`\sigma^2 = (\alpha + \beta)/(\alpha\beta)` (thesis eq. 3.15);
- counts :math:`y \in \{0, 1, \dots\}` (Poisson): :math:`\mathrm{Gamma}(\epsilon + \sum y,\ n)`
  (shape, rate), in the log basis :math:`\mu = \log(\alpha/\beta)`, :math:`\sigma^2 = 1/\alpha`;
- categories :math:`y \in \{0, \dots, K-1\}` or per-category counts (categorical):
  :math:`\mathrm{Dirichlet}(\epsilon + c)` with :math:`c_k` the group's count of category ``k``,
  in the softmax basis on the zero-sum plane (thesis eq. 3.17a-b:
  :math:`\mu_k = \log\alpha_k - \frac1K\sum_l\log\alpha_l`,
  :math:`\Sigma = P\,\mathrm{diag}(1/\alpha)\,P`, :math:`P = I - \frac1K 11^\top`), in the
  ``K - 1`` orthonormal coordinates of numpyro's ``ZeroSumTransform``: a ``(K-1) x (K-1)``
  block of noise per group;
- covariances, from zero-mean vectors :math:`r \in \mathbb{R}^p` (returns, residuals): the
  group's Gaussian likelihood of its covariance :math:`\Sigma = \mathrm{expm}(S)` with
  :math:`\epsilon` extra observations at :math:`\bar S` (the covariance of all the vectors),
  :math:`\ell(S) = -\tfrac{n+\epsilon}{2}\mathrm{tr}\,S - \tfrac12\mathrm{tr}(\Psi\Sigma^{-1})`,
  :math:`\Psi = \sum r r^\top + \epsilon\bar S`, Laplace-approximated in the matrix-log basis:
  mean :math:`\mathrm{vech}\,\mathrm{logm}(\Psi/(n+\epsilon))` (the log of the
  maximum-likelihood covariance), noise the inverse of :math:`-\nabla^2\ell`, a ``p(p+1)/2``
  block per group. This is the inverse Wishart :math:`\mathrm{IW}(n + \epsilon - p - 1, \Psi)`
  (its ``params``) as a function of :math:`\Sigma`, without the basis' Jacobian, as the Beta in
  the logit basis is the Bernoulli likelihood: a likelihood, which the GP needs, not a
  density. The thesis used the sqrtm basis (section 3.5.4); measured on the benchmark's
  drifting covariance (235 months of 21 vectors, p = 4; without Newton steps and with
  :math:`\epsilon = 1`), its noise grows with the value, so
  the GP's precision weights favour low months and its pooled estimate of :math:`R`'s
  diagonal fell 10 % low while its SD shrank to a sixth of a month's (RMSE 0.046 and 43 % of
  the true entries within 2 SD, against 0.024 and 79 % in the log basis, whose noise is
  nearly constant: :math:`2/(n+\epsilon)` on the diagonal, half that off it, for an isotropic
  :math:`\Psi`).

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

import jax
import jax.numpy as jnp
import numpy as np

from ...families import get_family
from ...families.bases import SymmetricMatrixExpTransform
from ...runtime.precision import precise_jit

__all__ = ["DATA_KINDS", "BLOCK_KINDS", "EPS", "PseudoObservations", "pseudo_observations", "group_labels",
           "covariance_log_likelihood"]

EPS = {"binary": 0.01, "counts": 0.1, "categorical": 0.01, "covariance": 0.1}
"""Default prior weight :math:`\\epsilon` per data kind (thesis: a small value added to each
Beta parameter; its effect is measured in the LM + GP benchmark). For covariances each unit of
it is one extra vector at the pooled covariance in every group, a bias towards the pooled
value that the GP's pooling does not undo: with 1.0 instead of 0.1, 91 % instead of 94 % of
the benchmark's true entries fell within 2 SD."""

DATA_KINDS = {"binary": ("beta", "logit"), "counts": ("gamma", "log"), "categorical": ("dirichlet", "softmax"),
              "covariance": ("inverse_wishart", "logm")}
"""Data kind -> (matched family, basis)."""

BLOCK_KINDS = ("categorical", "covariance")
"""Kinds whose pseudo-observation is a vector with a block of noise (the others: a scalar)."""


class PseudoObservations(NamedTuple):
    """One Gaussian observation per group of data points.

    :param inputs: ``(m, d)`` the groups' inputs (the mean input of each group).
    :param mean: ``(m,)`` the Gaussian's mean in the family's basis (``(m, D)`` for the
        :data:`BLOCK_KINDS`).
    :param noise: ``(m,)`` its variance: the GP's heteroskedastic noise (``(m, D, D)`` blocks).
    :param params: the conjugate family's parameters per group (a dict of arrays with leading ``m``).
    :param size: ``(m,)`` data points per group.
    :param kind: the data kind (:data:`DATA_KINDS`).
    :param eps: the prior's weight in ``params`` (``params`` less it are the groups' own
        statistics: successes and failures, total counts, counts per category).
    """

    inputs: np.ndarray
    mean: np.ndarray
    noise: np.ndarray
    params: dict
    size: np.ndarray
    kind: str
    eps: float


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
    if kind == "categorical" and not (y.ndim in (1, 2) and np.all((y >= 0) & (y == np.round(y)))):
        raise ValueError("categorical y must be (n,) category indices 0..K-1 or (n, K) counts per category, "
                         "non-negative integers")
    if kind == "covariance" and not (y.ndim == 2 and y.shape[1] >= 2):
        raise ValueError(f"covariance y must be (n, p) zero-mean vectors with p >= 2, not shape {y.shape}")
    if kind in ("binary", "counts") and y.ndim != 1:
        raise ValueError(f"{kind} y must be (n,), not shape {y.shape}")
    if kind == "binary" and not np.all((y == 0) | (y == 1)):
        raise ValueError(f"binary labels must be 0 or 1; y holds {np.unique(y[(y != 0) & (y != 1)])[:5]}")
    if kind == "counts" and not np.all((y >= 0) & (y == np.round(y))):
        raise ValueError("counts must be non-negative integers; y holds "
                         f"{np.unique(y[(y < 0) | (y != np.round(y))])[:5]}")


def _conjugate_params(kind, y, labels, m, size, eps, num_classes):
    """The conjugate posterior of each group under the kind's weak prior (module docstring)."""
    if kind == "binary":
        total = np.bincount(labels, weights=y, minlength=m)
        return {"concentration1": eps + total, "concentration0": eps + size - total}
    if kind == "counts":
        return {"concentration": eps + np.bincount(labels, weights=y, minlength=m), "rate": size}
    if kind == "categorical":
        if y.ndim == 1:
            k = int(y.max()) + 1 if num_classes is None else int(num_classes)
            if y.max() >= k:
                raise ValueError(f"y holds category {int(y.max())}, num_classes is {k}")
            y = np.eye(k)[y.astype(int)]
        counts = np.zeros((m, y.shape[1]))
        np.add.at(counts, labels, y)
        return {"concentration": eps + counts}
    p = y.shape[1]
    scatter = np.zeros((m, p, p))
    np.add.at(scatter, labels, y[:, :, None] * y[:, None, :])
    pooled = np.einsum("ni,nj->ij", y, y) / len(y)
    return {"concentration": size + eps - p - 1, "scale_matrix": eps * pooled + scatter}


def covariance_log_likelihood(count, scale, r):
    """``-count/2 log|expm(S)| - tr(scale expm(S)^-1)/2`` at ``r = vech(S)``: a group's Gaussian
    likelihood of its covariance ``expm(S)`` (module docstring)."""
    sigma = SymmetricMatrixExpTransform()(r)
    return -0.5 * count * jnp.linalg.slogdet(sigma)[1] - 0.5 * jnp.trace(jnp.linalg.solve(sigma, scale))


@precise_jit
def _covariance_likelihood_gaussian(count, scale):
    """Mean and noise of :func:`covariance_log_likelihood`'s Laplace approximation at its mode."""
    def one(n, psi):
        mode = SymmetricMatrixExpTransform().inv(psi / n)  # vech logm of the maximum-likelihood covariance
        return mode, jnp.linalg.inv(-jax.hessian(lambda r: covariance_log_likelihood(n, psi, r))(mode))

    return jax.vmap(one)(count, scale)


def pseudo_observations(inputs, y, kind: str, labels: Optional[np.ndarray] = None,
                        eps: Optional[float] = None, num_classes: Optional[int] = None) -> PseudoObservations:
    """The groups' Gaussian pseudo-observations (module docstring).

    :param inputs: ``(n, d)`` or ``(n,)`` inputs.
    :param y: ``(n,)`` binary labels or counts; for ``"categorical"`` ``(n,)`` category indices or
        ``(n, K)`` counts per category; for ``"covariance"`` ``(n, p)`` zero-mean vectors.
    :param kind: one of :data:`DATA_KINDS`.
    :param labels: ``(n,)`` integer group of each point (k-means clusters, users' own); default:
        points that share an input exactly (:func:`group_labels`); ``np.arange(n)`` keeps every
        point on its own.
    :param eps: the conjugate prior's weight (default :data:`EPS`).
    :param num_classes: ``K`` for category indices (default: the largest index + 1).
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
    centre = np.stack([np.bincount(labels, weights=x[:, j], minlength=m) for j in range(x.shape[1])], 1)
    centre /= size[:, None]
    params = _conjugate_params(kind, y, labels, m, size, eps, num_classes)
    if kind == "covariance":
        mean, noise = _covariance_likelihood_gaussian(jnp.asarray(size + eps), jnp.asarray(params["scale_matrix"]))
    else:
        mean, noise = get_family(*DATA_KINDS[kind]).to_gaussian({k: jnp.asarray(v) for k, v in params.items()})
    return PseudoObservations(centre, np.asarray(mean, np.float64), np.asarray(noise, np.float64), params, size,
                              kind, eps)
