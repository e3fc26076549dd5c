r"""The Gamma family and its special cases, in the log and square-root bases.

Gamma(alpha, rate), log basis ``x = e^y``: the density of ``y`` is proportional to
:math:`\exp(\alpha y - \lambda e^y)`, so

.. math:: \mu = \log(\alpha/\lambda),\ \sigma^2 = 1/\alpha
          \quad\Longleftrightarrow\quad
          \alpha = 1/\sigma^2,\ \lambda = e^{-\mu}/\sigma^2 .

Square-root basis ``x = y^2``: the density of ``y`` is proportional to
:math:`y^{2\alpha - 1} e^{-\lambda y^2}`, so

.. math:: \mu = \sqrt{(\alpha - \tfrac12)/\lambda},\ \sigma^2 = 1/(4\lambda)
          \quad\Longleftrightarrow\quad
          \lambda = 1/(4\sigma^2),\ \alpha = \mu^2/(4\sigma^2) + \tfrac12 .

The LM paper's Table 2 prints :math:`\alpha = \mu^2/(4\sigma^2) - 0.5` and
:math:`\lambda = 4/\sigma^2` for the sqrt inverse: typos (the round trip above is exact
and is tested against an autodiff Laplace approximation).

One-parameter special cases (their maps to the Gaussian are exact; back from a
Gaussian only the mean is used, so that direction is a projection):

- Exponential(rate) = Gamma(1, rate): log ``mu = -log rate, s^2 = 1`` and
  ``rate = e^-mu``; sqrt ``mu = (2 rate)^-1/2, s^2 = 1/(4 rate)`` and ``rate = 1/(2 mu^2)``.
- Chi2(k) = Gamma(k/2, 1/2): log ``mu = log k, s^2 = 2/k`` and ``k = e^mu``; sqrt
  ``mu = sqrt(k - 1), s^2 = 1/2`` and ``k = mu^2 + 1``. The paper prints ``mu = sqrt(k)``
  and ``k = mu^2`` (the large-k limit).

Reference: Hobbhahn and Hennig (2021), Appendix B.1-B.2 and B.5; thesis Table 3.2.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import gammaln

from ..runtime.random import host_log_gamma
from .quantiles import gamma_log_quantile
from .registry import MatchedFamily, register_family, register_prior_family

__all__ = [
    "gamma_log", "gamma_sqrt", "exponential_log", "exponential_sqrt", "chi2_log", "chi2_sqrt",
    "positive_family",
]


def positive_family(name, basis, from_gaussian, to_gaussian, distribution, log_quantile, gamma_params=None):
    """A family on the positive reals, matched in the ``log`` or ``sqrt`` basis.

    ``log_quantile(params, u)`` is ``log F^{-1}(u)``; the basis quantile follows from it.
    ``gamma_params(params) -> (alpha, rate)`` marks a Gamma special case, whose log-basis
    density is then evaluated in closed form (no ``exp`` that under- or overflows).
    """
    log_prob = host_sample = None
    if gamma_params is not None and basis == "log":
        def log_prob(params, y):
            alpha, rate = gamma_params(params)
            return alpha * jnp.log(rate) + alpha * y - rate * jnp.exp(y) - gammaln(alpha)

        def host_sample(rng, params):
            alpha, rate = (np.asarray(p, np.float64) for p in gamma_params(params))
            return host_log_gamma(rng, np.broadcast_to(alpha, np.broadcast_shapes(alpha.shape, rate.shape))) - np.log(rate)

    if basis == "log":
        basis_quantile = log_quantile
    else:
        def basis_quantile(params, u):
            return jnp.exp(0.5 * log_quantile(params, u))

    return register_family(
        MatchedFamily(
            name=name,
            basis=basis,
            event_dim=0,
            from_gaussian=from_gaussian,
            to_gaussian=to_gaussian,
            distribution=distribution,
            basis_quantile=basis_quantile,
            log_prob=log_prob,
            host_sample=host_sample,
        )
    )


# ------------------------------------------------------------------------------ Gamma


def _gamma_log_from_gaussian(mean, var):
    concentration = 1.0 / var
    return {"concentration": concentration, "rate": concentration * jnp.exp(-mean)}


def _gamma_log_to_gaussian(params):
    alpha, rate = params["concentration"], params["rate"]
    return jnp.log(alpha / rate), 1.0 / alpha


def _gamma_sqrt_from_gaussian(mean, var):
    rate = 1.0 / (4.0 * var)
    return {"concentration": jnp.square(mean) * rate + 0.5, "rate": rate}


def _gamma_sqrt_to_gaussian(params):
    alpha, rate = params["concentration"], params["rate"]
    return jnp.sqrt((alpha - 0.5) / rate), 1.0 / (4.0 * rate)


def _gamma(params):
    return dist.Gamma(params["concentration"], params["rate"])


def _gamma_log_quantile(params, u):
    return gamma_log_quantile(params["concentration"], params["rate"], u)


def _gamma_params(params):
    return params["concentration"], params["rate"]


gamma_log = positive_family(
    "gamma", "log", _gamma_log_from_gaussian, _gamma_log_to_gaussian, _gamma, _gamma_log_quantile,
    _gamma_params,
)
gamma_sqrt = positive_family(
    "gamma", "sqrt", _gamma_sqrt_from_gaussian, _gamma_sqrt_to_gaussian, _gamma, _gamma_log_quantile
)

# ------------------------------------------------------------------------ Exponential


def _exponential(params):
    return dist.Exponential(params["rate"])


def _exponential_log_quantile(params, u):
    return gamma_log_quantile(1.0, params["rate"], u)


exponential_log = positive_family(
    "exponential",
    "log",
    lambda mean, var: {"rate": jnp.exp(-mean)},
    lambda p: (-jnp.log(p["rate"]), jnp.ones_like(p["rate"])),
    _exponential,
    _exponential_log_quantile,
    lambda p: (jnp.ones_like(p["rate"]), p["rate"]),
)
exponential_sqrt = positive_family(
    "exponential",
    "sqrt",
    lambda mean, var: {"rate": 0.5 / jnp.square(mean)},
    lambda p: (jnp.sqrt(0.5 / p["rate"]), 0.25 / p["rate"]),
    _exponential,
    _exponential_log_quantile,
)

# ------------------------------------------------------------------------ Chi-squared


def _chi2(params):
    return dist.Chi2(params["df"])


def _chi2_log_quantile(params, u):
    return gamma_log_quantile(0.5 * params["df"], 0.5, u)


chi2_log = positive_family(
    "chi2",
    "log",
    lambda mean, var: {"df": jnp.exp(mean)},
    lambda p: (jnp.log(p["df"]), 2.0 / p["df"]),
    _chi2,
    _chi2_log_quantile,
    lambda p: (0.5 * p["df"], jnp.full_like(p["df"], 0.5)),
)
chi2_sqrt = positive_family(
    "chi2",
    "sqrt",
    lambda mean, var: {"df": jnp.square(mean) + 1.0},
    lambda p: (jnp.sqrt(p["df"] - 1.0), jnp.full_like(p["df"], 0.5)),
    _chi2,
    _chi2_log_quantile,
)

# A positive site's posterior under these priors is matched by a Gamma (two parameters:
# the one-parameter Exponential or Chi2 could not carry both location and spread).
for _prior in ("Gamma", "Exponential", "Chi2", "HalfNormal", "HalfCauchy"):
    register_prior_family(_prior, "gamma")
