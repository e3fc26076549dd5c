"""The nested design as a mixture: its moments, its draws and their exact density."""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtr

from ...families.registry import basis_log_prob
from ...marginal.conditional import quantile_sites, x_positions
from ...runtime.programs import BATCH_COMPILE, program
from ..joint_fit import rows_at_once
from .design import NestedDesign, cell_draws, cell_moments

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


def mixture_variances(design: NestedDesign, size: int):
    """Mean and variance of each flat coordinate under the design's mixture: the diagonal of
    :func:`mixture_moments`, in ``O(K D)`` (structured conditionals of large models)."""
    ti, xi = design.theta_index, design.x_index
    slope, scale = design.x_slope, design.scale
    w, theta, x_mean, v = _components(design)
    mean, var = np.zeros(size), np.zeros(size)
    mean[ti], mean[xi] = w @ theta, w @ x_mean
    var[ti] = w @ (theta - mean[ti]) ** 2 + np.einsum("ia,k,ka->i", scale**2, w, v)
    var[xi] = w @ design.x_var + w @ (x_mean - mean[xi]) ** 2 + np.einsum("kia,k,ka->i", slope**2, w, v)
    return mean, var


@jax.jit
def _curvature_block(curvature, cols):
    return curvature.block(cols)


def mixture_block(design: NestedDesign, cols: np.ndarray) -> np.ndarray:
    """The mixture's covariance over the conditional coordinates ``cols`` (positions in ``x``)
    from structured conditionals: each point's block of its curvature, the spread of the
    points' means and their slopes across a lattice cell (:func:`mixture_moments`' terms)."""
    w, _, x_mean, v = _components(design)
    x_mean = x_mean[:, cols]
    d = x_mean - w @ x_mean
    cov = (d * w[:, None]).T @ d + np.einsum("kia,k,ka,kja->ij", design.x_slope[:, cols], w, v, design.x_slope[:, cols])
    for k in range(w.size):
        curvature = jax.tree.map(lambda a: a[k], design.x_curvature)
        cov += w[k] * np.asarray(jax.device_get(_curvature_block(curvature, cols)), np.float64)
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
    cov[np.ix_(xi, xi)] = (np.einsum("k,kij->ij", w, design.x_cov) + (dx * w[:, None]).T @ dx
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


@partial(jax.jit, static_argnums=0)
def _log_prob(family, params, y):
    return basis_log_prob(family, params, y)


def _split_normal(rng, sigma, n):
    """``(z (n, d), log density (n,))`` of independent split normals (scales ``sigma (d, 2)``)."""
    e = rng.standard_normal((n, sigma.shape[0]))
    s = np.where(e < 0, sigma[:, 0], sigma[:, 1])
    z = e * s
    log_density = np.sum(np.log(2.0 / (sigma[:, 0] + sigma[:, 1])) - 0.5 * math.log(2 * math.pi) - 0.5 * e**2, 1)
    return z, log_density


def _cholesky(cov):
    """Cholesky factors of the design points' conditional covariances ``(K, n, n)``. A point
    deep in a funnel (a hierarchical scale near zero) has a covariance whose smallest
    eigenvalues, computed in float32, are rounding: one slightly negative makes the
    factorisation fail. Those points' eigenvalues are floored at float32's resolution of
    their largest (the precision they were computed to); the others are factored as they are."""
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        out = np.empty_like(cov)
        floor = np.finfo(np.float32).eps
        for i, c in enumerate(cov):
            try:
                out[i] = np.linalg.cholesky(c)
            except np.linalg.LinAlgError:
                w, q = np.linalg.eigh(0.5 * (c + c.T))
                w = np.maximum(w, floor * np.max(np.abs(w)))
                out[i] = np.linalg.cholesky((q * w) @ q.T)
        return out


def _by_point(k, eps, chol):
    """``chol[k_n] @ eps_n`` for every draw, grouped by design point (no (n, Dx, Dx) gather)."""
    out = np.empty_like(eps)
    order = np.argsort(k, kind="stable")
    bounds = np.searchsorted(k[order], np.arange(len(chol) + 1))
    for j in np.flatnonzero(np.diff(bounds)):
        rows = order[bounds[j] : bounds[j + 1]]
        out[rows] = eps[rows] @ chol[j].T
    return out


NOISE_ROWS = 64
"""Draws whose point's curvature is gathered at once by :func:`_structured_draws` (memory: this many
copies of a point's structured curvature); on a CPU at most
:func:`~numpyro_lm.approximations.joint_fit.rows_at_once`'s."""


def _structured_program(rows, curvatures, x_mean, x_slope, k, u, eps, args, kwargs):
    """The draws' program (:func:`_structured_draws`; compiled by :func:`~numpyro_lm.runtime.programs.program`
    with LLVM's optimisations: XLA's defaults took 1.3 s to compile it)."""
    def one(inputs):
        point, offset, e = inputs
        noise = jax.tree.map(lambda a: a[point], curvatures).inv_sqrt(e)
        return x_mean[point] + x_slope[point] @ offset + noise, jnp.sum(e * e)

    x, quad = jax.lax.map(one, (k, u, eps), batch_size=rows)
    return x, quad, jax.vmap(lambda c: -0.5 * c.logdet())(curvatures)


def _structured_draws(design: NestedDesign, k, u, eps):
    """``(x (n, Dx), eps' eps (n,), log det S per point)`` for structured curvatures: ``x_k + slope_k u
    + S_k eps`` per draw in one program (compiled once per number of draws: a warm call compiles
    nothing), ``x`` in the working precision (the device's draws are float32 anyway)."""
    dtype = jnp.result_type(float)
    rows = min(NOISE_ROWS, rows_at_once(eps.shape[1], eps.shape[0]))
    x, quad, log_det = jax.device_get(program(_structured_program, rows, compiler_options=BATCH_COMPILE)(
        (design.x_curvature, np.asarray(design.x_mean, dtype), np.asarray(design.x_slope, dtype),
         np.asarray(k, np.int32), np.asarray(u, dtype), np.asarray(eps, dtype))))
    return np.asarray(x), np.asarray(quad, np.float64), np.asarray(log_det, np.float64)


def _put_columns(out, index, values):
    """``out[:, index] = values``, a contiguous run of ``index`` at a time (NumPy's column scatter
    over 10^5 columns of 1000 rows took seconds)."""
    index = np.asarray(index)
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    for lo, hi in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [index.size]])):
        out[:, index[lo]:index[lo] + hi - lo] = values[:, lo:hi]


class MixtureDraws(NamedTuple):
    """Draws from the design's mixture (:func:`draw`), host arrays."""

    flat: np.ndarray  # (n, D) basis coordinates
    log_q: Callable  # () -> (n,) their log density, computed on request
    point: np.ndarray  # (n,) the design point k of each draw
    offset: np.ndarray  # (n, d) u = z - z_k, the draw's hyperparameters from its point (standardised)
    log_q_hyper: np.ndarray  # (n,) the log density of the draw's hyperparameters alone


def draw(rng: np.random.Generator, design: NestedDesign, layout, num_samples: int) -> MixtureDraws:
    """:class:`MixtureDraws` from the design's mixture (module docstring).

    ``log_q()`` computes the draws' log density (``(n,)``) when it is needed (the PSIS
    diagnostics): drawing alone compiles and runs no family density.
    """
    theta, k, u, log_q = _hyper_draws(rng, design, num_samples)
    log_q_hyper = log_q
    x, quad, log_det, mean_of = _conditional_draws(rng, design, k, u, num_samples)
    # a large model's draws in the working precision (n x D: 0.8 GB in float64 at 10^5 coordinates)
    flat = np.empty((num_samples, layout.size), x.dtype)
    _put_columns(flat, design.theta_index, theta)
    _put_columns(flat, design.x_index, x)
    dx = design.x_mode.shape[1]
    log_q = log_q - 0.5 * quad - log_det[k] - 0.5 * dx * math.log(2 * math.pi)
    mapped = _family_draws(rng, design, layout, flat, x, k, mean_of)

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

    return MixtureDraws(flat, log_density, k, u, log_q_hyper)


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


def _conditional_draws(rng: np.random.Generator, design: NestedDesign, k, u, num_samples: int):
    """``(x (n, Dx), eps' eps, log det S_k per point, mean_of(cols))``: the field given theta from
    its design point's conditional Gaussian, its mean following ``u`` along the point's slope."""
    dx = design.x_mode.shape[1]
    if design.x_cov is None:
        # structured conditionals of a large model: on the device, and n x D arrays kept to a
        # few (float32 normals, x)
        eps = rng.standard_normal((num_samples, dx), dtype=np.float32)
        x, quad, log_det = _structured_draws(design, k, u, eps)
        del eps

        def mean_of(cols):
            return design.x_mean[:, cols][k] + np.einsum("nia,na->ni", design.x_slope[:, cols][k], u)

        return x, quad, log_det, mean_of
    eps = rng.standard_normal((num_samples, dx))
    x_mean = design.x_mean[k] + np.einsum("nia,na->ni", design.x_slope[k], u)
    chol = _cholesky(design.x_cov)
    log_det = np.sum(np.log(np.diagonal(chol, axis1=1, axis2=2)), axis=1)
    return x_mean + _by_point(k, eps, chol), np.sum(eps**2, 1), log_det, lambda cols: x_mean[:, cols]


def _family_draws(rng: np.random.Generator, design: NestedDesign, layout, flat, x, k, mean_of) -> list:
    """The sites drawn through each design point's matched family (quantile sites), written into
    ``flat``: ``[(family, params, y, sd, s)]`` for their density."""
    num_samples = flat.shape[0]
    positions = x_positions(layout, design.theta_index)
    var, dtype, mapped = design.x_var, jnp.result_type(float), []
    for site, family in quantile_sites(layout, design.theta_index):
        cols = positions[site.name]
        shape = (num_samples,) + site.basis_shape
        params = {n: np.asarray(v, np.float64)[k] for n, v in design.point_params[site.name].items()}
        sd = np.sqrt(var[:, cols][k]).reshape(shape)
        s = (x[:, cols].reshape(shape) - mean_of(cols).reshape(shape)) / sd
        # coordinates coupled to no other (the independence copula) are drawn from the family
        # itself where it has a host sampler; the others through its quantile function
        alone = design.uncoupled[cols].reshape(site.basis_shape) & (family.host_sample is not None)
        if np.all(alone):
            y = family.host_sample(rng, params)
        else:
            y = np.asarray(_quantile(family, params, jnp.asarray(s, dtype)), np.float64)
            if np.any(alone):
                y = np.where(alone, family.host_sample(rng, params), y)
        flat[:, site.offset : site.offset + site.size] = y.reshape(num_samples, -1)
        mapped.append((family, params, y, sd, s))
    return mapped
