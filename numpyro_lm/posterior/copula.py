r"""Joint draws whose marginals are the matched families and whose dependence is Laplace's.

A Gaussian copula in the LM basis: draw ``z ~ N(mu, Sigma)`` (the joint Laplace
Gaussian), and per coordinate ``i`` of a site matched elementwise map
:math:`y_i = F_i^{-1}(\Phi((z_i - \mu_i)/\sigma_i))`, with ``F_i`` the matched family's
CDF expressed in the basis coordinate (log-Gamma, logit-Beta). Every coordinate then has
exactly its matched marginal, and the rank correlations of the Laplace Gaussian are kept.
Families that are Gaussian in the basis (Normal, MultivariateNormal, the transformed
Gaussian) use ``z`` itself. Sites matched per vector without a univariate quantile (the
Dirichlet) are drawn exactly from their family, independently of the other sites: their
dependence on the rest of the model is *not* kept (documented limitation). The joint draw
is ``z = mu + S eps`` through the curvature's ``inv_sqrt``, ``eps`` from ``jax.random``
(:func:`numpyro_lm.runtime.random.normal_rows`): reproducible from the key, under ``jax.vmap`` too.

The draws stay in basis coordinates; :meth:`numpyro_lm.core.model.ModelInfo.constrain` maps them back
through the model, so supports that depend on other sites use the drawn values.

The density of a draw (:func:`copula_log_density`), needed for importance weights, is the
change of variables from the Gaussian draw: with ``J`` the coordinates drawn jointly
(``"gaussian"`` and ``"quantile"`` sites) and ``s_i = (z_i - mu_i)/sigma_i``,

.. math:: \log q(y) = \log N(z_J; \mu_J, \Sigma_{JJ})
          + \sum_{i\ \text{quantile}} [\log\sigma_i + \log f_i(y_i) - \log\varphi(s_i)]
          + \sum_{\text{independent sites}} \log f_{\text{site}}(y_{\text{site}}),

``f`` being each matched family's density in basis coordinates
(:func:`numpyro_lm.families.registry.basis_log_prob`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtr
from jax.scipy.stats import norm

from ..core.trace import Layout
from ..curvature import Gaussian
from ..curvature.linalg import cholesky, solve_triangular
from ..families import get_family
from ..families.registry import basis_log_prob
from ..runtime.random import normal_rows
from .marginals import site_marginal

__all__ = ["copula_draws", "copula_log_density"]


def _keys(rng_key):
    """``(key of the joint Gaussian draw, key of the independent sites' draws)``."""
    return jax.random.fold_in(rng_key, 0), jax.random.fold_in(rng_key, 1)


def _noise(rng_key, gaussian: Gaussian, num_samples: int, dtype=None):
    """The standard normal draws behind the joint Gaussian draw ``z = mean + S eps``, made in
    ``dtype`` (default the Gaussian's: the draws' precision) and given the Gaussian's dtype."""
    eps = normal_rows(_keys(rng_key)[0], num_samples, gaussian.mean.shape, dtype or gaussian.mean.dtype)
    return eps.astype(gaussian.mean.dtype)


def copula_draws(rng_key, gaussian: Gaussian, layout: Layout, params: dict, num_samples: int):
    """``(num_samples, D)`` draws in basis coordinates (see the module docstring).

    Reproducible from ``rng_key``; more draws extend fewer (draw ``i`` does not depend on
    ``num_samples``).
    """
    z = gaussian.mean + gaussian.curvature.inv_sqrt(_noise(rng_key, gaussian, num_samples))
    site_keys = _keys(rng_key)[1]
    columns = []
    for i, site in enumerate(layout.sites):
        family = get_family(site.family, site.basis)
        z_site = z[:, site.offset : site.offset + site.size].reshape((num_samples,) + site.basis_shape)
        if family.copula == "gaussian":
            y = z_site
        elif family.copula == "quantile":
            mean, var = site_marginal(site, family, gaussian)
            u = ndtr((z_site - mean) / jnp.sqrt(var))
            y = family.basis_quantile(params[site.name], u)
        else:
            y = family.sample_basis(jax.random.fold_in(site_keys, i), params[site.name], num_samples)
        columns.append(y.reshape((num_samples, site.size)))
    return jnp.concatenate(columns, axis=1)


def _gaussian_log_density(eps, z, gaussian: Gaussian, index: np.ndarray):
    """``log N(z[:, index]; mean, cov)`` of the Gaussian's marginal over ``index``."""
    d = index.size
    if d == gaussian.mean.shape[-1]:  # the whole Gaussian: z - mean = S eps
        quad, log_det = jnp.sum(jnp.square(eps), axis=-1), -gaussian.curvature.logdet()
    else:
        chol = cholesky(gaussian.curvature.block(index))
        white = solve_triangular(chol, (z[:, index] - gaussian.mean[index]).T, lower=True)
        quad, log_det = jnp.sum(jnp.square(white), axis=0), 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
    return -0.5 * (quad + log_det + d * jnp.log(2.0 * jnp.pi))


def copula_log_density(y, rng_key, gaussian: Gaussian, layout: Layout, params: dict, draw_dtype=None):
    """``log q`` of draws ``y (num_samples, D)`` made by :func:`copula_draws` with ``rng_key``.

    The joint Gaussian draw the copula used is regenerated from the key (not stored) in
    ``draw_dtype``, the precision the draws were made in (default the Gaussian's): a float64
    ``log q`` of float32 draws regenerates their float32 normals. See the module docstring
    for the formula.
    """
    num_samples = y.shape[0]
    eps = _noise(rng_key, gaussian, num_samples, draw_dtype)
    z = gaussian.mean + gaussian.curvature.inv_sqrt(eps)
    joint, log_q = [], jnp.zeros(num_samples, y.dtype)
    for site in layout.sites:
        family = get_family(site.family, site.basis)
        index = np.arange(site.offset, site.offset + site.size)
        y_site = y[:, index].reshape((num_samples,) + site.basis_shape)
        if family.copula == "independent":
            log_f = basis_log_prob(family, params[site.name], y_site)
            log_q = log_q + jnp.sum(log_f.reshape((num_samples, -1)), axis=1)
            continue
        joint.append(index)
        if family.copula == "quantile":
            mean, var = site_marginal(site, family, gaussian)
            s = (z[:, index].reshape(y_site.shape) - mean) / jnp.sqrt(var)
            term = 0.5 * jnp.log(var) + basis_log_prob(family, params[site.name], y_site) - norm.logpdf(s)
            log_q = log_q + jnp.sum(term.reshape((num_samples, -1)), axis=1)
    if joint:
        log_q = log_q + _gaussian_log_density(eps, z, gaussian, np.concatenate(joint))
    return log_q
