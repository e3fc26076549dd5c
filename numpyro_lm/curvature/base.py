r"""What a curvature is: the precision of the Laplace Gaussian, as data with operations.

A Laplace approximation is :math:`N(m, H^{-1})` with :math:`H` the negative Hessian of the
log density at the mode. Its consumers (matched marginals, copula draws, MVI refinement,
nested Laplace, the NUTS warm start, elliptical slice sampling, the diagnostics) never
need :math:`H^{-1}` itself, only these operations on it, which every curvature (a pytree:
it passes through ``jax.jit``, and a batch of them through ``jax.vmap``; the operations act
on one curvature) provides:

================  ==========================================================================
``dim``           ``D``, the number of coordinates
``positive()``    whether :math:`H` is numerically positive definite (a usable Gaussian)
``solve(v)``      :math:`H^{-1} v` for ``v`` of shape ``(..., D)``
``inv_sqrt(e)``   :math:`S e` with :math:`S S^\top = H^{-1}`: ``m + S e`` with ``e ~ N(0, I)``
                  is a draw
``whiten(d)``     :math:`S^{-1} d`, so :math:`\log N(m + d) = -\tfrac12|S^{-1}d|^2
                  + \tfrac12\log\det H - \tfrac D2\log 2\pi`
``logdet()``      :math:`\log\det H`
``variance()``    :math:`\mathrm{diag}(H^{-1})`, the marginal variances
``block(index)``  :math:`(H^{-1})_{II}` for an integer index of shape ``(..., k)``:
                  ``(..., k, k)``, e.g. one site's covariance
``spectrum()``    ``(w, Q)``: eigenvalues of :math:`H` ascending and their eigenvectors
================  ==========================================================================

Implementations: :class:`~numpyro_lm.curvature.dense.DenseCurvature` (an eigendecomposition;
the joint fit's) and :class:`~numpyro_lm.curvature.dense.CholeskyCurvature` (a Cholesky
factor, cheaper to form; nested Laplace's conditionals). Diagonal, low-rank and plated
structures slot in by providing the same operations. :class:`Gaussian` pairs a mean with
a curvature.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from ..runtime.random import normal_rows

__all__ = ["Curvature", "Gaussian", "block_by_solves", "covariance", "singular_floor", "eigenvalue_range", "power_extremes", "PEAKED"]

PEAKED = 1e12
"""A curvature beyond this in the basis (posterior SDs of 1e-6) is no posterior's: a search run
into a collapsing scale (the largest seen in a model with 2 10^6 observations was 5e5). A dense
curvature with a diagonal entry beyond it is not positive (``DenseCurvature.positive``): its
Jacobi scaling would otherwise make the funnel's Hessian as well conditioned as any."""


@runtime_checkable
class Curvature(Protocol):
    """The operations every curvature provides (module docstring)."""

    @property
    def dim(self) -> int: ...

    def positive(self): ...

    def solve(self, v): ...

    def inv_sqrt(self, eps): ...

    def whiten(self, d): ...

    def logdet(self): ...

    def variance(self): ...

    def block(self, index): ...

    def spectrum(self): ...


def singular_floor(eigenvalues, eps=None):
    """Eigenvalues of a symmetric matrix below this are numerically zero.

    Rounding alone can make a zero eigenvalue slightly positive: the typical rounding
    error of an eigenvalue is ``eps * max``, ``sqrt(D)`` of them summed at random. ``eps``:
    the machine epsilon of the precision the eigenvalues were computed in (default: their
    dtype's; a decomposition made in float64 and kept in float32 passes float64's).
    """
    d = eigenvalues.shape[-1]
    eps = jnp.finfo(eigenvalues.dtype).eps if eps is None else eps
    return jnp.sqrt(d) * eps * jnp.max(jnp.abs(eigenvalues))


def eigenvalue_range(curvature):
    """``(lowest, highest)`` eigenvalue of ``H``: exact from ``spectrum()``, or the structured
    curvature's ``extreme_eigenvalues()`` estimate where a full spectrum would cost ``O(D^3)``."""
    if hasattr(curvature, "extreme_eigenvalues"):
        return curvature.extreme_eigenvalues()
    w = curvature.spectrum()[0]
    return w[0], w[-1]


def power_extremes(matvec, solve, dim: int, dtype, positive, num_iter: int = 50):
    """``(lowest, highest)`` eigenvalue estimates of a positive definite ``H`` given as
    ``matvec`` and ``solve``: power iteration on ``H`` and on ``H^-1`` from a fixed start
    (lower bounds on the largest eigenvalue and on the condition number, enough for a
    diagnostic); the lowest is ``-inf`` where ``positive`` is false."""
    v0 = jnp.cos(jnp.arange(dim, dtype=dtype) * 0.7548776662) + 1.5

    def power(op):
        def body(_, v):
            w = op(v)
            return w / jnp.linalg.norm(w)

        v = jax.lax.fori_loop(0, num_iter, body, v0 / jnp.linalg.norm(v0))
        return v @ op(v)

    high = power(matvec)
    low = 1.0 / power(solve)
    return jnp.where(positive, low, -jnp.inf), high


def block_by_solves(solve, dim: int, index, dtype):
    """``(H^-1)_{II}`` ``(..., k, k)`` for ``index (..., k)`` by one solve per index with its unit
    vector (a few coordinates, a site's): for curvatures whose inverse has no cheap rows."""
    index = jnp.asarray(index)
    flat, k = index.reshape(-1), index.shape[-1]
    cols = solve(jax.nn.one_hot(flat, dim, dtype=dtype))[:, flat]
    blocks = jnp.stack([cols[s:s + k, s:s + k] for s in np.arange(flat.shape[0] // k) * k])
    return blocks.reshape(index.shape[:-1] + (k, k))


def covariance(curvature) -> jnp.ndarray:
    """The dense ``D x D`` covariance :math:`H^{-1}`: for small, genuinely dense outputs only
    (a family's exact map, a nested conditional, :attr:`Gaussian.cov`)."""
    return curvature.block(np.arange(curvature.dim))


class Gaussian(NamedTuple):
    """The Gaussian ``N(mean, H^-1)`` over the flat basis coordinates, ``H`` a curvature.

    ``cov`` and ``precision`` are dense conveniences for users and small models; the
    package itself works through the curvature's operations.
    """

    mean: jnp.ndarray
    curvature: Curvature

    @property
    def cov(self):
        """The dense covariance matrix (``NaN`` where the curvature is not positive definite)."""
        return covariance(self.curvature)

    @property
    def precision(self):
        """The dense precision matrix ``H``."""
        return self.curvature.precision

    def sample(self, rng_key, num_samples: int):
        """``(num_samples, D)`` draws, reproducible from ``rng_key`` (see :func:`numpyro_lm.runtime.random.normal_rows`)."""
        eps = normal_rows(rng_key, num_samples, self.mean.shape[-1:], self.mean.dtype)
        return self.mean + self.curvature.inv_sqrt(eps)

    def log_prob(self, x):
        """``log N(x; mean, H^-1)`` for ``x`` of shape ``(..., D)``."""
        white = self.curvature.whiten(x - self.mean)
        d = self.mean.shape[-1]
        return -0.5 * (jnp.sum(white**2, axis=-1) - self.curvature.logdet() + d * jnp.log(2.0 * jnp.pi))

