"""Matched families of Laplace Matching: one module per (family, basis).

Each module registers a :class:`~numpyro_lm.families.base.MatchedFamily`;
``get_family(name)`` finds it. Registering a new family needs no change elsewhere.
"""

from .base import MatchedFamily, family_names, get_family, register_family
from .beta import beta_logit
from .dirichlet import (
    dirichlet_from_zero_sum_gaussian,
    dirichlet_softmax,
    dirichlet_to_zero_sum_gaussian,
)
from .gamma import gamma_log, gamma_sqrt
from .normal import gaussian, normal

__all__ = [
    "MatchedFamily",
    "register_family",
    "get_family",
    "family_names",
    "normal",
    "gaussian",
    "gamma_log",
    "gamma_sqrt",
    "beta_logit",
    "dirichlet_softmax",
    "dirichlet_to_zero_sum_gaussian",
    "dirichlet_from_zero_sum_gaussian",
]
