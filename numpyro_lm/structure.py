r"""What a model's dependency structure says before anything is fitted.

:func:`prior_parents` reads, with NumPyro's own provenance tracking
(:func:`numpyro.infer.inspect.get_dependencies`), which latent sites each latent site's
prior depends on. :func:`hierarchical_hypers` names the hyperparameters that set another
latent site's prior (a hierarchical scale, a concentration, a GP kernel's lengthscale).

Where such a hyperparameter exists the joint mode is known to be the wrong summary: the
joint density carries the prior's normaliser of every child, e.g. :math:`\tau^{-J}` for
:math:`J` children :math:`\theta_j \sim N(\mu, \tau)`, which drags the joint mode of
:math:`\tau` towards zero (a funnel; the joint mode may not exist), while the marginal
:math:`p(\tau\mid y)` integrates it out (MacKay 1999, "Comparison of approximate methods
for handling hyperparameters"; Rue et al. 2009, INLA). The auto-pilot
(:mod:`numpyro_lm.autopilot`) then starts with nested Laplace over the hyperparameters.
"""

from __future__ import annotations

import warnings
from typing import Optional

import jax
from numpyro.infer.inspect import get_dependencies

from .programs import merge_inputs, split_inputs

__all__ = ["prior_parents", "hierarchical_hypers"]


def prior_parents(model, args=(), kwargs=None, latent=None) -> Optional[tuple]:
    """``((site, (parent, ...)), ...)``: for each latent site (``latent``: their names,
    default all), the other latent sites its prior depends on, as a hashable tuple; ``None``
    where the provenance cannot be traced (an operation NumPyro's tracker does not know).

    The model runs abstractly (``jax.eval_shape``: array arguments may be
    ``jax.ShapeDtypeStruct``); nothing is computed.
    """
    arrays, key = split_inputs((tuple(args), dict(kwargs or {})))
    found = {}

    def run(arrays):
        args, kwargs = merge_inputs(arrays, key)
        found.update(get_dependencies(model, args, kwargs)["prior_dependencies"])
        return 0

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jax.eval_shape(run, arrays)
    except Exception:  # noqa: BLE001 - structure unknown: the auto-pilot keeps its default order
        return None
    names = set(found) if latent is None else set(latent)
    return tuple((site, tuple(sorted(p for p in parents if p != site and p in names)))
                 for site, parents in found.items() if site in names)


def hierarchical_hypers(parents: Optional[tuple], hyper) -> list:
    """The sites of ``hyper`` on which the prior of another, non-hyperparameter latent site
    depends (module docstring); empty where ``parents`` is ``None``."""
    if not parents or not hyper:
        return []
    hyper = set(hyper)
    upstream = {p for site, ps in parents if site not in hyper for p in ps}
    return sorted(upstream & hyper)
