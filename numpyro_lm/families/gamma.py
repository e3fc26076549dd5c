r"""Gamma(alpha, rate) matched in the log and in the square-root basis.

Log basis, ``x = exp(y)``: the density of ``y`` is proportional to
:math:`\exp(\alpha y - \lambda e^y)`, whose mode and curvature give

.. math:: \mu = \log(\alpha/\lambda), \quad \sigma^2 = 1/\alpha
          \qquad\Longleftrightarrow\qquad
          \alpha = 1/\sigma^2, \quad \lambda = e^{-\mu}/\sigma^2 .

Square-root basis, ``x = y^2``: the density of ``y`` is proportional to
:math:`y^{2\alpha - 1} e^{-\lambda y^2}`, so

.. math:: \mu = \sqrt{(\alpha - \tfrac12)/\lambda}, \quad \sigma^2 = 1/(4\lambda)
          \qquad\Longleftrightarrow\qquad
          \lambda = 1/(4\sigma^2), \quad \alpha = \mu^2/(4\sigma^2) + \tfrac12 .

The thesis (Hobbhahn 2021, Table 3.2) prints :math:`\lambda = 1/\sigma^2` and
:math:`-\tfrac12` for the inverse sqrt map: typos, the round trip above is exact.
References: Hobbhahn and Hennig, "Laplace Matching for fast Approximate Inference in
Latent Gaussian Models" (2021), Appendix B.2.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist

from ..quantiles import gamma_log_quantile
from .base import MatchedFamily, register_family

__all__ = ["gamma_log", "gamma_sqrt"]


def _distribution(params):
    return dist.Gamma(params["concentration"], params["rate"])


def _log_from_gaussian(mean, var):
    concentration = 1.0 / var
    return {"concentration": concentration, "rate": concentration * jnp.exp(-mean)}


def _log_to_gaussian(params):
    alpha, rate = params["concentration"], params["rate"]
    return jnp.log(alpha / rate), 1.0 / alpha


def _log_quantile(params, u):
    return gamma_log_quantile(params["concentration"], params["rate"], u)


gamma_log = register_family(
    MatchedFamily(
        name="gamma",
        basis="log",
        event_dim=0,
        from_gaussian=_log_from_gaussian,
        to_gaussian=_log_to_gaussian,
        distribution=_distribution,
        basis_quantile=_log_quantile,
    )
)


def _sqrt_from_gaussian(mean, var):
    rate = 1.0 / (4.0 * var)
    return {"concentration": jnp.square(mean) * rate + 0.5, "rate": rate}


def _sqrt_to_gaussian(params):
    alpha, rate = params["concentration"], params["rate"]
    return jnp.sqrt((alpha - 0.5) / rate), 1.0 / (4.0 * rate)


def _sqrt_quantile(params, u):
    return jnp.exp(0.5 * gamma_log_quantile(params["concentration"], params["rate"], u))


gamma_sqrt = register_family(
    MatchedFamily(
        name="gamma_sqrt",
        basis="sqrt",
        event_dim=0,
        from_gaussian=_sqrt_from_gaussian,
        to_gaussian=_sqrt_to_gaussian,
        distribution=_distribution,
        basis_quantile=_sqrt_quantile,
    )
)
