r"""Banded curvature: a latent Markov field's precision, block-tridiagonal, factorised in ``O(n b^3)``.

A time series' latent trend (an AR(1) or random walk written with ``scan``), or a field over
regions after a bandwidth-reducing ordering, has a precision whose entries vanish beyond a
half-bandwidth :math:`b`: :math:`H_{ij} = 0` for :math:`|i - j| > b`. Cut into :math:`n`
consecutive blocks of :math:`b` coordinates it is block-tridiagonal,

.. math:: H = \begin{pmatrix} A_0 & B_0^\top & & \\ B_0 & A_1 & B_1^\top & \\
          & B_1 & A_2 & \ddots \\ & & \ddots & \ddots \end{pmatrix},

and its Cholesky factor :math:`H = L L^\top` is block-bidiagonal: diagonal blocks
:math:`D_i` (lower triangular) and sub-diagonal blocks :math:`C_i`, from the recursion

.. math:: D_0 D_0^\top = A_0, \qquad C_{i-1} = B_{i-1} D_{i-1}^{-\top}, \qquad
          D_i D_i^\top = A_i - C_{i-1} C_{i-1}^\top

(Golub and Van Loan, *Matrix Computations*, 4th ed., sec. 4.5.2; the block-tridiagonal
factorisations of R-INLA's and sTiles' solvers). Each operation of
:class:`~numpyro_lm.curvature.base.Curvature` is then a ``lax.scan`` over the blocks:

- solves: forward :math:`y_i = D_i^{-1}(v_i - C_{i-1} y_{i-1})`, backward
  :math:`x_i = D_i^{-\top}(y_i - C_i^\top x_{i+1})`;
- draws :math:`L^{-\top} e` (the backward sweep alone) and whitening :math:`L^\top d`;
- :math:`\log\det H = 2\sum_i \log\det D_i`;
- the marginal variances without the inverse, by the Takahashi recursion (Takahashi, Fagan
  and Chen 1973; Rue and Martino 2007 for GMRFs): with :math:`M_i = C_i D_i^{-1}`,
  :math:`\Sigma_{n-1} = (D_{n-1} D_{n-1}^\top)^{-1}` and
  :math:`\Sigma_i = (D_i D_i^\top)^{-1} + M_i^\top \Sigma_{i+1} M_i` (the diagonal blocks of
  :math:`H^{-1}`, from :math:`L^\top \Sigma = L^{-1}` read block row by block row).

A dimension that is not a multiple of :math:`b` is padded with identity coordinates coupled to
nothing: they add nothing to the log-determinant and are dropped from every result.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .base import block_by_solves, power_extremes

__all__ = ["BandedCurvature", "UNROLLED_BLOCK_MAX", "band_blocks", "banded_factor", "banded_matvec",
           "weighted_inverse"]


UNROLLED_BLOCK_MAX = 8
"""Blocks up to this size are factorised and solved by unrolled elementwise arithmetic inside the
scans, larger ones by LAPACK: a LAPACK call per step of a scan costs microseconds whatever the
block. Over 10^5 AR(1) coordinates in 4 x 4 blocks the field correction's solve went from about
110 ms to a few (the correction 236 -> 123 ms); the factor and covariance band stayed at 70 and
100-130 ms, a scan's fixed cost per step, which a tridiagonal band avoids altogether
(:mod:`numpyro_lm.marginal.field_correction`). The model's gradient there: 4.6 ms."""


def _chol(a):
    """Lower Cholesky factor of a ``(b, b)`` block (NaN where not positive definite)."""
    size = a.shape[-1]
    if size == 1:
        return jnp.sqrt(a)
    if size > UNROLLED_BLOCK_MAX:
        return jnp.linalg.cholesky(a)
    low = {}
    for j in range(size):
        low[j, j] = jnp.sqrt(a[..., j, j] - sum(low[j, k] ** 2 for k in range(j)))
        for i in range(j + 1, size):
            low[i, j] = (a[..., i, j] - sum(low[i, k] * low[j, k] for k in range(j))) / low[j, j]
    zero = jnp.zeros_like(a[..., 0, 0])
    return jnp.stack([jnp.stack([low.get((i, j), zero) for j in range(size)], -1) for i in range(size)], -2)


def _lower_solve(d, v):
    """``D^-1 v``, ``d (b, b)`` lower triangular, ``v (b, k)``."""
    size = d.shape[-1]
    if size == 1:
        return v / d
    if size > UNROLLED_BLOCK_MAX:
        return jax.scipy.linalg.solve_triangular(d, v, lower=True)
    rows = []
    for i in range(size):
        rows.append((v[i] - sum(d[i, k] * rows[k] for k in range(i))) / d[i, i])
    return jnp.stack(rows)


def _upper_solve(d, v):
    """``D^-T v``."""
    size = d.shape[-1]
    if size == 1:
        return v / d
    if size > UNROLLED_BLOCK_MAX:
        return jax.scipy.linalg.solve_triangular(d, v, lower=True, trans=1)
    rows = {}
    for i in reversed(range(size)):
        rows[i] = (v[i] - sum(d[k, i] * rows[k] for k in range(i + 1, size))) / d[i, i]
    return jnp.stack([rows[i] for i in range(size)])


def banded_factor(diag, lower):
    """``(D (n, b, b), C (n-1, b, b))``: the block Cholesky factor of the block-tridiagonal
    precision with diagonal blocks ``diag`` and sub-diagonal blocks ``lower`` (module docstring);
    NaN from the first block that is not positive definite on."""
    first = _chol(diag[0])

    def step(d_prev, blocks):
        a, b = blocks
        c = _lower_solve(d_prev, b.T).T  # B D^-T = (D^-1 B^T)^T
        d = _chol(a - c @ c.T)
        return d, (d, c)

    _, (rest, c) = jax.lax.scan(step, first, (diag[1:], lower))
    return jnp.concatenate([first[None], rest]), c


def banded_matvec(diag, lower, v):
    """``H v`` for the block-tridiagonal ``H``, ``v (n, b, k)``."""
    out = jnp.einsum("nij,njk->nik", diag, v)
    below = jnp.einsum("nij,njk->nik", lower, v[:-1])  # B_i v_i lands in block i + 1
    above = jnp.einsum("nji,njk->nik", lower, v[1:])  # B_i^T v_{i+1} lands in block i
    return out.at[1:].add(below).at[:-1].add(above)


def band_blocks(band, size: int):
    """``(diag (n, b, b), lower (n-1, b, b), pad)`` from the lower band ``band (D, size + 1)``,
    ``band[i, k] = H[i, i - k]`` (entries before the first row ignored), for blocks of ``size``
    coordinates; ``pad`` the identity coordinates added (``D`` a multiple of ``size`` after)."""
    dim = band.shape[0]
    pad = -dim % size
    n = (dim + pad) // size
    band = jnp.concatenate([band, jnp.zeros((pad, size + 1), band.dtype).at[:, 0].set(1.0)])
    rows = np.arange(n * size)
    # dense coordinates of each block: block i holds rows i*size ... i*size + size - 1
    r = rows.reshape(n, size)
    full = {}
    for name, shift in (("diag", 0), ("lower", 1)):
        i = r[shift:][:, :, None]  # (m, b, 1) the row
        j = (r[:n - shift] if shift else r)[:, None, :]  # (m, 1, b) the column
        k = i - j  # band offset
        ok = (k >= 0) & (k <= size)
        vals = band[np.clip(i, 0, None), np.clip(k, 0, size)]
        vals = jnp.where(ok, vals, 0.0)
        if shift == 0:  # the upper triangle of a diagonal block by symmetry
            vals = jnp.where(k >= 0, vals, jnp.swapaxes(vals, -1, -2))
        full[name] = vals
    return full["diag"], full["lower"], pad


class BandedCurvature(NamedTuple):
    """A block-tridiagonal precision and its block Cholesky factor (module docstring).

    ``diag (n, b, b)``, ``lower (n-1, b, b)``: the precision's blocks; ``diag_chol``,
    ``lower_chol``: :func:`banded_factor`'s; ``pad (p,)``: zeros, as many as the identity
    coordinates that make the dimension a multiple of ``b`` (a shape, read as such under ``jit``).
    """

    diag: jnp.ndarray
    lower: jnp.ndarray
    diag_chol: jnp.ndarray
    lower_chol: jnp.ndarray
    pad: jnp.ndarray

    @classmethod
    def from_blocks(cls, diag, lower, pad: int = 0) -> "BandedCurvature":
        diag = 0.5 * (diag + jnp.swapaxes(diag, -1, -2))
        return cls(diag, lower, *banded_factor(diag, lower), jnp.zeros(pad, diag.dtype))

    @classmethod
    def from_band(cls, band, size: int) -> "BandedCurvature":
        """From the lower band ``band (D, size + 1)``, ``band[i, k] = H[i, i - k]``."""
        diag, lower, pad = band_blocks(band, size)
        return cls.from_blocks(diag, lower, pad)

    @property
    def dim(self) -> int:
        return self.diag.shape[-3] * self.diag.shape[-1] - self.pad.shape[-1]

    # ------------------------------------------------------------ layout

    def _blocks_of(self, v):
        """``(..., D)`` -> ``(n, b, cols)`` (padded with zeros) and the leading shape."""
        lead = v.shape[:-1]
        cols = v.reshape((-1, v.shape[-1]))
        cols = jnp.concatenate([cols, jnp.zeros((cols.shape[0], self.pad.shape[-1]), cols.dtype)], axis=1)
        n, b = self.diag.shape[-3], self.diag.shape[-1]
        return jnp.moveaxis(cols.reshape((-1, n, b)), 0, -1), lead

    def _from_blocks(self, x, lead):
        flat = jnp.moveaxis(x, -1, 0).reshape((x.shape[-1], -1))[:, :self.dim]
        return flat.reshape(lead + (self.dim,))

    # ------------------------------------------------------------ the algebra

    @property
    def precision(self):
        """The dense precision (small models and tests only: ``D x D``)."""
        return self.matvec(jnp.eye(self.dim, dtype=self.diag.dtype))

    def matvec(self, v):
        """``H v`` for ``v`` of shape ``(..., D)``."""
        x, lead = self._blocks_of(v)
        return self._from_blocks(banded_matvec(self.diag, self.lower, x), lead)

    def positive(self):
        """Every pivot finite and above the rounding of the block it was eliminated from."""
        eps = jnp.finfo(self.diag.dtype).eps
        pivots = jnp.diagonal(self.diag_chol, axis1=-2, axis2=-1) ** 2
        scale = jnp.max(jnp.abs(jnp.diagonal(self.diag, axis1=-2, axis2=-1)), axis=-1, keepdims=True)
        floor = jnp.sqrt(pivots.shape[-1]) * eps * scale
        return jnp.all(jnp.isfinite(self.diag_chol)) & jnp.all(jnp.isfinite(self.lower_chol)) & jnp.all(pivots > floor)

    def _forward(self, v):
        """``L^-1 v``, ``v (n, b, k)``."""
        first = _lower_solve(self.diag_chol[0], v[0])

        def step(y_prev, blocks):
            d, c, vi = blocks
            y = _lower_solve(d, vi - c @ y_prev)
            return y, y

        _, rest = jax.lax.scan(step, first, (self.diag_chol[1:], self.lower_chol, v[1:]))
        return jnp.concatenate([first[None], rest])

    def _backward(self, y):
        """``L^-T y``, ``y (n, b, k)``."""
        last = _upper_solve(self.diag_chol[-1], y[-1])

        def step(x_next, blocks):
            d, c, yi = blocks
            x = _upper_solve(d, yi - c.T @ x_next)
            return x, x

        _, rest = jax.lax.scan(step, last, (self.diag_chol[:-1], self.lower_chol, y[:-1]), reverse=True)
        return jnp.concatenate([rest, last[None]])

    def solve(self, v):
        x, lead = self._blocks_of(v)
        return self._from_blocks(self._backward(self._forward(x)), lead)

    def inv_sqrt(self, eps):
        x, lead = self._blocks_of(eps)
        return self._from_blocks(self._backward(x), lead)

    def whiten(self, d):
        x, lead = self._blocks_of(d)
        w = jnp.einsum("nji,njk->nik", self.diag_chol, x)  # D_i^T d_i
        w = w.at[:-1].add(jnp.einsum("nji,njk->nik", self.lower_chol, x[1:]))  # + C_i^T d_{i+1}
        return self._from_blocks(w, lead)

    def logdet(self):
        return 2.0 * jnp.sum(jnp.log(jnp.diagonal(self.diag_chol, axis1=-2, axis2=-1)))

    def _usable(self, x):
        return jnp.where(self.positive(), x, jnp.nan)

    def covariance_blocks(self):
        """``(n, b, b)``: the diagonal blocks of :math:`H^{-1}` (the Takahashi recursion)."""
        return self.covariance_band()[0]

    def covariance_band(self):
        r"""``(diagonal (n, b, b), next (n-1, b, b))`` blocks of :math:`H^{-1}`: :math:`\Sigma_{ii}`
        by the Takahashi recursion (module docstring) and :math:`\Sigma_{i,i+1} = -M_i^\top \Sigma_{i+1,i+1}`
        (block row ``i`` of :math:`L^\top \Sigma = L^{-1}` above its diagonal): every entry of
        :math:`H^{-1}` within ``b`` of the diagonal, in ``O(n b^3)``."""
        diagonal, m = self._takahashi()
        return diagonal, -jnp.einsum("nji,njk->nik", m, diagonal[1:])

    def _takahashi(self):
        """``(diagonal (n, b, b), M_i = C_i D_i^-1 (n-1, b, b))``: the recursion's diagonal blocks of
        :math:`H^{-1}` and its multipliers (:meth:`covariance_band`, :func:`weighted_inverse`)."""
        eye = jnp.eye(self.diag.shape[-1], dtype=self.diag.dtype)
        d_inv = jax.vmap(lambda d: _lower_solve(d, eye))(self.diag_chol)  # D_i^-1
        own = jnp.einsum("nki,nkj->nij", d_inv, d_inv)  # (D_i D_i^T)^-1 = D_i^-T D_i^-1
        m = jnp.einsum("nij,njk->nik", self.lower_chol, d_inv[:-1])  # M_i = C_i D_i^-1

        def step(sigma_next, blocks):
            own_i, m_i = blocks
            sigma = own_i + m_i.T @ sigma_next @ m_i
            return sigma, sigma

        _, rest = jax.lax.scan(step, own[-1], (own[:-1], m), reverse=True)
        return jnp.concatenate([rest, own[-1][None]]), m

    def variance(self):
        blocks = self.covariance_blocks()
        return self._usable(jnp.diagonal(blocks, axis1=-2, axis2=-1).reshape(-1)[:self.dim])

    def block(self, index):
        """``(H^-1)_{II}`` by ``k`` solves (``O(k n b^2)``; a few coordinates, a site's)."""
        return self._usable(block_by_solves(self.solve, self.dim, index, self.diag.dtype))

    def spectrum(self):
        """The dense eigendecomposition: for small problems (errors, tests); large ones use
        :meth:`extreme_eigenvalues`."""
        return jnp.linalg.eigh(self.precision)

    def extreme_eigenvalues(self, num_iter: int = 50):
        """``(lowest, highest)`` eigenvalue estimates of ``H`` (power iteration with the solve)."""
        return power_extremes(self.matvec, self.solve, self.dim, self.diag.dtype, self.positive(), num_iter)

    def diagonal(self):
        """The precision's diagonal ``(D,)``."""
        return jnp.diagonal(self.diag, axis1=-2, axis2=-1).reshape(-1)[:self.dim]

    def uncoupled(self):
        """``(D,)``: the coordinates the precision couples to no other."""
        b = self.diag.shape[-1]
        eye = jnp.eye(b, dtype=bool)
        own = jnp.all((self.diag == 0) | eye, axis=-1)  # (n, b): no coupling inside the block
        pad_row = jnp.zeros((1, b), bool)
        below = jnp.concatenate([pad_row, jnp.any(self.lower != 0, axis=-1)])  # row i of B_{i-1}
        above = jnp.concatenate([jnp.any(self.lower != 0, axis=-2), pad_row])  # column i of B_i
        return (own & ~below & ~above).reshape(-1)[:self.dim]



def weighted_inverse(curvature: BandedCurvature, w):
    r""":math:`\sum_k w_k H_k^{-1}`, dense ``(D, D)``, over a stack of ``K`` banded curvatures (a leading
    axis on every leaf) with weights ``w (K,)``: a mixture's covariance over a whole field.

    The Takahashi recursion continued beyond the band: block row :math:`i` of
    :math:`L^\top \Sigma = L^{-1}` reads :math:`\Sigma_{i,j} = -M_i^\top \Sigma_{i+1,j}` for every
    block column :math:`j > i` (:meth:`BandedCurvature.covariance_band` takes :math:`j = i + 1`), so
    the upper triangle is made block row by block row from the last, with :math:`\Sigma_{ii}` from
    the diagonal recursion, every point's row at once and summed with the weights as it is made:
    ``O(K D^2 b)`` arithmetic over a ``K b D`` carry. ``D`` solves a point (one per unit vector)
    read and write the ``D x D`` columns several times each: over a random walk of 2000 steps and
    87 points, 1.6 s. NaN where a point of positive weight is not positive definite."""
    diagonal, m = jax.vmap(BandedCurvature._takahashi)(curvature)  # (K, n, b, b), (K, n - 1, b, b)
    k, n, b = diagonal.shape[0], diagonal.shape[1], diagonal.shape[-1]
    weighted = w > 0  # rows of a point without weight add nothing, finite or not
    usable = jnp.all(jax.vmap(BandedCurvature.positive)(curvature) | ~weighted)
    w = jnp.where(weighted, w, 0.0)

    def placed(row, blocks, i):  # (K, b, b) blocks at block column i of (K, b, n b) rows
        return jax.lax.dynamic_update_slice(row, blocks, (0, 0, i * b))

    def summed(row):
        return jnp.einsum("k,kic->ic", w, jnp.where(weighted[:, None, None], row, 0.0))

    last = placed(jnp.zeros((k, b, n * b), diagonal.dtype), diagonal[:, -1], n - 1)

    def step(row_next, inputs):
        i, m_i, sigma_i = inputs
        row = placed(-jnp.einsum("kji,kjc->kic", m_i, row_next), sigma_i, i)
        return row, summed(row)

    _, rows = jax.lax.scan(step, last, (jnp.arange(n - 1), jnp.moveaxis(m, 1, 0), jnp.moveaxis(diagonal[:, :-1], 1, 0)),
                           reverse=True)
    # block rows from each diagonal block on: its upper triangle and beyond, mirrored below
    upper = jnp.concatenate([rows, summed(last)[None]]).reshape(n * b, n * b)
    full = jnp.triu(upper) + jnp.triu(upper, 1).T
    dim = n * b - curvature.pad.shape[-1]
    return jnp.where(usable, full[:dim, :dim], jnp.nan)
