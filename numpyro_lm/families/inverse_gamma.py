r"""InverseGamma(alpha, rate) in the log and square-root bases.

Log basis ``x = e^y``: the density of ``y`` is proportional to
:math:`\exp(-\alpha y - \lambda e^{-y})`, so

.. math:: \mu = \log(\lambda/\alpha),\ \sigma^2 = 1/\alpha
          \quad\Longleftrightarrow\quad
          \alpha = 1/\sigma^2,\ \lambda = e^{\mu}/\sigma^2 .

Square-root basis ``x = y^2``: the density of ``y`` is proportional to
:math:`y^{-2\alpha - 1} e^{-\lambda / y^2}`, so

.. math:: \mu = \sqrt{\frac{2\lambda}{2\alpha + 1}},\ \sigma^2 = \frac{\lambda}{(2\alpha + 1)^2}
          \quad\Longleftrightarrow\quad
          \alpha = \frac{\mu^2}{4\sigma^2} - \frac12,\ \lambda = \frac{\mu^4}{4\sigma^2}.

The LM paper's Table 2 prints the forward map as :math:`\mu = \sqrt{\lambda/\alpha}`,
:math:`\sigma^2 = \lambda/(4\alpha^2)`: the large-alpha limit of the exact map above
(relative error ``O(1/alpha)``, tested), while its inverse agrees with ours.

Reference: Hobbhahn and Hennig (2021), Appendix B.3; thesis Table 3.2.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist

from .gamma import positive_family
from .quantiles import gamma_log_quantile
from .registry import register_prior_family

__all__ = ["inverse_gamma_log", "inverse_gamma_sqrt", "inverse_gamma_sqrt_seeds_forward"]


def _distribution(params):
    return dist.InverseGamma(params["concentration"], params["rate"])


def _log_quantile(params, u):
    # X = 1/G with G ~ Gamma(alpha, rate): F_X^-1(u) = 1 / F_G^-1(1 - u)
    return -gamma_log_quantile(params["concentration"], params["rate"], 1.0 - u)


def _log_from_gaussian(mean, var):
    return {"concentration": 1.0 / var, "rate": jnp.exp(mean) / var}


def _log_to_gaussian(params):
    alpha, rate = params["concentration"], params["rate"]
    return jnp.log(rate / alpha), 1.0 / alpha


def _sqrt_from_gaussian(mean, var):
    return {"concentration": jnp.square(mean) / (4.0 * var) - 0.5, "rate": mean**4 / (4.0 * var)}


def _sqrt_to_gaussian(params):
    alpha, rate = params["concentration"], params["rate"]
    return jnp.sqrt(2.0 * rate / (2.0 * alpha + 1.0)), rate / jnp.square(2.0 * alpha + 1.0)


def inverse_gamma_sqrt_seeds_forward(params):
    """The LM paper's forward sqrt map (its large-alpha limit), kept for comparison."""
    alpha, rate = params["concentration"], params["rate"]
    return jnp.sqrt(rate / alpha), rate / (4.0 * jnp.square(alpha))


inverse_gamma_log = positive_family(
    "inverse_gamma", "log", _log_from_gaussian, _log_to_gaussian, _distribution, _log_quantile
)
inverse_gamma_sqrt = positive_family(
    "inverse_gamma", "sqrt", _sqrt_from_gaussian, _sqrt_to_gaussian, _distribution, _log_quantile
)

register_prior_family("InverseGamma", "inverse_gamma")
