r"""Block-arrowhead curvature: many small local blocks that interact only through a few globals.

A hierarchical model with :math:`J` groups (random effects in a plate, fixed effects and
scales outside it) has a precision that, with the local coordinates first, reads

.. math:: H = \begin{pmatrix} A & B \\ B^\top & C \end{pmatrix}, \qquad
          A = \mathrm{blockdiag}(A_1, \dots, A_J),

:math:`A_j` the :math:`b \times b` block of group :math:`j`, :math:`B_j` its
:math:`b \times G` coupling to the :math:`G` global coordinates, :math:`C` the global block.
With :math:`U_j = A_j^{-1} B_j` and the Schur complement
:math:`S = C - \sum_j B_j^\top U_j`,

.. math:: H = L\,\mathrm{diag}(A, S)\,L^\top, \qquad
          L = \begin{pmatrix} I & 0 \\ U^\top & I \end{pmatrix},

so every operation of :class:`~numpyro_lm.curvature.base.Curvature` costs
:math:`O(J b^2 G + G^3)` time and :math:`O(J b (b + G))` memory instead of :math:`O(D^3)`
and :math:`O(D^2)` (Golub and Van Loan, *Matrix Computations*, 4th ed., sec. 4.5 on block
factorisations; the same elimination is what R-INLA and TMB do with a sparse Cholesky on
this pattern). With :math:`A_j = L_j L_j^\top` and :math:`S = L_S L_S^\top` the square root
:math:`R = L^{-\top}\,\mathrm{diag}(L_A^{-\top}, L_S^{-\top})` satisfies :math:`R R^\top = H^{-1}`:

- draws: :math:`x_G = L_S^{-\top} e_G`, :math:`x_L = L_A^{-\top} e_L - U x_G`;
- whitening: :math:`w_L = L_A^\top (d_L + U d_G)`, :math:`w_G = L_S^\top d_G`;
- :math:`\log\det H = \sum_j \log\det A_j + \log\det S`;
- :math:`H^{-1}_{ik} = R_i \cdot R_k`: a local row of :math:`R` is its block's row of
  :math:`L_A^{-\top}` and :math:`-U_i L_S^{-\top}` on the globals, a global row is a row of
  :math:`L_S^{-\top}`: variances and any block of the covariance without forming it.

Where :math:`H` is not positive definite (some :math:`A_j` or :math:`S` is not),
:func:`modified_factor` builds the positive definite :math:`\tilde H = L\,\mathrm{diag}(|A|,
|\tilde S|)\,L^\top` from the blocks' absolute eigenvalues: a descent direction for the
mode search in the spirit of the saddle-free Newton step of the dense case.

The block algebra vectorises over the :math:`J` blocks (column loops of array operations:
:func:`numpyro_lm.curvature.linalg.cholesky_columns`), never one LAPACK call per block.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .base import power_extremes
from .linalg import cholesky_columns, substitution

__all__ = ["ArrowheadCurvature", "arrowhead_factor", "modified_factor", "absolute_blocks", "arrowhead_matvec", "placement",
           "split_parts", "join_parts"]


def _chol_blocks(a):
    """Lower Cholesky factors of ``(J, b, b)`` blocks (NaN where a block is not positive definite)."""
    if a.shape[-1] == 1:
        return jnp.sqrt(a)
    return jax.vmap(cholesky_columns)(a)


def _lower_solve(l, v):
    """``L^-1 v`` per block: ``l (J, b, b)``, ``v (J, b, k)``."""
    if l.shape[-1] == 1:
        return v / l
    return jax.vmap(lambda m, x: substitution(m, x, lower=True))(l, v)


def _upper_solve(l, v):
    """``L^-T v`` per block: ``l (J, b, b)`` lower, ``v (J, b, k)``."""
    if l.shape[-1] == 1:
        return v / l
    return jax.vmap(lambda m, x: substitution(jnp.swapaxes(m, -1, -2), x, lower=False))(l, v)


def _columns(v):
    """``(..., G)`` -> ``(G, n)``, the leading dims flattened into ``n`` columns (``G`` may be 0)."""
    return v.reshape((math.prod(v.shape[:-1]), v.shape[-1])).T


def arrowhead_factor(a, b, c):
    """``(chol(A_j), U = A^-1 B, chol(S))`` of the blocks (module docstring); NaN where not PD."""
    la = _chol_blocks(a)
    u = _upper_solve(la, _lower_solve(la, b))
    s = c - jnp.einsum("jig,jih->gh", b, u)
    return la, u, jnp.linalg.cholesky(0.5 * (s + s.T))


def _absolute(m):
    """``|M|``: the symmetric matrices ``m (..., k, k)`` with their eigenvalues made positive
    (floored at ``eps`` of the largest)."""
    if m.shape[-1] == 0:
        return m
    if m.shape[-1] == 1:
        floor = jnp.finfo(m.dtype).eps * jnp.maximum(jnp.max(jnp.abs(m)), 1.0)
        return jnp.maximum(jnp.abs(m), floor)
    w, q = jnp.linalg.eigh(m)
    floor = jnp.finfo(w.dtype).eps * jnp.maximum(jnp.max(jnp.abs(w)), 1.0)
    return jnp.einsum("...ik,...k,...jk->...ij", q, jnp.maximum(jnp.abs(w), floor), q)


def modified_factor(a, b, c):
    """:func:`arrowhead_factor` of the positive definite :math:`\\tilde H` (module docstring)."""
    return arrowhead_factor(*absolute_blocks(a, b, c))


def absolute_blocks(a, b, c):
    """``(|A|, B, C~)``: the blocks of the positive definite :math:`\\tilde H` of
    :func:`modified_factor`, :math:`C^\\sim = |S| + \\sum_j B_j^\\top |A_j|^{-1} B_j` so that its
    Schur complement is :math:`|S|`; it differs from :math:`H` only in the blocks (and the
    Schur complement) that are not positive definite."""
    a_abs = _absolute(a)
    la = _chol_blocks(a_abs)
    u = _upper_solve(la, _lower_solve(la, b))
    eliminated = jnp.einsum("jig,jih->gh", b, u)
    s = c - eliminated
    return a_abs, b, _absolute(0.5 * (s + s.T)) + 0.5 * (eliminated + eliminated.T)


def placement(local_index, global_index):
    """``(local first, (start, stop) of the locals)`` where the indices are concrete (not traced)
    and the local blocks, in order, and the globals, in order, are two contiguous ranges that
    tile ``[0, D)`` (a plate's site beside the globals); else ``None``. With it, splitting a
    vector into its parts and joining them back are slices and a concatenation, where index
    arrays make a gather and a scatter, and XLA:CPU runs a scatter as a loop of its own (at 10^5
    blocks it cost more than the draws' arithmetic)."""
    if isinstance(local_index, jax.core.Tracer) or isinstance(global_index, jax.core.Tracer):
        return None
    local, glob = np.asarray(local_index).ravel(), np.asarray(global_index).ravel()
    if local.size == 0 or local.ndim != 1:
        return None
    start, dim = int(local[0]), local.size + glob.size
    if not np.array_equal(local, np.arange(start, start + local.size)):
        return None
    rest = np.arange(0, start) if start else np.arange(local.size, dim)
    if start not in (0, glob.size) or not np.array_equal(glob, rest):
        return None
    return start == 0, (start, start + local.size)


def split_parts(local_index, global_index, v):
    """``(v[..., local_index] (..., J, b), v[..., global_index] (..., G))`` (slices where :func:`placement` allows)."""
    where = placement(local_index, global_index)
    if where is None:
        return v[..., local_index], v[..., global_index]
    local_first, (start, stop) = where
    glob = v[..., stop:] if local_first else v[..., :start]
    return v[..., start:stop].reshape(v.shape[:-1] + tuple(np.shape(local_index))), glob


def join_parts(local_index, global_index, local, glob):
    """The inverse of :func:`split_parts`: ``(..., D)`` with ``local (..., J, b)`` and ``glob (..., G)`` in place."""
    where = placement(local_index, global_index)
    if where is None:
        dim = np.shape(local_index)[-1] * np.shape(local_index)[-2] + np.shape(global_index)[-1]
        out = jnp.zeros(local.shape[:-2] + (dim,), jnp.result_type(local, glob))
        return out.at[..., local_index].set(local).at[..., global_index].set(glob)
    flat = local.reshape(local.shape[:-2] + (-1,))
    glob = jnp.broadcast_to(glob, flat.shape[:-1] + glob.shape[-1:]).astype(flat.dtype)
    first, second = (flat, glob) if where[0] else (glob, flat)
    # the two parts padded to D and added, not concatenated: XLA:CPU's loop over a concatenation
    # picks each element's operand (10^5 float64 coordinates: 0.53 ms a join, 0.24 ms so; two
    # joins a Newton step of the Poisson benchmark's inner fits)
    lead = [(0, 0)] * (flat.ndim - 1)
    return (jnp.pad(first, lead + [(0, second.shape[-1])]) + jnp.pad(second, lead + [(first.shape[-1], 0)]))


def arrowhead_matvec(local_index, global_index, a, b, c, v):
    """``H v`` from the blocks, for ``v`` of shape ``(..., D)``."""
    vl, vg = split_parts(local_index, global_index, v)
    hl = jnp.einsum("jik,...jk->...ji", a, vl) + jnp.einsum("jig,...g->...ji", b, vg)
    hg = jnp.einsum("jig,...ji->...g", b, vl) + vg @ c.T
    return join_parts(local_index, global_index, hl.astype(v.dtype), hg.astype(v.dtype))


class ArrowheadCurvature(NamedTuple):
    """A block-arrowhead precision and its block factorisation (module docstring).

    ``local_index (J, b)``: the flat coordinates of each local block; ``global_index (G,)``
    the others. ``a (J, b, b)``, ``b (J, b, G)``, ``c (G, G)``: the precision's blocks;
    ``a_chol``, ``u``, ``s_chol``: :func:`arrowhead_factor`'s.
    """

    local_index: jnp.ndarray
    global_index: jnp.ndarray
    a: jnp.ndarray
    b: jnp.ndarray
    c: jnp.ndarray
    a_chol: jnp.ndarray
    u: jnp.ndarray
    s_chol: jnp.ndarray

    @classmethod
    def from_blocks(cls, local_index, global_index, a, b, c) -> "ArrowheadCurvature":
        a = 0.5 * (a + jnp.swapaxes(a, -1, -2))
        c = 0.5 * (c + c.T)
        # the indices as they come (NumPy where concrete): placement() reads them as slices
        return cls(local_index, global_index, a, b, c, *arrowhead_factor(a, b, c))

    @property
    def dim(self) -> int:
        return self.local_index.shape[-1] * self.local_index.shape[-2] + self.global_index.shape[-1]

    @property
    def precision(self):
        """The dense precision (small models and tests only: ``D x D``)."""
        eye = jnp.eye(self.dim, dtype=self.a.dtype)
        return arrowhead_matvec(self.local_index, self.global_index, self.a, self.b, self.c, eye)

    def matvec(self, v):
        """``H v`` for ``v`` of shape ``(..., D)``."""
        return arrowhead_matvec(self.local_index, self.global_index, self.a, self.b, self.c, v)

    # ------------------------------------------------------------ the algebra

    def _split(self, v):
        return split_parts(self.local_index, self.global_index, v)

    def _join(self, local, glob):
        return join_parts(self.local_index, self.global_index, local, glob.astype(local.dtype))

    def _blocks_of(self, local):
        """``(..., J, b)`` -> ``(J, b, n)`` with the leading dims flattened into ``n`` columns."""
        lead = local.shape[:-2]
        return jnp.moveaxis(local.reshape((-1,) + local.shape[-2:]), 0, -1), lead

    def _from_blocks(self, cols, lead):
        return jnp.moveaxis(cols, -1, 0).reshape(lead + cols.shape[:2])

    def positive(self):
        local, schur = self.failing_blocks()
        return ~jnp.any(local) & ~schur

    def failing_blocks(self):
        """``(per local block: not numerically positive definite (J,), the Schur complement is not)``.

        Each pivot is numerically zero below the rounding of what it was eliminated from: a
        local block's own largest pivot, and for the Schur complement the global block ``C``
        (``S = C - sum B'U`` cancels relative to ``C``); a floor from the largest eigenvalue of
        all of ``H`` (the dense rule) would call 10^5 well-determined random effects singular
        next to fixed effects that 10^6 observations pin down.
        """
        eps = jnp.finfo(self.a.dtype).eps
        local = jnp.diagonal(self.a_chol, axis1=-2, axis2=-1) ** 2
        local_floor = jnp.sqrt(local.shape[-1]) * eps * jnp.max(local, axis=-1, keepdims=True)
        local_ok = jnp.all(jnp.isfinite(self.a_chol), axis=(-2, -1)) & jnp.all(local > local_floor, axis=-1)
        schur = jnp.diagonal(self.s_chol) ** 2
        schur_floor = jnp.sqrt(schur.shape[-1]) * eps * jnp.max(jnp.abs(jnp.diagonal(self.c)), initial=0.0)
        schur_ok = jnp.all(jnp.isfinite(self.s_chol)) & jnp.all(schur > schur_floor)
        return ~local_ok, ~schur_ok

    def solve(self, v):
        vl, vg = self._split(v)
        cols, lead = self._blocks_of(vl)
        y = _upper_solve(self.a_chol, _lower_solve(self.a_chol, cols))  # A^-1 v_L: (J, b, n)
        rhs = _columns(vg) - jnp.einsum("jig,jin->gn", self.b, y)
        xg = jax.scipy.linalg.cho_solve((self.s_chol, True), rhs)  # (G, n)
        xl = y - jnp.einsum("jig,gn->jin", self.u, xg)
        return self._join(self._from_blocks(xl, lead), xg.T.reshape(lead + (-1,)))

    def inv_sqrt(self, eps):
        el, eg = self._split(eps)
        cols, lead = self._blocks_of(el)
        xg = jax.scipy.linalg.solve_triangular(self.s_chol.T, _columns(eg), lower=False)
        xl = _upper_solve(self.a_chol, cols) - jnp.einsum("jig,gn->jin", self.u, xg)
        return self._join(self._from_blocks(xl, lead), xg.T.reshape(lead + (-1,)))

    def whiten(self, d):
        dl, dg = self._split(d)
        cols, lead = self._blocks_of(dl)
        flat_g = _columns(dg)  # (G, n)
        wl = jnp.einsum("jki,jkn->jin", self.a_chol, cols + jnp.einsum("jig,gn->jin", self.u, flat_g))
        wg = self.s_chol.T @ flat_g
        return self._join(self._from_blocks(wl, lead), wg.T.reshape(lead + (-1,)))

    def logdet(self):
        return 2.0 * (jnp.sum(jnp.log(jnp.diagonal(self.a_chol, axis1=-2, axis2=-1)))
                      + jnp.sum(jnp.log(jnp.diagonal(self.s_chol))))

    def _roots(self):
        """``(L_A^-T (J, b, b), global parts of the rows of R: local (J, b, G), global (G, G))``."""
        eye_b = jnp.broadcast_to(jnp.eye(self.a_chol.shape[-1], dtype=self.a.dtype), self.a_chol.shape)
        la_inv_t = jnp.swapaxes(_lower_solve(self.a_chol, eye_b), -1, -2)
        ls_inv_t = jax.scipy.linalg.solve_triangular(self.s_chol, jnp.eye(self.s_chol.shape[-1], dtype=self.a.dtype),
                                                     lower=True).T
        return la_inv_t, -jnp.einsum("jig,gh->jih", self.u, ls_inv_t), ls_inv_t

    def _usable(self, x):
        return jnp.where(self.positive(), x, jnp.nan)

    def variance(self):
        la_inv_t, local_g, ls_inv_t = self._roots()
        vl = jnp.sum(la_inv_t**2, axis=-1) + jnp.sum(local_g**2, axis=-1)
        vg = jnp.sum(ls_inv_t**2, axis=-1)
        return self._usable(self._join(vl, vg))

    def block(self, index):
        la_inv_t, local_g, ls_inv_t = self._roots()
        n_blocks, size = self.local_index.shape[-2:]
        dim, g = self.dim, self.global_index.shape[-1]
        # each flat coordinate's row of R: its block (-1: global), its local part, its global part
        which = jnp.zeros(dim, jnp.int32).at[self.local_index].set(
            jnp.broadcast_to(jnp.arange(n_blocks, dtype=jnp.int32)[:, None], (n_blocks, size)))
        which = which.at[self.global_index].set(-1)
        local_part = jnp.zeros((dim, size), self.a.dtype).at[self.local_index].set(la_inv_t)
        global_part = jnp.zeros((dim, g), self.a.dtype).at[self.local_index].set(local_g)
        global_part = global_part.at[self.global_index].set(ls_inv_t)
        index = jnp.asarray(index)
        rows_w, rows_l, rows_g = which[index], local_part[index], global_part[index]
        same = (rows_w[..., :, None] == rows_w[..., None, :]) & (rows_w[..., :, None] >= 0)
        cov = rows_g @ jnp.swapaxes(rows_g, -1, -2) + jnp.where(same, rows_l @ jnp.swapaxes(rows_l, -1, -2), 0.0)
        return self._usable(cov)

    def spectrum(self):
        """The dense eigendecomposition: for small problems (errors, tests); large ones use
        :meth:`extreme_eigenvalues`."""
        return jnp.linalg.eigh(self.precision)

    def extreme_eigenvalues(self, num_iter: int = 50):
        """``(lowest, highest)`` eigenvalue estimates of ``H`` (:func:`~numpyro_lm.curvature.base.power_extremes`:
        power iteration with the block solve)."""
        return power_extremes(self.matvec, self.solve, self.dim, self.a.dtype, self.positive(), num_iter)

    def diagonal(self):
        """The precision's diagonal ``(D,)``."""
        return self._join(jnp.diagonal(self.a, axis1=-2, axis2=-1), jnp.diagonal(self.c))

    def uncoupled(self):
        """``(D,)``: the coordinates the precision couples to no other."""
        eye_b = jnp.eye(self.a.shape[-1], dtype=bool)
        local = jnp.all((self.a == 0) | eye_b, axis=-1) & jnp.all(self.b == 0, axis=-1)
        eye_g = jnp.eye(self.c.shape[-1], dtype=bool)
        glob = jnp.all((self.c == 0) | eye_g, axis=-1) & jnp.all(self.b == 0, axis=(0, 1))
        return self._join(local, glob)
