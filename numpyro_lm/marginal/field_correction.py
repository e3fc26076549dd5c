r"""The Laplace marginal of a latent Markov field, corrected to second order.

Nested Laplace replaces :math:`\log p(y \mid \theta) = \log \int e^{-\phi(x)}\,dx` (with
:math:`\phi = -\log p(y, x \mid \theta)`) by its Laplace value
:math:`-\phi(x^*) + \tfrac n2 \log 2\pi - \tfrac12 \log\det H`. Over a long field the error adds up
coordinate by coordinate, and where it changes with :math:`\theta` it tilts the hyperparameters'
marginal: an AR(1) trend of 200 Poisson counts, its error (against importance sampling with
200 000 draws) 0.21 nats at :math:`\sigma = 0.40` and 0.50 at :math:`\sigma = 0.56`, 0.1 nats per
posterior SD of :math:`\sigma`, which moves its mean by about 0.1 SD.

The next terms of the expansion (Shun and McCullagh 1995, JRSS-B 57, eq. 3.2; the "Laplace6" of
Raudenbush, Yang and Yosef 2000, JCGS 9) with :math:`\Sigma = H^{-1}` and :math:`\phi_{ijk}`,
:math:`\phi_{ijkl}` the third and fourth derivatives at the mode are

.. math:: \log p(y\mid\theta) \approx \text{Laplace} - \tfrac18 \phi_{ijkl}\Sigma_{ij}\Sigma_{kl}
   + \tfrac18 \phi_{ijk}\phi_{lmn}\Sigma_{ij}\Sigma_{kl}\Sigma_{mn}
   + \tfrac1{12} \phi_{ijk}\phi_{lmn}\Sigma_{il}\Sigma_{jm}\Sigma_{kn}

(from :math:`\log E[e^{-R}] \approx -E[R_4] + \tfrac12 E[R_3^2]` over :math:`N(x^*, \Sigma)`, with
Isserlis' theorem). Where each observation involves one coordinate of the field and the field's
prior is Gaussian given :math:`\theta` (counts over an AR(1), a random walk or a CAR field), the
derivatives beyond the second are diagonal, :math:`\phi_{iii} = t_i`, :math:`\phi_{iiii} = q_i`:

.. math:: \epsilon = -\tfrac18 \sum_i q_i \Sigma_{ii}^2 + \tfrac18\, a^\top \Sigma\, a
   + \tfrac1{12} \sum_{i,j} t_i t_j \Sigma_{ij}^3, \qquad a_i = t_i \Sigma_{ii}.

The middle term is one solve with the band; the last sums over pairs within :data:`REACH` of
each other, at least (entries of :math:`\Sigma` from the Takahashi recursion,
:meth:`~numpyro_lm.curvature.banded.BandedCurvature.covariance_band`): the cube of a correlation
decays fast (the AR(1) above: 0.005 nats left beyond one neighbour, 1e-4 beyond three). The
diagonals come from two forward-mode passes along the all-ones vector,
:math:`t = \phi'''[\mathbf 1, \mathbf 1]`, :math:`q = \phi''''[\mathbf 1, \mathbf 1, \mathbf 1]`; a
random sign probe checks that they are diagonal (:math:`\phi'''[r, r] = t` for every sign
vector ``r`` exactly then). Where the check fails (a prior that is not Gaussian given
:math:`\theta`, a likelihood term over two coordinates) the correction is not applied.

On the AR(1) above it gives 0.18 and 0.46 nats at the two values of :math:`\sigma`: 93 % of the
error's change over them.

**A border.** A level or a covariate's slope :math:`\beta` (the Hessian's border,
:class:`~numpyro_lm.mode.banded_hessian.BandedHessian`'s ``glob``) enters every observation: the
derivatives are no longer diagonal, but where each term beyond the second order is a function of one
linear predictor :math:`\eta_i = x_i + \sum_g C_{ig}\beta_g` they are
:math:`\phi''' = \sum_i t_i v_i^{\otimes 3}`, :math:`v_i = e_i + \sum_g C_{ig} e_g` (and
:math:`\phi''''` likewise with :math:`q_i`). The expansion is a sum of contractions, unchanged by
the linear change of variables to :math:`(\eta, \beta)` (unit triangular: no Jacobian), in which
:math:`t` and :math:`q` are diagonal in :math:`\eta` and zero in :math:`\beta`: the formula above
holds with :math:`\Sigma` the predictors' covariance :math:`\Sigma_\eta = K + P S^{-1} P^\top`,
:math:`K = H_{ff}^{-1}` (the band's), :math:`P = K H_{fg} - C` and
:math:`S = H_{gg} - H_{gf} K H_{fg}` (block inversion). Its low-rank part does not decay with
distance: with :math:`u u^\top = P S^{-1} P^\top` the cubic sum takes
:math:`(K + uu^\top)_{ij}^3 - (u_i\cdot u_j)^3` over the pairs within reach and
:math:`\sum_{ij} t_i t_j (u_i \cdot u_j)^3 = \sum_{abc} (\sum_i t_i u_{ia} u_{ib} u_{ic})^2` over all
of them. :math:`C` is read off the mixed derivatives :math:`\phi'''[\mathbf 1_f, e_g]`
(:func:`border_derivatives`) and checked by a sign probe over every coordinate.

On the AR(1) trend of 200 Poisson counts of ``benchmarks/fields.py``, its level ``mu`` in the
border, the nested fit over ``rho, sigma`` put ``sigma`` 0.12-0.16 NUTS SDs low without the
correction (four keys, against NUTS's 20 000 draws), 0.00-0.05 with it; on the CAR model's
20 x 20 grid, its intercept in the border, ``tau`` was 0.08-0.16 SDs off without, 0.02-0.04 with
(three keys). Holding the border at its mode instead (the field's own correction alone) did worse
than none on the CAR grid (``alpha`` 0.16-0.21 SDs off): its intercept and the field's level are
nearly one direction, and the border's share of :math:`\Sigma_\eta` is not small.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..curvature.banded import BandedCurvature
from ..mode.hessian import relative_error, structure_tol

__all__ = ["REACH", "diagonal_derivatives", "border_derivatives", "second_order_correction", "field_skewness",
           "log_det_gradient"]

REACH = 4
"""The cubic sum runs over pairs in the same or neighbouring blocks of this many coordinates (or
the band's half-width where that is more): every pair up to this far apart, some up to twice."""


def diagonal_derivatives(neg_log_density: Callable, x, fourth: bool = True):
    r"""``(t, q, error)``: the diagonals of the third and fourth derivatives of ``neg_log_density``
    at ``x`` if they are diagonal (:math:`\phi'''[\mathbf 1, \mathbf 1]` and its derivative along
    :math:`\mathbf 1`), and the relative error of :math:`\phi'''[r, r]` for a random sign probe ``r``
    against ``t`` (zero where the tensors are diagonal); ``q`` is ``None`` without ``fourth``."""
    ones = jnp.ones_like(x)
    signs = jnp.asarray(np.random.default_rng(1).choice([-1.0, 1.0], x.shape[-1]), x.dtype)
    grad = jax.grad(neg_log_density)

    def third(z, v):  # phi'''(z)[v, v]
        return jax.jvp(lambda u: jax.jvp(grad, (u,), (v,))[1], (z,), (v,))[1]

    t, q = jax.jvp(lambda z: third(z, ones), (x,), (ones,)) if fourth else (third(x, ones), None)
    return t, q, relative_error(third(x, signs), t)


def _covariance_blocks(band, half_width: int):
    """``(curvature, diagonal, following, reach)``: the band refactorised in blocks of ``reach``
    coordinates (:data:`REACH`, or the half-width where that is more) and its covariance's
    diagonal and next blocks (:meth:`~numpyro_lm.curvature.banded.BandedCurvature.covariance_band`);
    a tridiagonal band's by :func:`_tridiagonal_covariance_blocks` (the same blocks, and the
    band's own curvature)."""
    reach = max(REACH, half_width)
    if half_width == 1:
        return _tridiagonal_covariance_blocks(band, reach)
    wide = jnp.concatenate([band, jnp.zeros((band.shape[0], reach - half_width), band.dtype)], axis=1)
    curvature = BandedCurvature.from_band(wide, reach)
    return (curvature, *curvature.covariance_band(), reach)


def _tridiagonal_covariance_blocks(band, reach: int):
    r""":func:`_covariance_blocks` for a tridiagonal band, without a scan over blocks: with the
    band's factor :math:`H = LL^\top` (diagonal :math:`d_i`, sub-diagonal :math:`c_i`), row
    :math:`i` of :math:`L^\top\Sigma = L^{-1}` above the diagonal reads
    :math:`\Sigma_{i,j} = m_i \Sigma_{i+1,j}`, :math:`m_i = -c_i / d_i` (:math:`j > i`), so each
    diagonal of :math:`\Sigma` up to ``2 reach - 1`` off the main one is the last times ``m``,
    elementwise, from the variances (the Takahashi recursion). Over 10^5 AR(1) coordinates 4 x 4
    blocks refactorised took 122 ms; this, a few."""
    curvature = BandedCurvature.from_band(band, 1)
    dim = band.shape[0]
    m = -curvature.lower_chol[:, 0, 0] / curvature.diag_chol[:-1, 0, 0]
    diagonals = [jnp.diagonal(curvature.covariance_blocks(), axis1=-2, axis2=-1)[:, 0]]  # Sigma_{i,i+k}, i < dim - k
    for k in range(1, 2 * reach):
        diagonals.append(m[:dim - k] * diagonals[-1][1:] if k < dim else jnp.zeros(0, band.dtype))
    blocks = -(-dim // reach)
    start = np.arange(blocks)[:, None, None] * reach

    def entries(rows, cols):  # Sigma at (rows, cols), cols >= rows, zero beyond the dimension
        out = jnp.zeros(rows.shape, band.dtype)
        for k in range(2 * reach):
            padded = jnp.concatenate([diagonals[k], jnp.zeros(blocks * reach + reach, band.dtype)])
            out = jnp.where((cols - rows == k) & (cols < dim), padded[np.clip(rows, 0, None)], out)
        return jnp.where((rows == cols) & (rows >= dim), 1.0, out)  # the padding: identity coordinates

    r, c = np.arange(reach)[None, :, None], np.arange(reach)[None, None, :]
    upper = entries(start + np.minimum(r, c), start + np.maximum(r, c))
    following = entries(start[:-1] + r, start[:-1] + reach + c)
    return curvature, upper, following, reach


def _in_blocks(v, reach: int):
    """``v (D, ...)`` zero-padded and cut as the blocks: ``(blocks, reach, ...)``."""
    v = jnp.concatenate([v, jnp.zeros((-v.shape[0] % reach,) + v.shape[1:], v.dtype)])
    return v.reshape((v.shape[0] // reach, reach) + v.shape[1:])  # not -1: a border of none is zero-size


def border_derivatives(neg_log_density: Callable, x, glob: tuple, fourth: bool = True):
    r"""``(t, q, C, error)`` for a field with a border (the coordinates at positions ``glob`` of
    ``x``, static) whose terms beyond the second order are each a function of one linear predictor
    :math:`\eta_i = x_i + \sum_g C_{ig}\beta_g`: :math:`\phi''' = \sum_i t_i v_i^{\otimes 3}`,
    :math:`v_i = e_i + \sum_g C_{ig} e_g`. Then the field's rows of
    :math:`\phi'''[\mathbf 1_f, \mathbf 1_f]` are :math:`t`, those of
    :math:`\phi'''[\mathbf 1_f, e_g]` are :math:`t_i C_{ig}` (``C`` zero where ``t`` is: such a row
    adds nothing to the tensor), and :math:`q` is the field's rows of the fourth derivative along
    :math:`\mathbf 1_f`. ``error``: :math:`\phi'''[r, r]` for a random sign probe ``r`` over every
    coordinate against the tensor's, :math:`\sum_i t_i (v_i \cdot r)^2 v_i`."""
    dim = x.shape[-1]
    glob = np.asarray(glob, int)
    field = np.setdiff1d(np.arange(dim), glob)
    ones = np.zeros(dim)
    ones[field] = 1.0
    ones, units = jnp.asarray(ones, x.dtype), jnp.asarray(np.eye(dim)[glob], x.dtype)
    signs = jnp.asarray(np.random.default_rng(1).choice([-1.0, 1.0], dim), x.dtype)
    grad = jax.grad(neg_log_density)

    def third(z, u, v):  # phi'''(z)[u, v]
        return jax.jvp(lambda w: jax.jvp(grad, (w,), (u,))[1], (z,), (v,))[1]

    if fourth:
        t, q = (a[field] for a in jax.jvp(lambda z: third(z, ones, ones), (x,), (ones,)))
    else:  # q is None
        t, q = third(x, ones, ones)[field], None
    mixed = jax.vmap(lambda e: third(x, ones, e))(units)[:, field]  # (G, n): t_i C_ig
    c = jnp.where(t != 0, mixed / jnp.where(t != 0, t, 1.0), 0.0).T
    along = t * (signs[field] + c @ signs[glob]) ** 2  # t_i (v_i . r)^2
    predicted = jnp.zeros(dim, x.dtype).at[field].set(along).at[glob].set(c.T @ along)
    return t, q, c, relative_error(third(x, signs, signs), predicted)


def second_order_correction(neg_log_density: Callable, x, band, half_width: int, border=None):
    r""":math:`\epsilon` (module docstring) at the conditional mode ``x`` of a field whose Hessian
    there has the lower band ``band (n, w + 1)``; zero where the higher derivatives are not
    diagonal (:func:`diagonal_derivatives`' check, :func:`border_derivatives`' with a border) or
    the result is not finite. ``border``: ``(glob, B (n, G), C (G, G))``, the border's positions in
    ``x`` and the Hessian's blocks :math:`H_{fg}`, :math:`H_{gg}` (module docstring)."""
    curvature, diagonal, following, reach = _covariance_blocks(band, half_width)
    variance = jnp.diagonal(diagonal, axis1=-2, axis2=-1).reshape(-1)[:band.shape[0]]
    if border is None or not len(border[0]):
        t, q, error = diagonal_derivatives(neg_log_density, x)
        u = jnp.zeros((band.shape[0], 0), x.dtype)
    else:
        glob, h_fg, h_gg = border
        t, q, c, error = border_derivatives(neg_log_density, x, glob)
        w = curvature.solve(h_fg.T).T  # K H_fg
        schur = jnp.linalg.cholesky(h_gg - h_fg.T @ w)
        u = jax.scipy.linalg.solve_triangular(schur, (w - c).T, lower=True).T  # u u' = P S^-1 P'
    variance = variance + jnp.sum(u**2, axis=1)
    a = t * variance
    tb, ub = _in_blocks(t, reach), _in_blocks(u, reach)
    low_diagonal = jnp.einsum("nig,njg->nij", ub, ub)
    low_following = jnp.einsum("nig,njg->nij", ub[:-1], ub[1:])
    # the pairs within reach with the whole covariance K + u u'; every pair's (u_i . u_j)^3 exactly,
    # sum_abc (sum_i t_i u_ia u_ib u_ic)^2: it does not decay with the distance
    cubic = (jnp.einsum("ni,nij,nj->", tb, (diagonal + low_diagonal) ** 3 - low_diagonal**3, tb)
             + 2.0 * jnp.einsum("ni,nij,nj->", tb[:-1], (following + low_following) ** 3 - low_following**3, tb[1:])
             + jnp.sum(jnp.einsum("i,ia,ib,ic->abc", t, u, u, u) ** 2))
    middle = jnp.dot(a, curvature.solve(a)) + jnp.sum((u.T @ a) ** 2)
    epsilon = -jnp.sum(q * variance**2) / 8 + middle / 8 + cubic / 12
    ok = (error <= structure_tol(x.dtype)) & jnp.isfinite(epsilon)
    return jnp.where(ok, epsilon, 0.0)


def field_skewness(neg_log_density: Callable, x, band, half_width: int):
    r"""Each coordinate's skewness under :math:`p(x \mid \theta, y)` to leading order,
    :math:`\gamma_i = -\sum_j t_j \Sigma_{ij}^3 / \Sigma_{ii}^{3/2}` (the third cumulant
    :math:`-\phi_{jkl}\Sigma_{ij}\Sigma_{ik}\Sigma_{il}` with diagonal third derivatives), over
    the same pairs as the correction's cubic sum; NaN where the higher derivatives are not diagonal."""
    t, _, error = diagonal_derivatives(neg_log_density, x)
    _, diagonal, following, reach = _covariance_blocks(band, half_width)
    tb = _in_blocks(t, reach)
    third = jnp.einsum("nij,nj->ni", diagonal**3, tb)
    third = third.at[:-1].add(jnp.einsum("nij,nj->ni", following**3, tb[1:]))  # columns in the next block
    third = third.at[1:].add(jnp.einsum("nji,nj->ni", following**3, tb[:-1]))  # and in the previous one
    variance = jnp.diagonal(diagonal, axis1=-2, axis2=-1)
    gamma = (-third / variance**1.5).reshape(-1)[:x.shape[-1]]
    return jnp.where(error <= structure_tol(x.dtype), gamma, jnp.nan)


def log_det_gradient(neg_log_density: Callable, x, curvature, glob: tuple = ()):
    r"""``(gradient, error)``: :math:`\nabla_x \log\det H` at the conditional mode ``x`` of a field whose
    terms beyond the second order are each a function of one linear predictor (module docstring:
    :math:`\phi''' = \sum_i t_i v_i^{\otimes 3}`), from :math:`t` alone:
    :math:`\partial_a \log\det H = \mathrm{tr}(H^{-1} \partial_a H) = \sum_i t_i v_{ia} \Sigma_{\eta,ii}`,
    that is :math:`t_i \Sigma_{\eta,ii}` for field coordinate :math:`i` and
    :math:`\sum_i t_i C_{ig} \Sigma_{\eta,ii}` for the border's :math:`g`. ``curvature``: the fit's
    (:class:`~numpyro_lm.curvature.banded.BandedCurvature`, or with the border at positions ``glob``
    :class:`~numpyro_lm.curvature.banded_arrowhead.BandedArrowheadCurvature`), whose Takahashi
    variances and elimination give the diagonal of :math:`\Sigma_\eta`,
    :math:`K_{ii} + |((U - C) L_S^{-\top})_i|^2` (:func:`second_order_correction`'s). ``error``: the
    derivatives' check (:func:`diagonal_derivatives`, :func:`border_derivatives`); where it fails the
    gradient is not this. Reverse mode through the structured Hessian differentiates its ``2w + 2``
    products: on a CAR field over a 20 x 20 grid 3.2 ms of a design point's 7.7 ms."""
    dim = x.shape[-1]
    glob = np.asarray(glob, int)
    if not glob.size:
        t, _, error = diagonal_derivatives(neg_log_density, x, fourth=False)
        return t * curvature.variance(), error
    field = np.setdiff1d(np.arange(dim), glob)
    t, _, c, error = border_derivatives(neg_log_density, x, tuple(glob.tolist()), fourth=False)
    ls_inv_t = curvature.schur_inverse_root().T  # L_S^-T
    along = t * (curvature.field.variance() + jnp.sum(((curvature.u - c) @ ls_inv_t) ** 2, axis=1))
    return jnp.zeros(dim, x.dtype).at[field].set(along).at[glob].set(c.T @ along), error
