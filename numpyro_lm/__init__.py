"""numpyro_lm: Laplace Matching for NumPyro models.

``LaplaceMatching(model)`` replaces ``MCMC(NUTS(model))`` where a fast, closed-form
posterior is wanted: each latent site gets its matched exponential family (Gamma, Beta,
Dirichlet, Normal, ...) on its own domain.
"""

from .adapters import EllipticalSlice, warm_nuts
from .bridge import (
    condition_zero_sum,
    dirichlet_beta_marginals,
    laplace_bridge,
    lb_norm,
    uncertainty_aware_top_k,
)
from .bases import Basis, basis_names, get_basis, register_basis
from .families import (
    MatchedFamily,
    family_bases,
    family_names,
    get_family,
    register_family,
    register_prior_family,
)
from .compare import Comparison, compare
from .diagnostics import PSIS, khat_verdict, psis
from .inference_data import to_inference_data
from .laplace import Gaussian
from .matching import LaplaceMatching, MatchedPosterior, NotPositiveDefiniteError
from .plotting import plot_marginals

__version__ = "0.1.0"

__all__ = [
    "LaplaceMatching",
    "MatchedPosterior",
    "NotPositiveDefiniteError",
    "Gaussian",
    "Basis",
    "register_basis",
    "basis_names",
    "get_basis",
    "MatchedFamily",
    "register_family",
    "family_names",
    "family_bases",
    "register_prior_family",
    "get_family",
    "laplace_bridge",
    "condition_zero_sum",
    "lb_norm",
    "dirichlet_beta_marginals",
    "uncertainty_aware_top_k",
    "to_inference_data",
    "plot_marginals",
    "psis",
    "PSIS",
    "khat_verdict",
    "warm_nuts",
    "EllipticalSlice",
    "compare",
    "Comparison",
    "__version__",
]
