r"""Last-layer Laplace for any JAX classifier: a Gaussian over the last layer's weights, and the
Gaussian over the logits it implies.

A classifier ``logits = phi(x) W + b`` (``phi`` any feature function: flax, equinox, a pure
function; ``W`` ``(D, K)``, ``b`` ``(K,)``) trained to its MAP weights gets a Gaussian posterior
over :math:`\theta = \mathrm{vec}([W; b])` (row-major: the index of :math:`\theta_{dk}` is
``d K + k``) from the curvature of the softmax cross-entropy plus a Gaussian prior
:math:`N(0, \lambda^{-1} I)` (Daxberger et al. 2021, "Laplace Redux"; thesis chapter 4):

.. math:: H = \sum_i (\tilde\phi_i \tilde\phi_i^\top) \otimes \Lambda_i, \qquad
          \Lambda_i = \mathrm{diag}(p_i) - p_i p_i^\top, \qquad
          \Sigma = (H + \lambda I)^{-1},

with :math:`\tilde\phi = [\phi, 1]`. Because the logits are linear in :math:`\theta`, the
generalised Gauss-Newton matrix *is* the exact Hessian of the negative log-likelihood here.
Three structures of :math:`H`:

- ``"full"``: :math:`H` itself (``P = (D+1) K`` square), its eigendecomposition;
- ``"kron"``: Kronecker factors :math:`H \approx A \otimes G`, :math:`A = \sum_i \tilde\phi_i
  \tilde\phi_i^\top`, :math:`G = \frac1n \sum_i \Lambda_i` (K-FAC, Martens & Grosse 2015;
  Ritter et al. 2018), each eigendecomposed, so
  :math:`\Sigma = (U_A \otimes U_G)\,\mathrm{diag}(1/(a_i g_j + \lambda))\,(U_A \otimes U_G)^\top`;
- ``"diag"``: the diagonal of :math:`H`.

The logits at a test input are Gaussian, :math:`N(\tilde\phi^\top W^*,\ J \Sigma J^\top)` with
:math:`J = \tilde\phi^\top \otimes I_K`, computed without the ``(n, K, P)`` Jacobian: for ``"kron"``
:math:`J\Sigma J^\top = U_G\,\mathrm{diag}_j\big(\sum_i c_i/(a_i g_j + \lambda)\big)\,U_G^\top`,
:math:`c = (U_A^\top\tilde\phi)^2`, ``O(D^2 + K^2)`` per input.

The prior precision :math:`\lambda` maximises the Laplace approximation of the marginal
likelihood at the MAP weights (MacKay 1992; Immer et al. 2021),

.. math:: \log Z(\lambda) = \log p(y \mid \theta^*) - \tfrac\lambda2 \lVert\theta^*\rVert^2
          + \tfrac P2 \log\lambda - \tfrac12 \log\lvert H + \lambda I\rvert,

in closed form for every :math:`\lambda` from the eigenvalues above (a grid of 401 values,
:math:`10^{-4}` to :math:`10^{4}`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["STRUCTURES", "Curvature", "LastLayerPosterior", "augment", "curvature", "log_evidence",
           "fit_last_layer", "logit_gaussian"]

STRUCTURES = ("full", "kron", "diag")
PRIOR_GRID = np.logspace(-4, 4, 401)
"""The prior precisions searched by :func:`fit_last_layer` (spacing 0.02 in log10)."""


class Curvature(NamedTuple):
    """The likelihood's curvature in one of :data:`STRUCTURES`, as eigenvalues and eigenvectors.

    ``full``: ``values (P,)``, ``vectors (P, P)``; ``kron``: ``values`` the pair ``(a (D+1,),
    g (K,))``, ``vectors`` the pair ``(U_A, U_G)``; ``diag``: ``values (D+1, K)``, ``vectors``
    ``None``. The structure is read from the fields (a property, so that the tuple holds only
    arrays and passes through ``jax.jit``)."""

    values: object
    vectors: object

    @property
    def structure(self) -> str:
        if self.vectors is None:
            return "diag"
        return "kron" if isinstance(self.values, tuple) else "full"


class LastLayerPosterior(NamedTuple):
    """The last layer's Gaussian posterior: MAP ``weights`` ``(D+1, K)`` (the bias as the last
    row), the likelihood's ``curvature`` and the ``prior_precision``."""

    weights: jax.Array
    curvature: Curvature
    prior_precision: jax.Array


def augment(features):
    r""":math:`\tilde\phi = [\phi, 1]`: ``(n, D) -> (n, D+1)``."""
    return jnp.concatenate([features, jnp.ones(features.shape[:-1] + (1,), features.dtype)], -1)


def curvature(features, weights, structure: str = "kron") -> Curvature:
    """The curvature of the summed softmax cross-entropy at ``weights`` (``(D+1, K)``) over the
    augmented ``features`` ``(n, D+1)`` (module docstring)."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {STRUCTURES}, not {structure!r}")
    p = jax.nn.softmax(features @ weights, -1)
    if structure == "diag":  # sum_i phi_id^2 (p_ik - p_ik^2)
        return Curvature((features**2).T @ (p - p**2), None)
    if structure == "kron":
        n = features.shape[0]
        lam = (jnp.diag(jnp.sum(p, 0)) - p.T @ p) / n
        a, ua = jnp.linalg.eigh(features.T @ features)
        g, ug = jnp.linalg.eigh(lam)
        return Curvature((jnp.maximum(a, 0.0), jnp.maximum(g, 0.0)), (ua, ug))
    d, k = weights.shape
    lam = jax.vmap(jnp.diag)(p) - p[:, :, None] * p[:, None, :]
    h = jnp.einsum("nd,ne,nkl->dkel", features, features, lam).reshape(d * k, d * k)
    values, vectors = jnp.linalg.eigh(0.5 * (h + h.T))
    return Curvature(jnp.maximum(values, 0.0), vectors)


def _eigenvalues(curv: Curvature):
    """All eigenvalues of the structured curvature, flat."""
    if curv.structure == "kron":
        a, g = curv.values
        return (a[:, None] * g[None, :]).reshape(-1)
    return jnp.reshape(curv.values, -1)


def log_evidence(features, labels, weights, curv: Curvature, prior_precision):
    """:math:`\\log Z(\\lambda)` of the module docstring, for a scalar or an array of ``lambda``."""
    log_lik = jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(features @ weights, -1), labels[:, None], 1))
    values = _eigenvalues(curv)
    lam = jnp.asarray(prior_precision)[..., None]
    p = values.size
    return (log_lik - 0.5 * lam[..., 0] * jnp.sum(weights**2) + 0.5 * p * jnp.log(lam[..., 0])
            - 0.5 * jnp.sum(jnp.log(values + lam), -1))


def fit_last_layer(features, labels, weight, bias, *, structure: str = "kron",
                   prior_precision: Optional[float] = None) -> LastLayerPosterior:
    """The last layer's posterior at its trained ``weight`` ``(D, K)`` and ``bias`` ``(K,)``, given
    the training ``features`` ``(n, D)`` (the feature function's output) and integer ``labels``;
    ``prior_precision`` by the marginal likelihood over :data:`PRIOR_GRID` unless given."""
    features = jnp.asarray(features)
    labels = jnp.asarray(labels)
    weight, bias = jnp.asarray(weight, features.dtype), jnp.asarray(bias, features.dtype)
    if features.ndim != 2 or weight.ndim != 2 or weight.shape[0] != features.shape[1]:
        raise ValueError(f"features must be (n, D) and weight (D, K) with the same D; got {features.shape} and "
                         f"{weight.shape} (an equinox Linear's weight is (K, D): pass its transpose)")
    if bias.shape != weight.shape[1:]:
        raise ValueError(f"bias must be ({weight.shape[1]},), not {bias.shape}")
    if labels.shape != features.shape[:1] or not jnp.issubdtype(labels.dtype, jnp.integer):
        raise ValueError(f"labels must be ({features.shape[0]},) integer class indices, not {labels.dtype} "
                         f"{labels.shape}")
    k = weight.shape[1]
    if labels.size and not (int(labels.min()) >= 0 and int(labels.max()) < k):
        raise ValueError(f"labels must be class indices 0..{k - 1} (the weight has {k} columns); they run "
                         f"{int(labels.min())}..{int(labels.max())}")
    for name, value in (("features", features), ("weight", weight), ("bias", bias)):
        bad = int(jnp.sum(~jnp.isfinite(value)))
        if bad:
            raise ValueError(f"{name} hold {bad} values that are not finite: check the inputs and the feature "
                             "function (a NaN here would make every prior precision look alike)")
    phi = augment(features)
    w = jnp.concatenate([weight, bias[None, :]], 0)
    curv = curvature(phi, w, structure)
    if prior_precision is None:
        grid = jnp.asarray(PRIOR_GRID, features.dtype)
        prior_precision = grid[jnp.argmax(log_evidence(phi, labels, w, curv, grid))]
    elif not prior_precision > 0:
        raise ValueError(f"prior_precision must be positive, not {prior_precision}")
    return LastLayerPosterior(w, curv, jnp.asarray(prior_precision, features.dtype))


def logit_gaussian(posterior: LastLayerPosterior, features):
    """``(mean (n, K), cov (n, K, K))`` of the logits at the (not augmented) ``features`` ``(n, D)``."""
    phi = augment(jnp.asarray(features, posterior.weights.dtype))
    mean = phi @ posterior.weights
    curv, lam = posterior.curvature, posterior.prior_precision
    if curv.structure == "diag":
        var = (phi**2) @ (1.0 / (curv.values + lam))
        return mean, jax.vmap(jnp.diag)(var)
    if curv.structure == "kron":
        (a, g), (ua, ug) = curv.values, curv.vectors
        c = (phi @ ua) ** 2  # (n, D+1)
        w = c @ (1.0 / (a[:, None] * g[None, :] + lam))  # (n, K)
        return mean, jnp.einsum("kj,nj,lj->nkl", ug, w, ug)
    d, k = posterior.weights.shape
    cov = (curv.vectors / (curv.values + lam)) @ curv.vectors.T
    return mean, jnp.einsum("nd,dkel,ne->nkl", phi, cov.reshape(d, k, d, k), phi)
