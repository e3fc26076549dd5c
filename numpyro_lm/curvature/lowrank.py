r"""A structured curvature plus a low-rank update: :math:`H = M + Q B Q^\top`.

Models whose latent coordinates outnumber their observations (a regression with
:math:`p = 10^4` coefficients and :math:`n = 200` data points, a wide network layer) have a
Hessian that no plate keeps sparse: every coefficient meets every other through
:math:`X\beta`. It is still cheap: the prior's Hessian is block-arrowhead (the plate's
entries are independent a priori), and the likelihood's has rank at most about the number of
observations. With :math:`M` a positive definite structured precision (here
:class:`~numpyro_lm.curvature.arrowhead.ArrowheadCurvature`) with square root
:math:`S S^\top = M^{-1}` and :math:`Q` a :math:`D \times m` orthonormal basis of the update's
range (:math:`B` symmetric, not necessarily positive),

.. math:: H = S^{-\top}\,(I + Z B Z^\top)\,S^{-1}, \qquad Z = S^\top Q,

and with the thin QR factorisation :math:`Z = Q_Z R_Z` and the eigendecomposition
:math:`R_Z B R_Z^\top = U \operatorname{diag}(\mu) U^\top`, :math:`Y = Q_Z U` (orthonormal,
:math:`D \times m`):

.. math:: H = S^{-\top}\,(I + Y \operatorname{diag}(\mu) Y^\top)\,S^{-1},

so every function of :math:`H` is one of the diagonal :math:`1 + \mu` on the range of
:math:`Y` and of :math:`M` through :math:`S` (Woodbury's identity in symmetric form; Golub
and Van Loan, *Matrix Computations*, 4th ed., sec. 2.1.4; Halko, Martinsson and Tropp 2011,
sec. 5 for the low-rank factorisation):

- :math:`H^{-1} v = S\,(I + Y\,\mathrm{diag}((1+\mu)^{-1} - 1)\,Y^\top)\,S^\top v`;
- draws :math:`S\,(I + Y\,\mathrm{diag}((1+\mu)^{-1/2} - 1)\,Y^\top)\,e`;
- whitening :math:`(I + Y\,\mathrm{diag}((1+\mu)^{1/2} - 1)\,Y^\top)\,S^{-1} d`;
- :math:`\log\det H = \log\det M + \log\det(I + B\,Q^\top M^{-1} Q)` (Sylvester's
  determinant identity: smooth in :math:`M` and :math:`B`, so the nested fit's mean shift can
  differentiate it), equal to :math:`\log\det M + \sum \log(1 + \mu)`;
- the covariance's entries :math:`M^{-1}_{ik} + \sum_l (SY)_{il} c_l (SY)_{kl}` with
  :math:`c = (1+\mu)^{-1} - 1`: variances and any block without forming :math:`H^{-1}`.

:math:`H` is positive definite exactly where :math:`1 + \mu > 0`; time
:math:`O(D m^2 + \text{cost of } M)`, memory :math:`O(D m)`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from .base import Curvature, power_extremes

__all__ = ["LowRankUpdateCurvature", "sqrt_transpose"]


def sqrt_transpose(base: Curvature, v):
    """:math:`S^\\top v` of a curvature with square root :math:`S` (``inv_sqrt``):
    :math:`S^{-1} M^{-1} v = S^\\top v`."""
    return base.whiten(base.solve(v))


def _rows(v):
    """``(D, m)`` columns as ``(m, D)`` rows (the curvature operations act on the last axis)."""
    return jnp.swapaxes(v, -1, -2)


class LowRankUpdateCurvature(NamedTuple):
    """:math:`H = M + Q B Q^\\top` (module docstring): ``base`` is :math:`M`, ``q (D, m)``
    orthonormal, ``b (m, m)`` symmetric; ``y (D, m)`` and ``mu (m,)`` the factorisation of
    :meth:`from_update`."""

    base: Curvature
    q: jnp.ndarray
    b: jnp.ndarray
    y: jnp.ndarray
    mu: jnp.ndarray

    @classmethod
    def from_update(cls, base: Curvature, q, b) -> "LowRankUpdateCurvature":
        b = 0.5 * (b + b.T)
        z = _rows(sqrt_transpose(base, _rows(q)))  # S' Q
        qz, rz = jnp.linalg.qr(z)
        mu, u = jnp.linalg.eigh(rz @ b @ rz.T)
        return cls(base, q, b, qz @ u, mu)

    def modified(self) -> "LowRankUpdateCurvature":
        """The positive definite :math:`S^{-\\top}(I + Y(|1+\\mu| - 1)Y^\\top)S^{-1}` (floored at
        ``eps``): the saddle-free counterpart used for a descent step where :math:`H` is not."""
        mu = self.absolute_mu()
        # the change S^-T Y diag(mu' - mu) Y' S^-1 lies in the range of Q (S^-T Y = M S Y and
        # S Y spans S S' range(Q)): B gains W diag(mu' - mu) W' with W = Q' S^-T Y
        w = self.base.whiten(_rows(self.q)) @ self.y
        return self._replace(b=self.b + (w * (mu - self.mu)) @ w.T, mu=mu)

    def absolute_mu(self):
        """:meth:`modified`'s ``mu``: ``|1 + mu| - 1``, floored at ``eps`` (all a solve needs)."""
        floor = jnp.finfo(self.mu.dtype).eps * jnp.maximum(jnp.max(jnp.abs(1.0 + self.mu), initial=1.0), 1.0)
        return jnp.maximum(jnp.abs(1.0 + self.mu), floor) - 1.0

    @property
    def dim(self) -> int:
        return self.q.shape[-2]

    def _scaled(self, v, power):
        """``(I + Y diag((1+mu)^power - 1) Y') v`` for ``v (..., D)``."""
        c = (1.0 + self.mu) ** power - 1.0
        return v + ((v @ self.y) * c) @ self.y.T

    def positive(self):
        one = 1.0 + self.mu
        floor = jnp.sqrt(one.shape[-1]) * jnp.finfo(one.dtype).eps * jnp.max(jnp.abs(one), initial=1.0)
        return self.base.positive() & jnp.all(one > floor) & jnp.all(jnp.isfinite(self.y))

    def solve(self, v):
        return self.base.inv_sqrt(self._scaled(sqrt_transpose(self.base, v), -1.0))

    def inv_sqrt(self, eps):
        return self.base.inv_sqrt(self._scaled(eps, -0.5))

    def whiten(self, d):
        return self._scaled(self.base.whiten(d), 0.5)

    def logdet(self):
        m = self.q.shape[-1]
        inner = self.q.T @ _rows(self.base.solve(_rows(self.q)))  # Q' M^-1 Q
        return self.base.logdet() + jnp.linalg.slogdet(jnp.eye(m, dtype=self.b.dtype) + self.b @ inner)[1]

    def _update_rows(self):
        """``(S Y (D, m), c (m,))``: :math:`H^{-1} = M^{-1} + (SY) \\mathrm{diag}(c) (SY)^\\top`."""
        return _rows(self.base.inv_sqrt(_rows(self.y))), 1.0 / (1.0 + self.mu) - 1.0

    def _usable(self, x):
        return jnp.where(self.positive(), x, jnp.nan)

    def variance(self):
        sy, c = self._update_rows()
        return self._usable(self.base.variance() + jnp.sum(sy**2 * c, axis=-1))

    def block(self, index):
        sy, c = self._update_rows()
        rows = sy[jnp.asarray(index)]
        return self._usable(self.base.block(index) + (rows * c) @ jnp.swapaxes(rows, -1, -2))

    def matvec(self, v):
        """``H v`` for ``v (..., D)``."""
        return self.base.matvec(v) + ((v @ self.q) @ self.b) @ self.q.T

    @property
    def precision(self):
        """The dense precision (small problems and tests only: ``D x D``)."""
        return self.matvec(jnp.eye(self.dim, dtype=self.b.dtype))

    def spectrum(self):
        """The dense eigendecomposition: small problems only (errors, tests)."""
        return jnp.linalg.eigh(self.precision)

    def extreme_eigenvalues(self, num_iter: int = 50):
        """``(lowest, highest)`` eigenvalue estimates (:func:`~numpyro_lm.curvature.base.power_extremes`)."""
        return power_extremes(self.matvec, self.solve, self.dim, self.b.dtype, self.positive(), num_iter)

    def diagonal(self):
        """The precision's diagonal ``(D,)``."""
        return self.base.diagonal() + jnp.sum((self.q @ self.b) * self.q, axis=-1)

    def uncoupled(self):
        """``(D,)``: coordinates coupled to no other (by the base, and outside the update's range)."""
        return self.base.uncoupled() & jnp.all(self.q == 0, axis=-1)

    def failing_directions(self):
        """``(D,)``: each coordinate's share of the directions where :math:`H` is not
        positive (``1 + mu`` at or below zero): the columns of :math:`SY` (in whitened
        coordinates :math:`w` the quadratic form is :math:`w^\\top (I + Y\\mu Y^\\top) w`, :math:`x = S w`)."""
        bad = (1.0 + self.mu) <= 0
        directions = _rows(self.base.inv_sqrt(_rows(self.y)))
        weights = jnp.sum(jnp.where(bad, directions**2, 0.0), axis=-1)
        return weights / jnp.maximum(jnp.sum(weights), jnp.finfo(weights.dtype).tiny)
