r"""Dense curvatures: the precision as a full ``D x D`` matrix, factorised once.

:class:`DenseCurvature` keeps the eigendecomposition of the Jacobi-scaled precision
:math:`H' = D H D = Q\,\mathrm{diag}(w)\,Q^\top` with :math:`D = \mathrm{diag}(H)^{-1/2}`
(``scale``): every operation is exact, and eigenvalues of :math:`H'` below
:func:`~numpyro_lm.curvature.base.singular_floor` count as zero, so a numerically singular
:math:`H` (a direction the data do not identify) gives ``NaN`` variances and
``positive() == False`` instead of a variance of 1e16. :math:`S = D\,Q\,\mathrm{diag}(w^{-1/2})`.

Why scaled: a float32 Hessian carries a rounding of about ``eps`` relative to each entry, and a
diagonal scaling keeps that (it is exact up to one rounding), but the eigenvalues of an
unscaled :math:`H` are only resolved to ``eps`` times the largest. A regression whose
coefficients live on different scales (a predictor in the hundreds beside one of order one) has
eigenvalues from 6.8 to 1e8: in float32 its smallest is round-off and the fit was refused as
numerically singular, though :math:`H'` (condition number 1e4 there) resolves it (van der Sluis
1969: the Jacobi scaling is within a factor ``D`` of the best diagonal one). ``spectrum()`` is
that of :math:`H` itself, decomposed when asked (diagnostics, the eigenbasis of MVI's ``eig``);
``scaled_condition()`` is the condition number that precision limits.

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

from .base import PEAKED, singular_floor

__all__ = ["DenseCurvature", "CholeskyCurvature"]


def _eps(w):
    """The machine epsilon of ``w``'s dtype, as an array (a leaf that follows vmap and casts)."""
    return jnp.asarray(jnp.finfo(w.dtype).eps, w.dtype)


def _rows(matrix, index):
    """``matrix[index]`` for an index of shape ``(..., k)``: ``(..., k, D)``."""
    return jnp.take(matrix, jnp.asarray(index), axis=0)


class DenseCurvature(NamedTuple):
    """A precision matrix with its eigendecomposition (module docstring)."""

    precision: jnp.ndarray  # (D, D)
    eigenvalues: jnp.ndarray  # (D,) ascending, of the scaled precision D H D
    eigenvectors: jnp.ndarray  # (D, D), columns, of the scaled precision
    scale: jnp.ndarray  # (D,) diag(H)^-1/2, or sqrt(diag(cov)) from a covariance (1 where not positive)
    # () the machine epsilon of the precision the decomposition was made in, which judges its
    # eigenvalues (singular_floor); None: the arrays' own dtype's
    eps: jnp.ndarray = None

    @classmethod
    def from_precision(cls, precision) -> "DenseCurvature":
        precision = 0.5 * (precision + precision.T)
        diagonal = jnp.diagonal(precision)
        good = jnp.isfinite(diagonal) & (diagonal > 0)
        scale = jnp.where(good, 1.0 / jnp.sqrt(jnp.where(good, diagonal, 1.0)), 1.0)
        w, q = eigh(scale[:, None] * precision * scale[None, :])
        return cls(precision, w, q, scale, _eps(w))

    @classmethod
    def from_covariance(cls, cov) -> "DenseCurvature":
        """From a covariance ``C``: its correlation matrix ``R = C / sqrt(c_i c_j)`` is decomposed,
        and ``H' = R^-1`` with ``scale = sqrt(diag C)`` (then ``H = D^-1 H' D^-1``)."""
        cov = 0.5 * (cov + cov.T)
        diagonal = jnp.diagonal(cov)
        good = jnp.isfinite(diagonal) & (diagonal > 0)
        scale = jnp.where(good, jnp.sqrt(jnp.where(good, diagonal, 1.0)), 1.0)
        v, q = eigh(cov / scale[:, None] / scale[None, :])
        # the scaled precision's eigenvalues ascending (1 / the correlation's, reversed)
        w, q = 1.0 / v[::-1], q[:, ::-1]
        return cls((q * w) @ q.T / scale[:, None] / scale[None, :], w, q, scale, _eps(w))

    @property
    def dim(self) -> int:
        return self.eigenvalues.shape[-1]

    def _inverse(self):
        """``1/w``, ``NaN`` where ``w`` is numerically zero or negative."""
        w = self.eigenvalues
        return jnp.where(w > singular_floor(w, self.eps), 1.0 / w, jnp.nan)

    def positive(self):
        # the scaled eigenvalues' floor, and no curvature beyond PEAKED (a collapsing scale) where
        # the diagonal spans more than the precision resolves (as an unscaled decomposition saw it)
        diagonal = jnp.abs(jnp.diagonal(self.precision))
        largest = jnp.max(diagonal)
        peaked = (largest > PEAKED) & (jnp.min(diagonal) < singular_floor(diagonal, self.eps))
        return jnp.all(self.eigenvalues > singular_floor(self.eigenvalues, self.eps)) & ~peaked

    def solve(self, v):
        q = self.eigenvectors
        return (((v * self.scale) @ q) * self._inverse()) @ q.T * self.scale

    def inv_sqrt(self, eps):
        return ((eps * jnp.sqrt(self._inverse())) @ self.eigenvectors.T) * self.scale

    def whiten(self, d):
        return ((d / self.scale) @ self.eigenvectors) * jnp.sqrt(self.eigenvalues)

    def logdet(self):
        return jnp.sum(jnp.log(self.eigenvalues)) - 2.0 * jnp.sum(jnp.log(self.scale))

    def variance(self):
        return jnp.square(self.eigenvectors) @ self._inverse() * jnp.square(self.scale)

    def block(self, index):
        rows = _rows(self.eigenvectors * self.scale[:, None], index)
        return (rows * self._inverse()) @ jnp.swapaxes(rows, -1, -2)

    def spectrum(self):
        """Eigenvalues (ascending) and eigenvectors of ``H`` itself (module docstring)."""
        return eigh(self.precision)

    def scaled_condition(self):
        """The condition number of the scaled precision ``D H D`` (``inf`` where not positive)."""
        w = self.eigenvalues
        return jnp.where(self.positive(), w[-1] / w[0], jnp.inf)


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
