r"""Beta(a, b) matched in the logit basis.

With ``x = sigmoid(y)`` the density of ``y`` is proportional to
:math:`\sigma(y)^a (1 - \sigma(y))^b`; its mode and curvature give

.. math:: \mu = \log(a/b), \quad \sigma^2 = \frac{a + b}{a b}
          \qquad\Longleftrightarrow\qquad
          a = \frac{1 + e^{\mu}}{\sigma^2}, \quad b = \frac{1 + e^{-\mu}}{\sigma^2}.

Exact in both directions. Reference: Hobbhahn and Hennig (2021), Appendix B.3.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import betaln
import numpyro.distributions as dist

from ..runtime.random import host_log_gamma
from .quantiles import beta_logit_quantile
from .registry import MatchedFamily, register_family, register_prior_family

__all__ = ["beta_logit"]


def _from_gaussian(mean, var):
    return {
        "concentration1": (1.0 + jnp.exp(mean)) / var,
        "concentration0": (1.0 + jnp.exp(-mean)) / var,
    }


def _to_gaussian(params):
    a, b = params["concentration1"], params["concentration0"]
    return jnp.log(a / b), (a + b) / (a * b)


def _distribution(params):
    return dist.Beta(params["concentration1"], params["concentration0"])


def _quantile(params, u):
    return beta_logit_quantile(params["concentration1"], params["concentration0"], u)


def _log_prob(params, y):
    # log sigmoid terms instead of log(x), log(1 - x): finite for any y in float32
    a, b = params["concentration1"], params["concentration0"]
    return a * jax.nn.log_sigmoid(y) + b * jax.nn.log_sigmoid(-y) - betaln(a, b)


def _host_sample(rng, params):
    # logit X = log G_a - log G_b for X = G_a / (G_a + G_b): finite where X rounds to 0 or 1
    return host_log_gamma(rng, params["concentration1"]) - host_log_gamma(rng, params["concentration0"])


beta_logit = register_family(
    MatchedFamily(
        name="beta",
        basis="logit",
        event_dim=0,
        from_gaussian=_from_gaussian,
        to_gaussian=_to_gaussian,
        distribution=_distribution,
        basis_quantile=_quantile,
        log_prob=_log_prob,
        host_sample=_host_sample,
    )
)

register_prior_family("Beta", "beta")
