r"""What a model's dependency structure says before anything is fitted.

:func:`prior_parents` reads, with NumPyro's own provenance tracking
(:func:`numpyro.infer.inspect.get_dependencies`), which latent sites each sample site's
distribution depends on (latent sites' priors and observed sites' likelihoods).
:func:`hyperparameters` picks from the candidate sites (global scales and shapes) those
that act as hyperparameters: they set another latent site's prior (a hierarchical scale,
a concentration, a GP kernel's lengthscale), or they enter a likelihood together with
other latent coordinates (a noise scale, a degrees-of-freedom, the scale of a non-centred
effect).

Over such sites the joint mode is the wrong summary. The joint density carries the
children's prior normaliser, e.g. :math:`\tau^{-J}` for :math:`J` children
:math:`\theta_j \sim N(\mu, \tau)`, which drags the joint mode of :math:`\tau` towards
zero (a funnel; the joint mode may not exist), and a noise scale's joint mode is offset
from its marginal mode by the curvature of the coordinates it scales; the marginal
:math:`p(\theta\mid y)` integrates them out (MacKay 1999, "Comparison of approximate
methods for handling hyperparameters"; Rue et al. 2009, INLA). The auto-pilot
(:mod:`numpyro_lm.approximations.autopilot`) therefore starts with nested Laplace over them.
"""

from __future__ import annotations

import warnings
from typing import Optional

import jax
from numpyro.infer.inspect import get_dependencies

from ..runtime.programs import merge_inputs, split_inputs

__all__ = ["prior_parents", "hyperparameters", "local_scales", "hyper_sites", "MAX_CCD_DIM"]

MAX_CCD_DIM = 10
"""Most hyperparameter coordinates a nested fit integrates over (its central composite design's)."""


def prior_parents(model, args=(), kwargs=None) -> Optional[tuple]:
    """``((site, (latent parent, ...)), ...)``: for each sample site (latent or observed;
    deterministic sites are looked through), the other latent sites its distribution
    depends on, as a hashable tuple; ``None`` where the provenance cannot be traced (a
    model that needs its arguments' values, an operation NumPyro's tracker does not know).

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
    except Exception:  # noqa: BLE001 - structure unknown: the callers fall back on the sites alone
        return None
    return tuple((site, tuple(sorted(p for p in parents if p != site))) for site, parents in found.items())


def hyperparameters(parents: Optional[tuple], latent, candidates) -> list:
    """The sites of ``candidates`` that act as hyperparameters (module docstring): a parent
    of a latent site outside ``candidates``, or a parent of an observed site (not in
    ``latent``) that also depends on a latent site outside ``candidates``. ``parents`` is
    :func:`prior_parents`'s; where it is ``None`` (structure unknown) every candidate is kept.
    """
    if parents is None:
        return list(candidates)
    pool, latent, chosen = set(candidates), set(latent), set()
    for site, ps in parents:
        if site in pool:
            continue
        if site in latent or any(p not in pool for p in ps):
            chosen |= pool & set(ps)
    return [c for c in candidates if c in chosen]


def local_scales(layout, parents: Optional[tuple]) -> list:
    """``[(scale, plate, child), ...]``: constrained latent sites inside a plate that set the
    prior of another latent site in the same plate (a horseshoe's ``lam_j`` for its
    ``beta_j``). Each entry is then a funnel of its own: the joint density has no mode
    (``lam_j -> 0`` with ``beta_j -> 0`` for every small coefficient) and nested Laplace over
    the global sites leaves the funnels in its inner fits, so no Laplace approximation serves
    such a model."""
    if parents is None:
        return []
    of = dict(parents)
    sites = {s.name: s for s in layout.sites}
    found = []
    for child, spec in sites.items():
        for scale in of.get(child, ()):
            parent = sites.get(scale)
            shared = set(spec.plates) & set(parent.plates) if parent is not None else set()
            if parent is not None and parent.basis != "identity" and shared:
                found.append((scale, sorted(shared)[0], child))
    return found


def hyper_sites(layout, hyper, parents=None, locations: bool = False) -> list:
    """The hyperparameter sites: the names given, or for ``"auto"`` the model's global scales
    and shapes. Candidates are the constrained sites (positive, interval, ... : not a
    real-valued location) of at most two coordinates each that lie outside every plate;
    of these, where the model's dependency structure ``parents`` is known
    (:attr:`~numpyro_lm.core.model.ModelInfo.parents`), those that set another latent site's
    prior or enter a likelihood with other latent coordinates
    (:func:`hyperparameters`); at most ten coordinates in all, with
    at least one latent coordinate left for the conditional fits. Noise scales of a
    likelihood, prior scales of other latent sites (hierarchical or non-centred, with or
    without plates), kernel hyperparameters and shape parameters (degrees of freedom,
    concentrations) are such sites; locations and regression coefficients are left to the
    conditional Laplace step, where they are Gaussian given the hyperparameters in linear
    models. A Poisson rate that is the only parameter of its likelihood is not.
    ``locations=True`` admits real-valued sites too (a log-scale written on the real line,
    as Neal's funnel's ``y`` sets ``x ~ Normal(0, exp(y / 2))``): the auto-pilot's last
    rung where the joint fit failed.
    """
    names = [s.name for s in layout.sites]
    if hyper != "auto":
        unknown = [h for h in hyper if h not in names]
        if unknown:
            raise ValueError(f"hyper names {unknown}, which are not latent sites; the latent sites are {names}")
        return list(hyper)
    candidates = [s.name for s in layout.sites if not s.plates and s.size <= 2 and (locations or s.basis != "identity")]
    chosen = hyperparameters(parents, names, candidates)
    size = sum(layout.site(n).size for n in chosen)
    if not chosen or size > MAX_CCD_DIM or size == layout.size:
        raise ValueError(
            'hyper="auto" looks for global constrained sites of at most two coordinates each (scales, '
            "shapes) that set another latent site's prior or enter a likelihood with other latent sites, at "
            f"most {MAX_CCD_DIM} coordinates in all and not every latent site; it found {chosen} "
            f"({size} of {layout.size} coordinates) among the candidates {candidates}. Name them: hyper=[...]."
        )
    return chosen
