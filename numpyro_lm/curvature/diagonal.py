r"""Diagonal curvature with an optional dense block: independent coordinates but for a few.

The summary of a large nested fit (:mod:`numpyro_lm.approximations.nested`): its mixture over the
hyperparameters is kept for draws and weights, and each coordinate's mean and variance
(:math:`p_i = 1/\mathrm{Var}(x_i)`) feed the matched families; the few coordinates of
sites matched per event vector (a vector of fixed effects, a Dirichlet) keep their joint
covariance ``block_cov`` over ``block_index``, which their families need. Cost :math:`O(D + m^3)`
for ``m`` block coordinates. The square root is :math:`\mathrm{diag}(p^{-1/2})` off the
block and the block covariance's Cholesky factor on it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

__all__ = ["DiagonalCurvature"]


class DiagonalCurvature(NamedTuple):
    """A diagonal precision with an optional dense covariance block (module docstring);
    ``NaN`` variances where ``p`` is not positive."""

    precision_diagonal: jnp.ndarray  # (D,); its entries on block_index are not used
    block_index: Optional[jnp.ndarray] = None  # (m,) coordinates with a dense covariance
    block_cov: Optional[jnp.ndarray] = None  # (m, m)

    @property
    def dim(self) -> int:
        return self.precision_diagonal.shape[-1]

    def _has_block(self) -> bool:
        return self.block_index is not None and self.block_index.shape[-1] > 0

    def _chol(self):
        return jnp.linalg.cholesky(0.5 * (self.block_cov + self.block_cov.T))

    def _inverse(self):
        p = self.precision_diagonal
        return jnp.where(p > 0, 1.0 / p, jnp.nan)

    def positive(self):
        p = self.precision_diagonal
        if self._has_block():
            p = p.at[self.block_index].set(1.0)
        ok = jnp.all(jnp.isfinite(p)) & jnp.all(p > 0)
        if self._has_block():
            chol = self._chol()
            ok = ok & jnp.all(jnp.isfinite(chol)) & jnp.all(jnp.diagonal(chol) > 0)
        return ok

    def solve(self, v):
        out = v * self._inverse()
        if self._has_block():
            out = out.at[..., self.block_index].set(v[..., self.block_index] @ self.block_cov)
        return out

    def inv_sqrt(self, eps):
        out = eps * jnp.sqrt(self._inverse())
        if self._has_block():
            out = out.at[..., self.block_index].set(eps[..., self.block_index] @ self._chol().T)
        return out

    def whiten(self, d):
        out = d * jnp.sqrt(self.precision_diagonal)
        if self._has_block():
            part = d[..., self.block_index]
            white = solve_triangular(self._chol(), part.reshape((-1, part.shape[-1])).T, lower=True).T
            out = out.at[..., self.block_index].set(white.reshape(part.shape))
        return out

    def logdet(self):
        log_p = jnp.log(self.precision_diagonal)
        if not self._has_block():
            return jnp.sum(log_p)
        return jnp.sum(log_p.at[self.block_index].set(0.0)) - 2.0 * jnp.sum(jnp.log(jnp.diagonal(self._chol())))

    def variance(self):
        var = self._inverse()
        if self._has_block():
            var = var.at[self.block_index].set(jnp.diagonal(self.block_cov))
        return var

    def block(self, index):
        index = jnp.asarray(index)
        var = self.variance()[index]
        same = index[..., :, None] == index[..., None, :]
        cov = jnp.where(same, var[..., :, None], 0.0)
        if self._has_block():
            where = jnp.full(self.dim, -1, jnp.int32).at[self.block_index].set(
                jnp.arange(self.block_index.shape[-1], dtype=jnp.int32))[index]
            both = (where[..., :, None] >= 0) & (where[..., None, :] >= 0)
            dense = self.block_cov[jnp.maximum(where[..., :, None], 0), jnp.maximum(where[..., None, :], 0)]
            cov = jnp.where(both, dense, cov)
        return cov

    def spectrum(self):
        """The dense eigendecomposition (small problems only)."""
        return jnp.linalg.eigh(jnp.linalg.inv(self.block(jnp.arange(self.dim))))

    def extreme_eigenvalues(self):
        p = self.precision_diagonal
        if not self._has_block():
            return jnp.min(p), jnp.max(p)
        w = 1.0 / jnp.linalg.eigvalsh(self.block_cov)
        keep = jnp.ones(self.dim, bool).at[self.block_index].set(False)
        low = jnp.minimum(jnp.min(jnp.where(keep, p, jnp.inf)), jnp.min(w))
        high = jnp.maximum(jnp.max(jnp.where(keep, p, -jnp.inf)), jnp.max(w))
        return low, high
