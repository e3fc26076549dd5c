r"""Joint draws whose marginals are the matched families and whose dependence is Laplace's.

A Gaussian copula in the LM basis: draw ``z ~ N(mu, Sigma)`` (the joint Laplace
Gaussian), and per coordinate ``i`` of a site matched elementwise map
:math:`y_i = F_i^{-1}(\Phi((z_i - \mu_i)/\sigma_i))`, with ``F_i`` the matched family's
CDF expressed in the basis coordinate (log-Gamma, logit-Beta). Every coordinate then has
exactly its matched marginal, and the rank correlations of the Laplace Gaussian are kept.
Families that are Gaussian in the basis (Normal, MultivariateNormal, the transformed
Gaussian) use ``z`` itself. Sites matched per vector without a univariate quantile
(the Dirichlet) are drawn exactly from their family, independently of the other sites:
their dependence on the rest of the model is *not* kept (documented limitation).

The draws stay in basis coordinates; :func:`numpyro_lm.trace.constrain` maps them back
through the model, so supports that depend on other sites use the drawn values.

The density of a draw (:func:`copula_log_density`), needed for importance weights, is the
change of variables from the Gaussian draw: with ``J`` the coordinates drawn jointly
(``"gaussian"`` and ``"quantile"`` sites) and ``s_i = (z_i - mu_i)/sigma_i``,

.. math:: \log q(y) = \log N(z_J; \mu_J, \Sigma_{JJ})
          + \sum_{i\ \text{quantile}} [\log\sigma_i + \log f_i(y_i) - \log\varphi(s_i)]
          + \sum_{\text{independent sites}} \log f_{\text{site}}(y_{\text{site}}),

``f`` being each matched family's density in basis coordinates
(:func:`numpyro_lm.families.base.basis_log_prob`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtr
from jax.scipy.stats import norm

from .families import get_family
from .families.base import basis_log_prob
from .laplace import Gaussian
from .marginals import site_marginal
from .random import key_bits
from .trace import Layout

__all__ = ["copula_draws", "copula_log_density"]


def copula_draws(rng_key, gaussian: Gaussian, layout: Layout, params: dict, num_samples: int):
    """``(num_samples, D)`` draws in basis coordinates (see the module docstring)."""
    z = gaussian.sample(rng_key, num_samples, stream=num_samples)
    columns = []
    for i, site in enumerate(layout.sites):
        family = get_family(site.family, site.basis)
        z_site = z[:, site.offset : site.offset + site.size].reshape((num_samples,) + site.basis_shape)
        if family.copula == "gaussian":
            y = z_site
        elif family.copula == "quantile":
            mean, var = site_marginal(site, family, gaussian.mean, gaussian.cov)
            u = ndtr((z_site - mean) / jnp.sqrt(var))
            y = family.basis_quantile(params[site.name], u)
        else:
            site_key = key_bits(rng_key)[-2:] ^ jnp.asarray([i + 1, num_samples], jnp.uint32)
            y = family.sample_basis(site_key, params[site.name], (num_samples,))
        columns.append(y.reshape((num_samples, site.size)))
    return jnp.concatenate(columns, axis=1)


def _gaussian_log_density(z, gaussian: Gaussian, index: np.ndarray):
    """``log N(z[:, index]; mean, cov)`` of the Gaussian's marginal over ``index``."""
    d = z[:, index] - gaussian.mean[index]
    if index.size == gaussian.mean.shape[-1]:  # the whole Gaussian: reuse its eigenvectors
        quad = jnp.sum(gaussian.eigenvalues * jnp.square(d @ gaussian.eigenvectors), axis=-1)
        log_det = -jnp.sum(jnp.log(gaussian.eigenvalues))
    else:
        chol = jnp.linalg.cholesky(gaussian.cov[np.ix_(index, index)])
        white = jax.scipy.linalg.solve_triangular(chol, d.T, lower=True)
        quad = jnp.sum(jnp.square(white), axis=0)
        log_det = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
    return -0.5 * (quad + log_det + index.size * jnp.log(2.0 * jnp.pi))


def copula_log_density(y, z, gaussian: Gaussian, layout: Layout, params: dict):
    """``log q`` of draws ``y (num_samples, D)`` made by :func:`copula_draws` from ``z``.

    ``z`` is the joint Gaussian draw the copula used (``gaussian.sample`` with the same
    key and ``stream=num_samples``); see the module docstring for the formula.
    """
    num_samples = y.shape[0]
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
            mean, var = site_marginal(site, family, gaussian.mean, gaussian.cov)
            s = (z[:, index].reshape(y_site.shape) - mean) / jnp.sqrt(var)
            term = 0.5 * jnp.log(var) + basis_log_prob(family, params[site.name], y_site) - norm.logpdf(s)
            log_q = log_q + jnp.sum(term.reshape((num_samples, -1)), axis=1)
    if joint:
        log_q = log_q + _gaussian_log_density(z, gaussian, np.concatenate(joint))
    return log_q
