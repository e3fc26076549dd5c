"""Normal / MultivariateNormal in the identity basis, and the transformed Gaussian.

For real sites the Laplace Gaussian *is* the matched family: ``mean = mu``,
``cov = Sigma``. For sites whose basis has no matched family (``gaussian``), the Laplace
Gaussian over the basis coordinates is pushed through the basis transform, which is what
numpyro's ``AutoLaplaceApproximation`` returns.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist

from .registry import MatchedFamily, register_family, register_prior_family

__all__ = ["normal", "gaussian"]


def _from_gaussian(mean, cov):
    return {"loc": mean, "cov": cov}


def _to_gaussian(params):
    return params["loc"], params["cov"]


def _distribution(params):
    loc, cov = params["loc"], params["cov"]
    if jnp.ndim(cov) == jnp.ndim(loc):  # elementwise: cov holds variances
        return dist.Normal(loc, jnp.sqrt(cov))
    # exactly symmetric: a covariance block computed as A B' (curvature.block) is symmetric only
    # to rounding, which numpyro's positive_definite check (isclose, atol 1e-8) can refuse
    return dist.MultivariateNormal(loc, covariance_matrix=0.5 * (cov + jnp.swapaxes(cov, -1, -2)))


normal = register_family(
    MatchedFamily(
        name="normal",
        basis="identity",
        event_dim=None,
        from_gaussian=_from_gaussian,
        to_gaussian=_to_gaussian,
        distribution=_distribution,
        copula="gaussian",
    )
)

gaussian = register_family(
    MatchedFamily(
        name="gaussian",
        basis=None,  # any basis: the Gaussian lives on the basis coordinates
        event_dim=None,
        from_gaussian=_from_gaussian,
        to_gaussian=_to_gaussian,
        distribution=_distribution,
        copula="gaussian",
        in_basis=True,
    )
)

# A log-normal prior is a Gaussian in the log basis: the transformed Gaussian matches it.
register_prior_family("LogNormal", "gaussian")
