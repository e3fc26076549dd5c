r"""Nested Laplace over hyperparameters (INLA, Rue, Martino and Chopin 2009) for any model.

A joint Laplace approximation fails on hierarchical models: the joint mode of a group
scale sits far from the bulk of its marginal posterior. Split the LM basis coordinates
into a few hyperparameters :math:`\theta` and the rest :math:`x`. For fixed
:math:`\theta` the conditional :math:`p(x \mid \theta, y)` is close to Gaussian, and

.. math:: \log \tilde p(\theta \mid y) = \log p(y, x^*(\theta), \theta)
          - \tfrac12 \log\det H(\theta) + \text{const},

with :math:`x^*(\theta)` the conditional mode (inner Newton, warm-started) and
:math:`H(\theta)` the negative Hessian in :math:`x` there, is the Laplace approximation of
the hyperparameters' marginal posterior. We find its mode :math:`\theta^*` and curvature
(Newton with central differences on a stencil of 0.2 posterior SDs, evaluated in one
vectorised call), standardise :math:`\theta = \theta^* + V\Lambda^{-1/2} z`, and integrate
on a regular grid in ``z`` (step 0.5 over [-6, 6] in 1-D, 0.75 over [-4.5, 4.5] in 2-D,
1 over [-4, 4] in 3-D), each point weighted by :math:`\tilde p(\theta_k \mid y)` (a
regular grid: equal volumes). Where more than 0.1% of the weight sits on the grid's outer
layer (skewed marginals: a scale's log has a heavy tail towards zero) the grid is widened
1.5, 2 and 3 times before a warning is given. More than three hyperparameters are refused.

The posterior is the mixture :math:`\sum_k w_k\, U(\text{cell}_k)(\theta)\,
N(x; x^*_k, H_k^{-1})`: draws pick a grid cell by weight, a :math:`\theta` uniformly
inside it, and :math:`x` from that cell's conditional Gaussian. The matched family of
each site comes from the mixture's first two moments in the LM basis (mean and
covariance, within-cell spread of :math:`\theta` included): the Gaussian with those moments
is mapped by Laplace Matching.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .laplace import evaluate, initial_state, newton_minimize

__all__ = ["NestedDesign", "GRIDS", "conditional_fit", "explore", "mixture_moments"]

# (step, half-width) of the integration grid in standardised units, by dimension
GRIDS = {1: (0.5, 6.0), 2: (0.75, 4.5), 3: (1.0, 4.0)}


class NestedDesign(NamedTuple):
    """The integration design over the hyperparameters and the conditionals at its points."""

    theta_index: np.ndarray  # flat coordinates of the hyperparameters
    x_index: np.ndarray  # flat coordinates of the other latents
    mode: np.ndarray  # theta*, basis coordinates
    scale: np.ndarray  # V Lambda^-1/2: theta = mode + scale @ z
    step: float
    z: np.ndarray  # (K, d) standardised design points
    theta: np.ndarray  # (K, d)
    log_weights: np.ndarray  # (K,) normalised
    x_mode: np.ndarray  # (K, Dx) conditional modes
    x_cov: np.ndarray  # (K, Dx, Dx) conditional covariances
    edge_mass: float  # weight of the grid's outer layer
    num_outer_iter: int


def conditional_fit(neg_log_density: Callable, theta, x0, theta_index, x_index, size: int, tol: float, max_iter: int):
    """Inner Laplace at ``theta``: ``(log p~(theta | y), x*, cov of x | theta)``."""

    def fn(x):
        flat = jnp.zeros(size, x.dtype).at[theta_index].set(theta).at[x_index].set(x)
        return neg_log_density(flat)

    state = newton_minimize(fn, initial_state(x0), tol, max_iter)
    state = evaluate(fn, state)
    eigval, eigvec = state.eigenvalues, state.eigenvectors
    positive = jnp.all(eigval > 0)
    log_marginal = -state.value - 0.5 * jnp.sum(jnp.log(jnp.where(positive, eigval, 1.0)))
    log_marginal = jnp.where(positive & jnp.isfinite(log_marginal), log_marginal, -jnp.inf)
    cov = (eigvec / jnp.where(positive, eigval, jnp.nan)) @ eigvec.T
    return log_marginal, state.x, cov


def _stencil(d: int) -> np.ndarray:
    """Central-difference offsets: 0, +-e_i, and (+-e_i +-e_j) for i < j."""
    points = [np.zeros(d)]
    for i in range(d):
        for s in (1.0, -1.0):
            e = np.zeros(d)
            e[i] = s
            points.append(e)
    for i in range(d):
        for j in range(i + 1, d):
            for si in (1.0, -1.0):
                for sj in (1.0, -1.0):
                    e = np.zeros(d)
                    e[i], e[j] = si, sj
                    points.append(e)
    return np.array(points)


def _derivatives(values: np.ndarray, h: np.ndarray, d: int):
    """Gradient and Hessian of the stencil values (offsets ``h_i e_i``)."""
    f0 = values[0]
    grad, hess = np.zeros(d), np.zeros((d, d))
    for i in range(d):
        fp, fm = values[1 + 2 * i], values[2 + 2 * i]
        grad[i] = (fp - fm) / (2 * h[i])
        hess[i, i] = (fp - 2 * f0 + fm) / h[i] ** 2
    k = 1 + 2 * d
    for i in range(d):
        for j in range(i + 1, d):
            fpp, fpm, fmp, fmm = values[k : k + 4]
            hess[i, j] = hess[j, i] = (fpp - fpm - fmp + fmm) / (4 * h[i] * h[j])
            k += 4
    return grad, hess


def explore(marginal: Callable, theta0, x0, max_iter: int = 50, tol: float = 1e-3):
    """Mode and curvature of ``log p~(theta)``; ``marginal(thetas (K, d), x0) -> (logp, x, cov)``.

    Newton ascent with central differences at 0.2 current posterior SDs (0.05 basis units
    at the start), backtracking over 8 step lengths evaluated in one call.
    Returns ``(mode, precision, x at the mode, iterations)``.
    """
    theta = np.asarray(theta0, np.float64)
    d = theta.size
    offsets = _stencil(d)
    h = np.full(d, 0.05)
    x_ref = x0
    for it in range(1, max_iter + 1):
        points = theta + offsets * h
        logp, xs, _ = marginal(np.asarray(points, x0.dtype), x_ref)
        logp = np.asarray(logp, np.float64)
        if not np.isfinite(logp[0]):
            raise ValueError("the Laplace marginal of the hyperparameters is not finite at the start")
        x_ref = xs[0]
        grad, hess = _derivatives(logp, h, d)
        neg = -hess
        eigval, eigvec = np.linalg.eigh(neg)
        # saddle-free: curvature magnitudes, floored
        eigval = np.maximum(np.abs(eigval), 1e-6 * max(1.0, np.max(np.abs(eigval))))
        step = eigvec @ ((eigvec.T @ grad) / eigval)
        decrement = float(np.sqrt(grad @ step))
        sd = np.sqrt(np.diag((eigvec / eigval) @ eigvec.T))
        if decrement < tol and np.all(np.diagonal(neg) > 0):
            return theta, (eigvec * eigval) @ eigvec.T if np.all(np.linalg.eigvalsh(neg) > 0) else neg, x_ref, it
        h = np.clip(0.2 * sd, 1e-3, 0.5)
        lengths = 0.5 ** np.arange(8)
        candidates = theta + lengths[:, None] * step
        cand_logp, cand_x, _ = marginal(np.asarray(candidates, x0.dtype), x_ref)
        cand_logp = np.asarray(cand_logp, np.float64)
        best = int(np.argmax(np.where(np.isfinite(cand_logp), cand_logp, -np.inf)))
        if cand_logp[best] > logp[0]:
            theta, x_ref = candidates[best], cand_x[best]
        elif decrement < 10 * tol:
            return theta, neg, x_ref, it
        else:
            h = h / 2
    raise ValueError(
        f"the mode of the hyperparameters' Laplace marginal was not found in {max_iter} iterations "
        f"(last Newton step {decrement:.2e} SDs); the marginal may be improper (check the priors)."
    )


def grid(d: int, widen: float = 1.0):
    """``(step, z points (K, d), on-edge mask)`` of the regular design, ``widen`` times wider."""
    if d not in GRIDS:
        raise ValueError(
            f"nested Laplace integrates over at most 3 hyperparameters (a grid); {d} were given. "
            "Choose fewer hyper= sites."
        )
    step, half = GRIDS[d]
    half = step * round(widen * half / step)
    axis = np.arange(-half, half + step / 2, step)
    z = np.stack([g.ravel() for g in np.meshgrid(*([axis] * d), indexing="ij")], -1)
    edge = np.any(np.isclose(np.abs(z), half), axis=1)
    return step, z, edge


def mixture_moments(design: NestedDesign, size: int):
    """Mean and covariance over all flat coordinates of the design's mixture."""
    w = np.exp(design.log_weights)
    ti, xi = design.theta_index, design.x_index
    mean = np.zeros(size)
    mean[ti] = w @ design.theta
    mean[xi] = w @ design.x_mode
    dt = design.theta - mean[ti]
    dx = design.x_mode - mean[xi]
    # theta is uniform inside its cell: add the within-cell covariance step^2/12 (in z)
    cell = design.scale @ design.scale.T * design.step**2 / 12.0
    cov = np.zeros((size, size))
    cov[np.ix_(ti, ti)] = (dt * w[:, None]).T @ dt + cell
    cov[np.ix_(xi, xi)] = np.einsum("k,kij->ij", w, design.x_cov) + (dx * w[:, None]).T @ dx
    cross = (dt * w[:, None]).T @ dx
    cov[np.ix_(ti, xi)] = cross
    cov[np.ix_(xi, ti)] = cross.T
    return mean, 0.5 * (cov + cov.T)


def _quantile_sites(layout, hyper_index):
    """Sites outside the hyperparameters matched coordinate by coordinate (Gamma, Beta...)."""
    from .families import get_family
    from .marginals import is_elementwise

    hyper = set(int(i) for i in hyper_index)
    out = []
    for site in layout.sites:
        family = get_family(site.family, site.basis)
        if site.offset not in hyper and family.copula == "quantile" and is_elementwise(site, family):
            out.append((site, family))
    return out


def draw(rng: np.random.Generator, design: NestedDesign, layout, num_samples: int):
    """``(flat draws (n, D), log q (n,))`` from the mixture (module docstring).

    Coordinates of sites matched elementwise (Gamma, Beta...) are mapped from their
    conditional Gaussian through that grid point's matched family (the Gaussian copula of
    :mod:`numpyro_lm.copula`, per point), so conjugate conditionals (a Beta given the
    hyperparameters) are drawn exactly; other sites keep the conditional Gaussian.
    """
    from jax.scipy.special import ndtr

    from .families.base import basis_log_prob

    size = layout.size
    w = np.exp(design.log_weights)
    k = rng.choice(w.size, size=num_samples, p=w / w.sum())
    d = design.theta.shape[1]
    u = rng.uniform(-0.5, 0.5, (num_samples, d)) * design.step
    theta = design.theta[k] + u @ design.scale.T
    chol = np.linalg.cholesky(design.x_cov)
    eps = rng.standard_normal((num_samples, design.x_mode.shape[1]))
    x = design.x_mode[k] + np.einsum("nij,nj->ni", chol[k], eps)
    flat = np.zeros((num_samples, size))
    flat[:, design.theta_index] = theta
    flat[:, design.x_index] = x
    log_cell = d * math.log(design.step) + np.linalg.slogdet(design.scale)[1]
    log_det = np.sum(np.log(np.diagonal(chol, axis1=1, axis2=2)), axis=1)
    log_q = design.log_weights[k] - log_cell
    log_q = log_q - 0.5 * np.sum(eps**2, 1) - log_det[k] - 0.5 * x.shape[1] * math.log(2 * math.pi)
    position = {int(j): i for i, j in enumerate(design.x_index)}
    var = np.diagonal(design.x_cov, axis1=1, axis2=2)
    for site, family in _quantile_sites(layout, design.theta_index):
        cols = np.array([position[j] for j in range(site.offset, site.offset + site.size)])
        shape = (num_samples,) + site.basis_shape
        mean_k = design.x_mode[:, cols].reshape((-1,) + site.basis_shape)
        var_k = var[:, cols].reshape((-1,) + site.basis_shape)
        params = {n: v[k] for n, v in family.from_gaussian(jnp.asarray(mean_k), jnp.asarray(var_k)).items()}
        sd = np.sqrt(var_k[k])
        s = (x[:, cols].reshape(shape) - mean_k[k]) / sd
        y = np.asarray(family.basis_quantile(params, ndtr(jnp.asarray(s))), np.float64)
        flat[:, site.offset : site.offset + site.size] = y.reshape(num_samples, -1)
        term = np.log(sd) + np.asarray(basis_log_prob(family, params, jnp.asarray(y)), np.float64)
        term = term + 0.5 * s**2 + 0.5 * math.log(2 * math.pi)
        log_q = log_q + term.reshape(num_samples, -1).sum(1)
    return flat, log_q
