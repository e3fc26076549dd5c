"""Per-site Gaussian marginals of the joint Laplace Gaussian, and their matched families.

A site is matched *elementwise* (one Gaussian coordinate per parameter entry: Gamma,
Beta, Normal over a scalar site) or *per event vector* (Dirichlet over the ``K - 1``
softmax coordinates, MultivariateNormal over a vector site). The elementwise marginal is
``(mean, var)`` with the site's basis shape; the vector marginal is ``(mean (..., d),
cov (..., d, d))`` with one block per batch entry.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..core.trace import Layout, SiteSpec, is_elementwise
from ..curvature import Gaussian
from ..families import MatchedFamily, get_family

__all__ = ["site_marginal", "matched_params", "finite_params"]


def site_marginal(site: SiteSpec, family: MatchedFamily, gaussian: Gaussian):
    """The site's marginal of the flat Gaussian, through its curvature's ``variance`` (elementwise)
    or ``block`` (one block per event vector)."""
    index = np.arange(site.offset, site.offset + site.size)
    site_mean = gaussian.mean[index].reshape(site.basis_shape)
    if is_elementwise(site, family):
        return site_mean, gaussian.curvature.variance()[index].reshape(site.basis_shape)
    return site_mean, gaussian.curvature.block(index.reshape(site.basis_shape))


def matched_params(layout: Layout, gaussian: Gaussian) -> dict:
    """``{site: params of its matched family}`` from the flat Gaussian."""
    out = {}
    for site in layout.sites:
        family = get_family(site.family, site.basis)
        out[site.name] = family.from_gaussian(*site_marginal(site, family, gaussian))
    return out


def finite_params(params: dict) -> dict:
    """``{site: whether every matched parameter of the site is finite}`` (device booleans)."""
    return {site: jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in p.values()])) for site, p in params.items()}
