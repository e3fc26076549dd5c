"""numpyro_lm: Laplace Matching for NumPyro models.

``LaplaceMatching(model)`` replaces ``MCMC(NUTS(model))`` where a fast, closed-form
posterior is wanted: each latent site gets its matched exponential family (Gamma, Beta,
Dirichlet, Normal, ...) on its own domain. ``run_many`` fits many data sets in one
compiled program, ``sbc`` checks calibration on simulated data, ``LaplaceNUTS`` is a
NumPyro MCMC kernel (NUTS over the hyperparameters, Laplace over the latent field), and the pure core
(``model_info``, ``laplace``) vmaps and jits like any JAX function.

Everything else lives in submodules: ``numpyro_lm.bridge`` (the Laplace Bridge for
classifier logits), ``numpyro_lm.compare`` (LM, NUTS and ESS side by side),
``numpyro_lm.plotting``, ``numpyro_lm.diagnostics`` (PSIS), ``numpyro_lm.bases`` and
``numpyro_lm.families`` (the registries).
"""

# before anything starts JAX's backends: XLA_FLAGS are read once, when they start
from .xla_runtime import avoid_lapack_deadlock

avoid_lapack_deadlock()

from .adapters import EllipticalSlice, warm_nuts  # noqa: E402
from .bases import register_basis
from .curvature import Gaussian
from .errors import NotPositiveDefiniteError
from .data_checks import ObservedDataError
from .families import get_family, register_family, register_prior_family
from .laplace import LaplaceState, laplace
from .laplace_nuts import LaplaceNUTS
from .matching import LaplaceMatching
from .model import ModelInfo, model_info
from .sbc import SBCResult, sbc
from .verdict import NotTrustedWarning

__version__ = "0.1.0"

__all__ = [
    "LaplaceMatching",
    "LaplaceNUTS",
    "NotPositiveDefiniteError",
    "ObservedDataError",
    "NotTrustedWarning",
    "sbc",
    "SBCResult",
    "model_info",
    "ModelInfo",
    "laplace",
    "LaplaceState",
    "Gaussian",
    "warm_nuts",
    "EllipticalSlice",
    "register_basis",
    "register_family",
    "register_prior_family",
    "get_family",
    "__version__",
]

_MOVED = {
    "plot_marginals": "numpyro_lm.plotting", "laplace_bridge": "numpyro_lm.bridge",
    "condition_zero_sum": "numpyro_lm.bridge", "lb_norm": "numpyro_lm.bridge",
    "dirichlet_beta_marginals": "numpyro_lm.bridge", "uncertainty_aware_top_k": "numpyro_lm.bridge",
    "psis": "numpyro_lm.diagnostics", "PSIS": "numpyro_lm.diagnostics", "khat_verdict": "numpyro_lm.diagnostics",
    "to_inference_data": "numpyro_lm.inference_data", "Comparison": "numpyro_lm.compare",
    "basis_names": "numpyro_lm.bases", "get_basis": "numpyro_lm.bases", "Basis": "numpyro_lm.bases",
    "family_names": "numpyro_lm.families", "family_bases": "numpyro_lm.families",
    "MatchedFamily": "numpyro_lm.families", "MatchedPosterior": "numpyro_lm.posterior",
}


def __getattr__(name):
    if name in _MOVED:
        raise AttributeError(f"numpyro_lm.{name} moved to {_MOVED[name]}: from {_MOVED[name]} import {name}")
    raise AttributeError(f"module 'numpyro_lm' has no attribute {name!r}")
