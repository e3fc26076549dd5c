"""Matched families of Laplace Matching: one module per (family, basis).

Each module registers a :class:`~numpyro_lm.families.registry.MatchedFamily`;
``get_family(name, basis)`` finds it. Registering a new family needs no change elsewhere.
"""

from .beta import beta_logit
from .dirichlet import dirichlet_from_zero_sum_gaussian, dirichlet_softmax, dirichlet_to_zero_sum_gaussian
from .gamma import chi2_log, chi2_sqrt, exponential_log, exponential_sqrt, gamma_log, gamma_sqrt
from .inverse_gamma import inverse_gamma_log, inverse_gamma_sqrt
from .normal import gaussian, normal
from .registry import (MatchedFamily, family_bases, family_for_prior, family_names, get_family, register_family,
                       register_prior_family)
from .wishart import inverse_wishart_logm, inverse_wishart_sqrtm, wishart_logm, wishart_sqrtm

__all__ = [
    "MatchedFamily",
    "register_family",
    "get_family",
    "family_names",
    "family_bases",
    "register_prior_family",
    "family_for_prior",
    "normal",
    "gaussian",
    "gamma_log",
    "gamma_sqrt",
    "exponential_log",
    "exponential_sqrt",
    "chi2_log",
    "chi2_sqrt",
    "inverse_gamma_log",
    "inverse_gamma_sqrt",
    "beta_logit",
    "dirichlet_softmax",
    "wishart_logm",
    "wishart_sqrtm",
    "inverse_wishart_logm",
    "inverse_wishart_sqrtm",
    "dirichlet_to_zero_sum_gaussian",
    "dirichlet_from_zero_sum_gaussian",
]
