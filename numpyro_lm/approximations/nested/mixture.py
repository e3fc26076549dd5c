"""The nested design as a mixture: its moments, its draws and their exact density."""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.extend.random
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtr

from ...curvature.arrowhead import ArrowheadCurvature, placement
from ...curvature.banded import BandedCurvature
from ...curvature.banded import weighted_inverse as weighted_band_inverse
from ...curvature.banded_arrowhead import BandedArrowheadCurvature
from ...curvature.banded_arrowhead import weighted_inverse as weighted_bordered_inverse
from ...families.registry import basis_log_prob
from ...marginal.conditional import quantile_sites, x_positions
from ...runtime.precision import precise_jit
from ...runtime.programs import BATCH_COMPILE, program
from ...runtime.random import standard_normal
from ..joint_fit import rows_at_once
from .design import NestedDesign
from .lattice_design import cell_draws, cell_moments

__all__ = ["mixture_moments", "mixture_variances", "mixture_block", "MixtureDraws", "draw", "block_proposal"]


def _cells(design: NestedDesign):
    """Per point: the cell's mean and variances of ``z - z_k`` (a CCD's points carry no spread)."""
    # on a lattice z - z_k has the cell's density (mean m_k, variances v_k per axis) and
    # x's mean follows it along the point's slope
    if design.kind == "lattice":
        _, m, v = cell_moments(design.cell_slope, design.cell_curvature, design.step)
        return m, v
    return np.zeros_like(design.z), np.zeros_like(design.z)


def _components(design: NestedDesign):
    """``(w, theta, x_mean, v)``: each point's weight, its cell's mean of the hyperparameters
    and of the conditional means, and the cell's variances of ``z - z_k``."""
    m, v = _cells(design)
    theta = design.theta + m @ design.scale.T
    x_mean = design.x_mean + np.einsum("kia,ka->ki", design.x_slope, m)
    return np.exp(design.log_weights), theta, x_mean, v


def _cell_covariances(design: NestedDesign):
    r"""``(K, Dx, Dx)``: each cell's mean of the draws' conditional covariance
    :math:`E_u[L(u) L(u)^T] = \bar L \bar L^T + \sum_a v_a S_a S_a^T`, :math:`\bar L = L_k + \sum_a m_a S_a`
    (the cell's mean ``m`` and variances ``v`` of ``u``, independent across axes); the points'
    covariances where their factors do not follow ``u``."""
    if design.x_chol_slope is None:
        return design.x_cov
    m, v = _cells(design)
    slope = design.x_chol_slope
    mean_chol = design.x_chol + np.einsum("kija,ka->kij", slope, m)
    return (np.einsum("kij,klj->kil", mean_chol, mean_chol)
            + np.einsum("kija,ka,klja->kil", slope, v, slope, optimize=True))


def _cell_variances(design: NestedDesign):
    """``(K, Dx)``: the diagonals of :func:`_cell_covariances`."""
    if design.x_chol_slope is None:
        return design.x_var
    return np.diagonal(_cell_covariances(design), axis1=1, axis2=2)


def mixture_variances(design: NestedDesign, size: int):
    """Mean and variance of each flat coordinate under the design's mixture: the diagonal of
    :func:`mixture_moments`, in ``O(K D)`` (structured conditionals of large models)."""
    ti, xi = design.theta_index, design.x_index
    slope, scale = design.x_slope, design.scale
    w, theta, x_mean, v = _components(design)
    mean, var = np.zeros(size), np.zeros(size)
    mean[ti], mean[xi] = w @ theta, w @ x_mean
    var[ti] = w @ (theta - mean[ti]) ** 2 + np.einsum("ia,k,ka->i", scale**2, w, v)
    var[xi] = w @ _cell_variances(design) + w @ (x_mean - mean[xi]) ** 2 + np.einsum("kia,k,ka->i", slope**2, w, v)
    return mean, var


@precise_jit
def _weighted_blocks(curvature, w, cols):
    r""":math:`\sum_k w_k (H_k^{-1})_{II}` over the design's points, one after another in one program
    (a vmap would hold every point's block at once)."""

    def add(total, point):
        curvature_k, w_k = point
        return total + w_k * curvature_k.block(cols), None

    zero = jnp.zeros((cols.shape[0], cols.shape[0]), w.dtype)
    return jax.lax.scan(add, zero, (curvature, w))[0]


DENSE_INVERSE_MAX = 4000
"""Most conditional coordinates of a banded field (with its border) whose points' weighted inverse
:func:`mixture_block` makes whole (:func:`~numpyro_lm.curvature.banded.weighted_inverse`: ``D x D``
numbers) where its block covers at least a quarter of them; else one solve a column of the block.
A random walk of 2000 steps (87 points, every coordinate in the block): 0.39 s whole against
1.6 s by solves; a CAR field over a 20 x 20 grid (137 points): 0.07 s against 0.47 s."""


@precise_jit
def _weighted_inverse_block(curvature, w, cols):
    r""":math:`\sum_k w_k (H_k^{-1})_{II}` from the whole weighted inverse of banded fields."""
    if isinstance(curvature, BandedCurvature):
        return weighted_band_inverse(curvature, w)[cols][:, cols]
    return weighted_bordered_inverse(curvature, w)[cols][:, cols]


def _whole_inverse_pays(curvature, cols: np.ndarray) -> bool:
    """Whether :func:`mixture_block` takes the whole weighted inverse (:data:`DENSE_INVERSE_MAX`)."""
    if not isinstance(curvature, (BandedCurvature, BandedArrowheadCurvature)):
        return False
    if isinstance(curvature, BandedArrowheadCurvature):  # the positions are read from the first point
        same = [np.asarray(a) for a in (curvature.field_index, curvature.global_index)]
        if not all(np.all(a == a[:1]) for a in same):
            return False
    return curvature.dim <= DENSE_INVERSE_MAX and 4 * cols.size >= curvature.dim


def mixture_block(design: NestedDesign, cols: np.ndarray) -> np.ndarray:
    """The mixture's covariance over the conditional coordinates ``cols`` (positions in ``x``)
    from structured conditionals: each point's block of its curvature, the spread of the
    points' means and their slopes across a lattice cell (:func:`mixture_moments`' terms), the
    last two as one product each (an ``einsum`` over points, coordinates and axes took seconds
    over 2000 coordinates); the first from the whole weighted inverse of a banded field where the
    block covers most of it (:data:`DENSE_INVERSE_MAX`), else by one solve per column."""
    w, _, x_mean, v = _components(design)
    spread = (x_mean[:, cols] - w @ x_mean[:, cols]) * np.sqrt(w)[:, None]  # (K, c)
    slopes = design.x_slope[:, cols] * np.sqrt(w[:, None] * v)[:, None, :]  # (K, c, a)
    slopes = slopes.transpose(1, 0, 2).reshape(cols.size, -1)
    weigh = _weighted_inverse_block if _whole_inverse_pays(design.x_curvature, cols) else _weighted_blocks
    blocks = weigh(design.x_curvature, jnp.asarray(w), jnp.asarray(cols))
    cov = spread.T @ spread + slopes @ slopes.T + np.asarray(jax.device_get(blocks), np.float64)
    return 0.5 * (cov + cov.T)


def mixture_moments(design: NestedDesign, size: int):
    """Mean and covariance over all flat coordinates of the design's mixture."""
    ti, xi = design.theta_index, design.x_index
    slope, scale = design.x_slope, design.scale
    w, theta, x_mean, v = _components(design)
    mean = np.zeros(size)
    mean[ti] = w @ theta
    mean[xi] = w @ x_mean
    dt = theta - mean[ti]
    dx = x_mean - mean[xi]
    cov = np.zeros((size, size))
    cov[np.ix_(ti, ti)] = (dt * w[:, None]).T @ dt + np.einsum("ia,k,ka,ja->ij", scale, w, v, scale)
    cov[np.ix_(xi, xi)] = (np.einsum("k,kij->ij", w, _cell_covariances(design)) + (dx * w[:, None]).T @ dx
                           + np.einsum("kia,k,ka,kja->ij", slope, w, v, slope))
    cross = (dt * w[:, None]).T @ dx + np.einsum("ia,k,ka,kja->ij", scale, w, v, slope)
    cov[np.ix_(ti, xi)] = cross
    cov[np.ix_(xi, ti)] = cross.T
    return mean, 0.5 * (cov + cov.T)


def _quantile(family, params, s):
    # not jitted: on concrete inputs the host quantile functions (numpyro_lm.families.quantiles) run
    # directly, where under jit they are a pure_callback, which in a test-suite process
    # pinned to one core hung here for good (its argument's copy waits on the one pool thread)
    return family.basis_quantile(params, ndtr(s))


@partial(precise_jit, static_argnums=0)
def _log_prob(family, params, y):
    return basis_log_prob(family, params, y)


def _split_normal(rng, sigma, n):
    """``(z (n, d), log density (n,))`` of independent split normals (scales ``sigma (d, 2)``)."""
    e = rng.standard_normal((n, sigma.shape[0]))
    s = np.where(e < 0, sigma[:, 0], sigma[:, 1])
    z = e * s
    log_density = np.sum(np.log(2.0 / (sigma[:, 0] + sigma[:, 1])) - 0.5 * math.log(2 * math.pi) - 0.5 * e**2, 1)
    return z, log_density


GATHER_MAX = 2**22
"""Most numbers in the draws' gathered factors (``n Dx^2``) for :func:`_factor_noise` to take every
draw's at once; above, it works point by point (no ``(n, Dx, Dx)`` array)."""


def _factor_noise(k, eps, chol, u, chol_slope):
    r"""``(L(u_n) eps_n, log det L(u_n))`` for every draw: :math:`L(u) = L_k + \sum_a S_{ka} u_a`
    (``chol_slope`` ``S``; ``None``: ``L_k``), as :math:`L_k \epsilon + \sum_a u_a S_{ka} \epsilon`
    over all draws at once where they are few (:data:`GATHER_MAX`; eight schools' 4000 draws over 29
    points and 9 coordinates: the draws took 4.0 ms, 7.3 ms looping over points), else grouped by point."""
    d = 0 if chol_slope is None else chol_slope.shape[-1]
    if len(k) * chol[0].size <= GATHER_MAX:
        out = np.einsum("nij,nj->ni", chol[k], eps)
        diag = np.diagonal(chol, axis1=1, axis2=2)[k]
        for a in range(d):
            out += u[:, a : a + 1] * np.einsum("nij,nj->ni", chol_slope[..., a][k], eps)
            diag = diag + u[:, a : a + 1] * np.diagonal(chol_slope[..., a], axis1=1, axis2=2)[k]
        return out, np.sum(np.log(diag), axis=1)
    out, log_det = np.empty_like(eps), np.empty(len(k))
    order = np.argsort(k, kind="stable")
    bounds = np.searchsorted(k[order], np.arange(len(chol) + 1))
    for j in np.flatnonzero(np.diff(bounds)):
        rows = order[bounds[j] : bounds[j + 1]]
        out[rows] = eps[rows] @ chol[j].T
        diag = np.broadcast_to(np.diagonal(chol[j]), (rows.size, chol.shape[1]))
        if chol_slope is not None:
            # sum_a u_a S_a eps as one product (an einsum's path search cost more than the sum)
            moved = (eps[rows] @ chol_slope[j].transpose(1, 0, 2).reshape(chol.shape[1], -1)).reshape(rows.size, -1, d)
            out[rows] += np.sum(moved * u[rows][:, None, :], axis=2)
            diag = diag + u[rows] @ np.diagonal(chol_slope[j])  # (n, d) (d, Dx)
        log_det[rows] = np.sum(np.log(diag), axis=1)
    return out, log_det


DRAWS_PRNG = jax.extend.random.rbg_prng_impl
"""JAX's generator behind the structured draws' normals: ``rbg`` (XLA's RngBitGenerator for the
bits, threefry for ``fold_in``) where JAX's default is threefry; 10^8 float32 normals in rows of
64: 1.08 s where threefry took 1.34 s (2 cores)."""

NOISE_ROWS = 64
"""Draws whose point's curvature is gathered at once by :func:`_structured_draws` (memory: this many
copies of a point's structured curvature); on a CPU at most
:func:`~numpyro_lm.approximations.joint_fit.rows_at_once`'s."""


def flat_runs(theta_index, x_index) -> tuple:
    """How a flat row is assembled from its hyperparameters ``t`` and its field ``x``: static
    ``((source, start, stop), ...)`` runs in flat order, ``source`` 0 for ``t``, 1 for ``x``
    (a concatenation of slices, where a scatter into ``n x D`` would be a loop of its own)."""
    size = len(theta_index) + len(x_index)
    source, position = np.empty(size, np.int64), np.empty(size, np.int64)
    source[theta_index], position[theta_index] = 0, np.arange(len(theta_index))
    source[x_index], position[x_index] = 1, np.arange(len(x_index))
    breaks = np.flatnonzero((np.diff(source) != 0) | (np.diff(position) != 1)) + 1
    starts, stops = np.concatenate([[0], breaks]), np.concatenate([breaks, [size]])
    return tuple((int(source[a]), int(position[a]), int(position[a] + b - a)) for a, b in zip(starts, stops))


def _fixed_indices(curvature):
    """``((start, J, b), global positions)`` of an arrowhead curvature whose blocks are at the same
    contiguous positions at every design point (:func:`~numpyro_lm.curvature.arrowhead.placement`):
    hashable, so that the draws' program reads them as constants (slices, not a scatter per draw);
    else ``None``."""
    if not isinstance(curvature, ArrowheadCurvature):
        return None
    local, glob = np.asarray(curvature.local_index), np.asarray(curvature.global_index)
    if not (np.all(local == local[:1]) and np.all(glob == glob[:1])) or placement(local[0], glob[0]) is None:
        return None
    return (int(local[0].ravel()[0]),) + local.shape[1:], tuple(int(i) for i in glob[0])


def _structured_program(rows, runs, indices, curvatures, x_mean, x_slope, key, k, u, theta, mapped, args, kwargs):
    """The draws' program (:func:`_structured_draws`; compiled by :func:`~numpyro_lm.runtime.programs.program`
    with LLVM's optimisations: XLA's defaults took 1.3 s to compile it): each row's normals drawn
    where they are used (``fold_in`` of the row's number: no ``n x Dx`` array of them), its flat
    row assembled by :func:`flat_runs`."""
    dx = x_mean.shape[1]

    key = jax.random.wrap_key_data(key, impl=DRAWS_PRNG)

    def one(inputs):
        i, point, offset, t = inputs
        e = standard_normal(jax.random.fold_in(key, i), (dx,), x_mean.dtype)
        curvature = jax.tree.map(lambda a: a[point], curvatures)
        if indices is not None:
            (start, blocks, size), glob = indices
            curvature = curvature._replace(local_index=np.arange(start, start + blocks * size).reshape(blocks, size),
                                           global_index=np.asarray(glob, np.int64))
        noise = curvature.inv_sqrt(e)
        x = x_mean[point] + x_slope[point] @ offset + noise
        parts = (t.astype(x.dtype), x)
        # no x[mapped] where it is empty (lax.map cannot stack zero-size rows)
        picked = (x[mapped],) if mapped.shape[0] else ()
        return jnp.concatenate([parts[s][a:b] for s, a, b in runs]), picked, jnp.sum(e * e)

    rows_index = jnp.arange(k.shape[0], dtype=jnp.uint32)
    flat, picked, quad = jax.lax.map(one, (rows_index, k, u, theta), batch_size=rows)
    x_mapped = picked[0] if picked else jnp.zeros((k.shape[0], 0), x_mean.dtype)
    return flat, x_mapped, quad, jax.vmap(lambda c: -0.5 * c.logdet())(curvatures)


def _structured_draws(rng: np.random.Generator, design: NestedDesign, theta, k, u, mapped):
    """``(flat (n, D) on the device, x[:, mapped] (host), eps' eps (n,), log det S per point)``
    for structured curvatures: ``x_k + slope_k u + S_k eps`` per draw and the flat rows in one
    program (compiled once per number of draws: a warm call compiles nothing), in the working
    precision (the device's draws are float32 anyway), with no ``n x D`` array on the host.
    At 10^5 coordinates and 1000 draws: 5.3 s with host normals and the arrowhead's scatter per
    draw, 3.3 s with both gone, of which 1.8-1.9 s are the 10^8 normals alone."""
    dtype = jnp.result_type(float)
    key = rng.integers(0, 2**32, size=DRAWS_PRNG.key_shape, dtype=np.uint32)  # the device's stream, from the host's
    rows = min(NOISE_ROWS, rows_at_once(design.x_mode.shape[1], len(k)))
    runs = flat_runs(design.theta_index, design.x_index)
    indices = _fixed_indices(design.x_curvature)
    flat, x_mapped, quad, log_det = program(_structured_program, rows, runs, indices, compiler_options=BATCH_COMPILE)(
        (design.x_curvature, np.asarray(design.x_mean, dtype), np.asarray(design.x_slope, dtype), key,
         np.asarray(k, np.int32), np.asarray(u, dtype), np.asarray(theta, dtype), np.asarray(mapped, np.int32)))
    x_mapped, quad, log_det = jax.device_get((x_mapped, quad, log_det))
    return flat, np.asarray(x_mapped), np.asarray(quad, np.float64), np.asarray(log_det, np.float64)


def _set_sites(offsets, flat, *values):
    """``flat`` with the columns from each of ``offsets`` replaced by ``values`` (the matched
    families' draws: a device array's update, not a copy through the host)."""
    for offset, v in zip(offsets, values):
        flat = jax.lax.dynamic_update_slice(flat, v.astype(flat.dtype), (0, offset))
    return flat


class MixtureDraws(NamedTuple):
    """Draws from the design's mixture (:func:`draw`)."""

    flat: object  # (n, D) basis coordinates: a host array, or a device array (structured conditionals)
    log_q: Callable  # () -> (n,) their log density, computed on request
    point: np.ndarray  # (n,) the design point k of each draw
    offset: np.ndarray  # (n, d) u = z - z_k, the draw's hyperparameters from its point (standardised)
    log_q_hyper: np.ndarray  # (n,) the log density of the draw's hyperparameters alone
    mapped: np.ndarray  # (n, M) host copy of the columns drawn through matched families (quantile sites)


def draw(rng: np.random.Generator, design: NestedDesign, layout, num_samples: int) -> MixtureDraws:
    """:class:`MixtureDraws` from the design's mixture (module docstring).

    ``log_q()`` computes the draws' log density (``(n,)``) when it is needed (the PSIS
    diagnostics): drawing alone compiles and runs no family density.
    """
    theta, k, u, log_q = _hyper_draws(rng, design, num_samples)
    log_q_hyper = log_q
    sites = quantile_sites(layout, design.theta_index)
    positions = x_positions(layout, design.theta_index)
    mapped_x = np.concatenate([positions[site.name] for site, _ in sites] + [np.zeros(0, int)])
    flat, x_mapped, quad, log_det, mean_of = _conditional_draws(rng, design, theta, k, u, mapped_x)
    dx = design.x_mode.shape[1]
    log_q = log_q - 0.5 * quad - log_det - 0.5 * dx * math.log(2 * math.pi)
    mapped = _family_draws(rng, design, sites, positions, x_mapped, k, mean_of)
    if isinstance(flat, np.ndarray):
        for (site, _), (_, _, y, _, _) in zip(sites, mapped):
            flat[:, site.offset : site.offset + site.size] = y.reshape(num_samples, -1)
    elif mapped:
        offsets = tuple(site.offset for site, _ in sites)
        flat = program(_set_sites, offsets)((flat,) + tuple(np.asarray(y.reshape(num_samples, -1), flat.dtype)
                                                             for _, _, y, _, _ in mapped))

    def log_density():
        # the copula density: each mapped coordinate's Gaussian marginal replaced by the
        # family's (for uncoupled coordinates both terms are exact whatever s is)
        out = log_q
        dtype = jnp.result_type(float)
        for family, params, y, sd, s in mapped:
            term = np.log(sd) + np.asarray(_log_prob(family, params, jnp.asarray(y, dtype)), np.float64)
            term = term + 0.5 * s**2 + 0.5 * math.log(2 * math.pi)
            out = out + term.reshape(num_samples, -1).sum(1)
        return out

    values = np.concatenate([y.reshape(num_samples, -1) for _, _, y, _, _ in mapped] + [np.zeros((num_samples, 0))],
                            axis=1)
    return MixtureDraws(flat, log_density, k, u, log_q_hyper, values)


def block_proposal(x_index, local, glob, x_mean, x_slope, coupling, precision, schur_chol):
    r"""The mixture's side of :func:`~numpyro_lm.marginal.collapsed.collapsed_value` for structured
    conditionals with scalar blocks: ``proposal(row, (k, u))`` gives each block's conditional mean
    and variance given the row's globals, and the globals' log density given the hyperparameters.
    Given the point ``k`` and ``u``, the conditional is
    :math:`N(\mu, H_k^{-1})` with :math:`\mu = \bar x_k + \text{slope}_k u`; its arrowhead factor
    gives :math:`g \sim N(\mu_G, S_k^{-1})` and :math:`z \mid g \sim N(\mu_L - U_k (g - \mu_G), A_k^{-1})`.

    ``x_index`` the flat coordinates of ``x``; ``local (J,)``, ``glob (G,)`` positions in ``x``;
    ``x_mean (K, Dx)``, ``x_slope (K, Dx, d)``; ``coupling (K, J, G)`` the :math:`U_k`,
    ``precision (K, J)`` the blocks' :math:`A_k`, ``schur_chol (K, G, G)`` the factors of :math:`S_k`.
    """
    def proposal(row, extra):
        k, u = extra
        mu = x_mean[k] + x_slope[k] @ u
        dg = row[x_index[glob]] - mu[glob]
        white = schur_chol[k].T @ dg
        log_q_globals = (jnp.sum(jnp.log(jnp.diagonal(schur_chol[k]))) - 0.5 * jnp.dot(white, white)
                         - 0.5 * glob.shape[0] * math.log(2 * math.pi))
        return mu[local] - coupling[k] @ dg, 1.0 / precision[k], log_q_globals

    return proposal


def _hyper_draws(rng: np.random.Generator, design: NestedDesign, num_samples: int):
    """``(theta (n, d), the design point k of each draw, u = z - z_k, log q of theta)``: on a lattice
    a cell by weight and ``z`` inside it from the cell's density; on a CCD the split-normal and the
    nearest design point's conditional."""
    if design.kind == "lattice":
        w = np.exp(design.log_weights)
        k = rng.choice(w.size, size=num_samples, p=w / w.sum())
        g, c = design.cell_slope[k], design.cell_curvature[k]
        u = cell_draws(rng, g, c, design.step)  # z - z_k
        theta = design.theta[k] + u @ design.scale.T
        log_mass = cell_moments(design.cell_slope, design.cell_curvature, design.step)[0]
        log_cell = np.sum(g * u - 0.5 * c * u**2 - log_mass[k], 1)
        return theta, k, u, design.log_weights[k] + log_cell - np.linalg.slogdet(design.scale)[1]
    z, log_q = _split_normal(rng, design.sigma, num_samples)
    theta = design.mode + z @ design.scale.T
    k = np.argmin(np.sum((z[:, None, :] - design.z[None]) ** 2, -1), axis=1)
    return theta, k, z - design.z[k], log_q - np.linalg.slogdet(design.scale)[1]


def _conditional_draws(rng: np.random.Generator, design: NestedDesign, theta, k, u, mapped_x):
    """``(flat (n, D) without the quantile sites' draws, x[:, mapped_x] (host), eps' eps,
    log det of each draw's factor, mean_of(cols))``: the field given theta from its design point's
    conditional Gaussian, its mean (and on a lattice with dense conditionals its Cholesky factor)
    following ``u`` along the point's slope."""
    num_samples = len(k)
    if design.x_cov is None:
        # structured conditionals of a large model: drawn and assembled on the device
        flat, x_mapped, quad, log_det = _structured_draws(rng, design, theta, k, u, mapped_x)

        def mean_of(cols):
            return design.x_mean[:, cols][k] + np.einsum("nia,na->ni", design.x_slope[:, cols][k], u)

        return flat, x_mapped, quad, log_det[k], mean_of
    eps = rng.standard_normal((num_samples, design.x_mode.shape[1]))
    x_mean = design.x_mean[k] + np.einsum("nia,na->ni", design.x_slope[k], u)
    noise, log_det = _factor_noise(k, eps, design.x_chol, u, design.x_chol_slope)
    x = x_mean + noise
    # the device path's runs of columns (NumPy's column scatter over 10^5 columns took seconds)
    parts = (np.asarray(theta, np.float64), x)
    flat = np.concatenate([parts[s][:, a:b] for s, a, b in flat_runs(design.theta_index, design.x_index)], axis=1)
    return flat, x[:, mapped_x], np.sum(eps**2, 1), log_det, lambda cols: x_mean[:, cols]


def _family_draws(rng: np.random.Generator, design: NestedDesign, sites, positions, x_mapped, k, mean_of) -> list:
    """The quantile ``sites`` drawn through each design point's matched family from their
    Gaussian draws ``x_mapped`` (their columns of ``x``, in ``sites``' order): ``[(family, params, y, sd, s)]``,
    ``y`` the draws, for the caller to write into the flat rows and for their density."""
    num_samples = len(k)
    var, dtype, mapped, at = design.x_var, jnp.result_type(float), [], 0
    for site, family in sites:
        cols = positions[site.name]
        shape = (num_samples,) + site.basis_shape
        params = {n: np.asarray(v, np.float64)[k] for n, v in design.point_params[site.name].items()}
        sd = np.sqrt(var[:, cols][k]).reshape(shape)
        x = x_mapped[:, at : at + cols.size]
        at += cols.size
        s = (x.reshape(shape) - mean_of(cols).reshape(shape)) / sd
        # coordinates coupled to no other (the independence copula) are drawn from the family
        # itself where it has a host sampler; the others through its quantile function
        alone = design.uncoupled[cols].reshape(site.basis_shape) & (family.host_sample is not None)
        if np.all(alone):
            y = family.host_sample(rng, params)
        else:
            y = np.asarray(_quantile(family, params, jnp.asarray(s, dtype)), np.float64)
            if np.any(alone):
                y = np.where(alone, family.host_sample(rng, params), y)
        mapped.append((family, params, y, sd, s))
    return mapped
