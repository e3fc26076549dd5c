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
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.special import ndtr

from .families import get_family
from .laplace import Gaussian
from .marginals import site_marginal
from .random import key_bits
from .trace import Layout

__all__ = ["copula_draws"]


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
