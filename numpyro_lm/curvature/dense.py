r"""Dense curvatures: the precision as a full ``D x D`` matrix, factorised once.

:class:`DenseCurvature` keeps the eigendecomposition :math:`H = Q\,\mathrm{diag}(w)\,Q^\top`:
every operation is exact, and eigenvalues below :func:`~numpyro_lm.curvature.base.singular_floor`
count as zero, so a numerically singular :math:`H` (a direction the data do not identify)
gives ``NaN`` variances and ``positive() == False`` instead of a variance of 1e16.
:math:`S = Q\,\mathrm{diag}(w^{-1/2})`.

:class:`CholeskyCurvature` keeps the Cholesky factor :math:`H = L L^\top`, about a quarter
of the cost of an eigendecomposition to form; :math:`S = L^{-\top}`. Its ``spectrum()``
decomposes :math:`H` when asked. ``NaN`` in the factor marks a matrix that is not positive
definite.

Both cost :math:`O(D^3)` to form and :math:`O(D^2)` memory: the structures of large models
(diagonal, low rank, plated) implement the same operations.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from .linalg import cholesky, eigh, solve_triangular

from .base import singular_floor

__all__ = ["DenseCurvature", "CholeskyCurvature"]


def _rows(matrix, index):
    """``matrix[index]`` for an index of shape ``(..., k)``: ``(..., k, D)``."""
    return jnp.take(matrix, jnp.asarray(index), axis=0)


class DenseCurvature(NamedTuple):
    """A precision matrix with its eigendecomposition (module docstring)."""

    precision: jnp.ndarray  # (D, D)
    eigenvalues: jnp.ndarray  # (D,) ascending
    eigenvectors: jnp.ndarray  # (D, D), columns

    @classmethod
    def from_precision(cls, precision) -> "DenseCurvature":
        precision = 0.5 * (precision + precision.T)
        w, q = eigh(precision)
        return cls(precision, w, q)

    @classmethod
    def from_covariance(cls, cov) -> "DenseCurvature":
        cov = 0.5 * (cov + cov.T)
        v, q = eigh(cov)
        # the precision's eigenvalues ascending (1 / the covariance's, reversed)
        w, q = 1.0 / v[::-1], q[:, ::-1]
        return cls((q * w) @ q.T, w, q)

    @property
    def dim(self) -> int:
        return self.eigenvalues.shape[-1]

    def _inverse(self):
        """``1/w``, ``NaN`` where ``w`` is numerically zero or negative."""
        w = self.eigenvalues
        return jnp.where(w > singular_floor(w), 1.0 / w, jnp.nan)

    def positive(self):
        return jnp.all(self.eigenvalues > singular_floor(self.eigenvalues))

    def solve(self, v):
        q = self.eigenvectors
        return ((v @ q) * self._inverse()) @ q.T

    def inv_sqrt(self, eps):
        return (eps * jnp.sqrt(self._inverse())) @ self.eigenvectors.T

    def whiten(self, d):
        return (d @ self.eigenvectors) * jnp.sqrt(self.eigenvalues)

    def logdet(self):
        return jnp.sum(jnp.log(self.eigenvalues))

    def variance(self):
        return jnp.square(self.eigenvectors) @ self._inverse()

    def block(self, index):
        rows = _rows(self.eigenvectors, index)
        return (rows * self._inverse()) @ jnp.swapaxes(rows, -1, -2)

    def spectrum(self):
        return self.eigenvalues, self.eigenvectors


class CholeskyCurvature(NamedTuple):
    """A precision matrix with its lower Cholesky factor (module docstring)."""

    precision: jnp.ndarray  # (D, D)
    chol: jnp.ndarray  # (D, D) lower; NaN where the precision is not positive definite

    @classmethod
    def from_precision(cls, precision) -> "CholeskyCurvature":
        precision = 0.5 * (precision + precision.T)
        return cls(precision, cholesky(precision))

    @property
    def dim(self) -> int:
        return self.chol.shape[-1]

    def _inverse_factor(self):
        """``L^-1`` (lower): ``H^-1 = L^-T L^-1``."""
        return solve_triangular(self.chol, jnp.eye(self.dim, dtype=self.chol.dtype), lower=True)

    def positive(self):
        diagonal = jnp.diagonal(self.chol)
        return jnp.all(jnp.isfinite(self.chol)) & jnp.all(diagonal > 0)

    def solve(self, v):
        flat = v.reshape((-1, self.dim)).T
        x = solve_triangular(self.chol.T, solve_triangular(self.chol, flat, lower=True), lower=False)
        return x.T.reshape(v.shape)

    def inv_sqrt(self, eps):
        flat = eps.reshape((-1, self.dim))
        out = solve_triangular(self.chol.T, flat.T, lower=False).T
        return out.reshape(eps.shape)

    def whiten(self, d):
        return d @ self.chol

    def logdet(self):
        return 2.0 * jnp.sum(jnp.log(jnp.diagonal(self.chol)))

    def variance(self):
        return jnp.sum(jnp.square(self._inverse_factor()), axis=0)

    def block(self, index):
        cols = _rows(self._inverse_factor().T, index)  # (..., k, D): columns of L^-1
        return cols @ jnp.swapaxes(cols, -1, -2)

    def spectrum(self):
        return eigh(self.precision)
