r"""A banded field with a dense border: a latent Markov field beside a few global coordinates.

A time series' trend next to an intercept and regression coefficients, or a spatial field
next to its fixed effects, has a precision that, with the field's :math:`n` coordinates
first, reads

.. math:: H = \begin{pmatrix} F & B \\ B^\top & C \end{pmatrix},

:math:`F` banded (:class:`~numpyro_lm.curvature.banded.BandedCurvature`), :math:`B` the
field's :math:`n \times G` coupling to the :math:`G` globals, :math:`C` their block. The
elimination of the block-arrowhead (:mod:`.arrowhead`) carries over with :math:`F` in place
of the block-diagonal :math:`A`: :math:`U = F^{-1} B` (:math:`G` banded solves),
:math:`S = C - B^\top U = L_S L_S^\top`, and

- solves: :math:`y = F^{-1} v_F`, :math:`x_G = S^{-1}(v_G - B^\top y)`, :math:`x_F = y - U x_G`;
- draws: :math:`x_G = L_S^{-\top} e_G`, :math:`x_F = L_F^{-\top} e_F - U x_G`;
- whitening: :math:`w_F = L_F^\top (d_F + U d_G)`, :math:`w_G = L_S^\top d_G`;
- :math:`\log\det H = \log\det F + \log\det S`;
- variances: the field's :math:`\mathrm{diag}(F^{-1})` (Takahashi) plus the squared rows of
  :math:`U L_S^{-\top}`, the globals' :math:`\mathrm{diag}(S^{-1})`;

in :math:`O(n (w^2 + w G + G^2) + G^3)` (the block-tridiagonal-arrowhead pattern of INLA-type
solvers; sTiles, Serinv).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .base import block_by_solves, power_extremes
from .banded import BandedCurvature
from .banded import weighted_inverse as weighted_field_inverse

__all__ = ["BandedArrowheadCurvature", "weighted_inverse"]


class BandedArrowheadCurvature(NamedTuple):
    """``field``: the banded block :math:`F` over the flat coordinates ``field_index (n,)``;
    ``global_index (G,)`` the others; ``b (n, G)``, ``c (G, G)`` the precision's other blocks;
    ``u (n, G)`` and ``s_chol (G, G)`` the elimination's (module docstring)."""

    field: BandedCurvature
    field_index: jnp.ndarray
    global_index: jnp.ndarray
    b: jnp.ndarray
    c: jnp.ndarray
    u: jnp.ndarray
    s_chol: jnp.ndarray

    @classmethod
    def from_blocks(cls, field: BandedCurvature, field_index, global_index, b, c) -> "BandedArrowheadCurvature":
        c = 0.5 * (c + c.T)
        u = field.solve(b.T).T  # F^-1 B, one banded solve per global
        s_chol = jnp.linalg.cholesky(c - b.T @ u)
        return cls(field, field_index, global_index, b, c, u, s_chol)

    @property
    def dim(self) -> int:
        return self.field_index.shape[-1] + self.global_index.shape[-1]

    def _split(self, v):
        return v[..., self.field_index], v[..., self.global_index]

    def _join(self, f, g):
        out = jnp.zeros(f.shape[:-1] + (self.dim,), jnp.result_type(f, g))
        return out.at[..., self.field_index].set(f).at[..., self.global_index].set(g)

    @property
    def precision(self):
        """The dense precision (tests and small models only)."""
        return self.matvec(jnp.eye(self.dim, dtype=self.b.dtype))

    def matvec(self, v):
        f, g = self._split(v)
        return self._join(self.field.matvec(f) + g @ self.b.T, f @ self.b + g @ self.c.T)

    def positive(self):
        eps = jnp.finfo(self.c.dtype).eps
        pivots = jnp.diagonal(self.s_chol) ** 2
        floor = jnp.sqrt(pivots.shape[-1]) * eps * jnp.max(jnp.abs(jnp.diagonal(self.c)), initial=0.0)
        return self.field.positive() & jnp.all(jnp.isfinite(self.s_chol)) & jnp.all(pivots > floor)

    def solve(self, v):
        f, g = self._split(v)
        y = self.field.solve(f)
        xg = jax.scipy.linalg.cho_solve((self.s_chol, True), (g - y @ self.b).T).T
        return self._join(y - xg @ self.u.T, xg)

    def inv_sqrt(self, eps):
        f, g = self._split(eps)
        xg = jax.scipy.linalg.solve_triangular(self.s_chol, g.T, lower=True, trans=1).T
        return self._join(self.field.inv_sqrt(f) - xg @ self.u.T, xg)

    def whiten(self, d):
        f, g = self._split(d)
        return self._join(self.field.whiten(f + g @ self.u.T), g @ self.s_chol)

    def logdet(self):
        return self.field.logdet() + 2.0 * jnp.sum(jnp.log(jnp.diagonal(self.s_chol)))

    def _usable(self, x):
        return jnp.where(self.positive(), x, jnp.nan)

    def schur_inverse_root(self):
        """:math:`L_S^{-1}`: :math:`S^{-1} = L_S^{-\top} L_S^{-1}`."""
        return jax.scipy.linalg.solve_triangular(self.s_chol, jnp.eye(self.c.shape[-1], dtype=self.c.dtype), lower=True)

    def variance(self):
        ls_inv_t = self.schur_inverse_root().T  # L_S^-T
        border = self.u @ ls_inv_t
        return self._usable(self._join(self.field.variance() + jnp.sum(border**2, axis=-1),
                                       jnp.sum(ls_inv_t**2, axis=-1)))

    def block(self, index):
        """``(H^-1)_{II}`` by one solve per index (a few coordinates, a site's)."""
        return self._usable(block_by_solves(self.solve, self.dim, index, self.c.dtype))

    def spectrum(self):
        """The dense eigendecomposition (small problems only)."""
        return jnp.linalg.eigh(self.precision)

    def extreme_eigenvalues(self, num_iter: int = 50):
        return power_extremes(self.matvec, self.solve, self.dim, self.c.dtype, self.positive(), num_iter)

    def diagonal(self):
        return self._join(self.field.diagonal(), jnp.diagonal(self.c))

    def uncoupled(self):
        f = self.field.uncoupled() & jnp.all(self.b == 0, axis=-1)
        eye = jnp.eye(self.c.shape[-1], dtype=bool)
        g = jnp.all((self.c == 0) | eye, axis=-1) & jnp.all(self.b == 0, axis=0)
        return self._join(f, g)


def weighted_inverse(curvature: BandedArrowheadCurvature, w):
    r""":math:`\sum_k w_k H_k^{-1}`, dense ``(D, D)`` in the flat order, over a stack of ``K`` curvatures
    (a leading axis on every leaf; the field's and the globals' positions the same at every point: the
    first's are read) with weights ``w (K,)``. By blocks (module docstring), with
    :math:`V = U L_S^{-\top}`: :math:`(H^{-1})_{FF} = F^{-1} + V V^\top` (the field's part by
    :func:`~numpyro_lm.curvature.banded.weighted_inverse`), :math:`(H^{-1})_{FG} = -V L_S^{-1}`,
    :math:`(H^{-1})_{GG} = L_S^{-\top} L_S^{-1}`. NaN where a point of positive weight is not
    positive definite."""
    weighted = w > 0
    ls_inv = jax.vmap(BandedArrowheadCurvature.schur_inverse_root)(curvature)  # (K, G, G)
    v = jnp.einsum("kng,khg->knh", curvature.u, ls_inv)  # U L_S^-T
    v, ls_inv = (jnp.where(weighted[:, None, None], a, 0.0) for a in (v, ls_inv))  # (K, n, G), (K, G, G)
    wz = jnp.where(weighted, w, 0.0)
    ff = weighted_field_inverse(curvature.field, w) + jnp.einsum("k,kng,kmg->nm", wz, v, v)
    fg = -jnp.einsum("k,kng,kgh->nh", wz, v, ls_inv)
    gg = jnp.einsum("k,kgi,kgj->ij", wz, ls_inv, ls_inv)
    usable = jnp.all(jax.vmap(BandedArrowheadCurvature.positive)(curvature) | ~weighted)
    fi, gi = curvature.field_index[0], curvature.global_index[0]
    out = jnp.zeros((fi.shape[0] + gi.shape[0],) * 2, ff.dtype)
    out = out.at[fi[:, None], fi[None, :]].set(ff).at[fi[:, None], gi[None, :]].set(fg)
    out = out.at[gi[:, None], fi[None, :]].set(fg.T).at[gi[:, None], gi[None, :]].set(gg)
    return jnp.where(usable, out, jnp.nan)
