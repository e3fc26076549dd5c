"""numpyro_lm: Laplace Matching for NumPyro models.

``LaplaceMatching(model)`` replaces ``MCMC(NUTS(model))`` where a fast, closed-form
posterior is wanted: each latent site gets its matched exponential family (Gamma, Beta,
Dirichlet, Normal, ...) on its own domain. ``run_many`` fits many data sets in one
compiled program, ``sbc`` checks calibration on simulated data, ``LaplaceNUTS`` is a
NumPyro MCMC kernel (NUTS over the hyperparameters, Laplace over the latent field), and the pure core
(``model_info``, ``laplace``) vmaps and jits like any JAX function.

The package is the pipeline, one folder a stage, each importing only the stages before it:
``runtime`` (compiling, batching, keys) -> ``curvature`` (the precision as data) -> ``mode``
(Newton and its Hessian strategies, the Laplace state) -> ``families`` (bases and matched
families) -> ``core`` (the model's sites and log density) -> ``marginal`` (the conditional Laplace
marginal) -> ``posterior`` (refinement, matched marginals, draws) -> ``checks`` (PSIS, the
verdict, errors) -> ``samplers`` (LaplaceNUTS, warm NUTS, elliptical slice) ->
``approximations`` (joint, nested, the auto-pilot, the fallback) -> the top level:
``numpyro_lm.matching`` (``LaplaceMatching``), ``numpyro_lm.inference_data`` (ArviZ),
``numpyro_lm.plotting``, ``numpyro_lm.compare``, ``numpyro_lm.sbc``. The seed applications are
in ``numpyro_lm.contrib`` (``bridge``, ``gp``, ``nn``, ``networks``). docs/architecture.md draws it.
"""

# before anything starts JAX's backends: XLA_FLAGS are read once, when they start
from .runtime.xla_flags import avoid_lapack_deadlock

avoid_lapack_deadlock()

from .checks.data import ObservedDataError  # noqa: E402
from .checks.errors import NotPositiveDefiniteError
from .checks.verdict import NotTrustedWarning
from .core.model import ModelInfo, model_info
from .curvature import Gaussian
from .families import get_family, register_family, register_prior_family
from .families.bases import register_basis
from .matching import LaplaceMatching
from .mode.laplace_state import LaplaceState, laplace
from .moved import install as _install_old_paths
from .samplers import EllipticalSlice, warm_nuts
from .samplers.laplace_nuts import LaplaceNUTS
from .runtime.compilation_cache import use_compilation_cache
from .sbc import SBCResult, sbc

_install_old_paths()  # the flat layout's import paths keep working (numpyro_lm.moved)

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
    "use_compilation_cache",
    "__version__",
]

_MOVED = {
    "plot_marginals": "numpyro_lm.plotting", "laplace_bridge": "numpyro_lm.contrib.bridge",
    "condition_zero_sum": "numpyro_lm.contrib.bridge", "lb_norm": "numpyro_lm.contrib.bridge",
    "dirichlet_beta_marginals": "numpyro_lm.contrib.bridge", "uncertainty_aware_top_k": "numpyro_lm.contrib.bridge",
    "psis": "numpyro_lm.checks.psis", "PSIS": "numpyro_lm.checks.psis", "khat_verdict": "numpyro_lm.checks.psis",
    "to_inference_data": "numpyro_lm.inference_data", "Comparison": "numpyro_lm.compare",
    "basis_names": "numpyro_lm.families.bases", "get_basis": "numpyro_lm.families.bases", "Basis": "numpyro_lm.families.bases",
    "family_names": "numpyro_lm.families", "family_bases": "numpyro_lm.families",
    "MatchedFamily": "numpyro_lm.families", "MatchedPosterior": "numpyro_lm.posterior.matched",
}


def __getattr__(name):
    if name in _MOVED:
        raise AttributeError(f"numpyro_lm.{name} moved to {_MOVED[name]}: from {_MOVED[name]} import {name}")
    raise AttributeError(f"module 'numpyro_lm' has no attribute {name!r}")
