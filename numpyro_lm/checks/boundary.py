r"""Hyperparameters whose joint mode ran to the boundary of their space.

The joint mode of a latent field and the hyperparameters of its prior is often degenerate: a
GP's lengthscale collapses and its amplitude explodes until every data point has its own
function value, a hierarchical scale goes to zero with its children (the density
:math:`\tau^{-J}` of the funnel), and the search either stops there or does not converge.
Such a point holds almost none of the posterior's mass, so a Laplace approximation around
it is no answer (Rue et al. 2009, INLA; MacKay 1999).

:func:`boundary_hyperparameters` names the hyperparameter sites
(:func:`numpyro_lm.core.structure.hyper_sites`) whose coordinate at a point lies more than
:data:`PRIOR_SDS` of the prior's spread from the prior's median, both read in the site's LM
basis from :data:`NUM_PRIOR_DRAWS` draws of the prior (median and interquartile range /
1.349, so that a heavy-tailed prior is measured by its bulk). Under a prior of that spread
the chance of such a value is below :math:`10^{-4}`; the posterior does get there where the
data overrule the prior, but a joint mode there that fails to converge or to be trusted is
the degenerate corner, and the message says so with the fix: integrate the hyperparameters
out (``hyper=[...]``: nested Laplace) or sample them (``LaplaceNUTS``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions.distribution import validation_enabled
from numpyro.infer import init_to_sample

from ..core.structure import hyper_sites
from ..runtime.programs import program

__all__ = ["BoundarySite", "PRIOR_SDS", "NUM_PRIOR_DRAWS", "prior_spread", "boundary_hyperparameters",
           "boundary_message"]

PRIOR_SDS = 4.0
"""How far from the prior's median, in robust prior SDs of the LM basis, a hyperparameter
counts as at the boundary (a normal prior puts 6e-5 of its mass beyond)."""
NUM_PRIOR_DRAWS = 512
"""Prior draws for the median and spread (the interquartile range's standard error at 512
draws is about 5%)."""


class BoundarySite(NamedTuple):
    """A hyperparameter coordinate far out in its prior at the point checked."""

    site: str
    label: str  # the site, with the coordinate's index where it has several
    value: float  # constrained
    prior_median: float  # constrained
    prior_sds: float  # signed distance from the prior's median in robust prior SDs (LM basis)


def _prior_draws(info, keys, args, kwargs):
    """Draws of every latent coordinate from the prior (LM basis), one per key."""
    return jax.vmap(lambda k: info.init(k, args, kwargs, init_strategy=init_to_sample))(keys)


def prior_spread(info, sites: list, args=(), kwargs=None, rng_key=None) -> tuple:
    """``(median, sd)`` of each flat coordinate of ``sites`` (``{site: array}`` each) under the
    prior, in the LM basis: :data:`NUM_PRIOR_DRAWS` draws (``init_to_sample``), median and
    interquartile range / 1.349."""
    key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    keys = jax.random.split(key, NUM_PRIOR_DRAWS)
    # one compiled program per model and argument shapes (numpyro_lm.runtime.programs), not per result
    flat = program(_prior_draws, info)((keys,), tuple(args), dict(kwargs or {}))
    flat = np.asarray(jax.device_get(flat), np.float64)
    median, sd = {}, {}
    for name in sites:
        spec = info.layout.site(name)
        x = flat[:, spec.offset:spec.offset + spec.size]
        q1, q2, q3 = np.quantile(x, [0.25, 0.5, 0.75], axis=0)
        median[name], sd[name] = q2, (q3 - q1) / 1.349
    return median, sd


def boundary_hyperparameters(info, flat, args=(), kwargs=None, rng_key=None) -> list:
    """The :class:`BoundarySite` s of the model's hyperparameters at ``flat`` (LM basis), farthest
    first; ``[]`` where the model has none or its prior cannot be drawn from (a flat prior)."""
    try:
        names = hyper_sites(info.layout, "auto", info.parents)
    except ValueError:  # no hyperparameters
        return []
    try:
        median, sd = prior_spread(info, names, args, kwargs, rng_key)
    except Exception:  # noqa: BLE001 - an improper prior has no draws: nothing to measure against
        return []
    flat = np.asarray(jax.device_get(flat), np.float64)
    found = []
    for name in names:
        spec = info.layout.site(name)
        x = flat[spec.offset:spec.offset + spec.size]
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (x - median[name]) / sd[name]
        for i in np.flatnonzero(np.abs(z) > PRIOR_SDS):
            found.append((name, int(i), float(z[i]), float(median[name][i])))
    if not found:
        return []
    values = _constrained(info, flat, found, args, kwargs)
    out = [BoundarySite(name, name if info.layout.site(name).size == 1 else f"{name}[{i}]", *values[(name, i)], z)
           for name, i, z, _ in found]
    return sorted(out, key=lambda b: -abs(b.prior_sds))


def _constrained(info, flat, found, args, kwargs) -> dict:
    """Each found coordinate's value and the prior median's, constrained (one trace each)."""
    at_median = flat.copy()
    for name, i, _, med in found:
        at_median[info.layout.site(name).offset + i] = med
    dtype = jnp.result_type(float)
    # the point is where a search failed: the model's own sites may be NaN there (a kernel's
    # Cholesky at an exploded amplitude), which numpyro's validation would raise on
    with validation_enabled(False):
        here = info.constrain(jnp.asarray(flat, dtype), args, kwargs)
        there = info.constrain(jnp.asarray(at_median, dtype), args, kwargs)
    return {(name, i): (float(np.ravel(here[name])[i]), float(np.ravel(there[name])[i])) for name, i, *_ in found}


def boundary_message(found: list) -> str:
    """What the sites at the boundary are and what to do instead."""
    if not found:
        return ""
    parts = [f"{b.label} = {b.value:.3g} "
             f"({b.prior_sds:+.1f} prior SDs from the prior's median {b.prior_median:.3g})" for b in found]
    return (f"The joint mode search put hyperparameters at the edge of their prior: {', '.join(parts)}. The joint mode of a "
            "latent field and the hyperparameters of its prior runs to a degenerate boundary (a lengthscale "
            "collapsing, an amplitude exploding, a scale going to zero) where the posterior has almost no mass. "
            'Integrate them out: LaplaceMatching(model, hyper="auto") (nested Laplace over the model\'s '
            'hyperparameters; LaplaceMatching(model) tries it first), or sample them: MCMC(LaplaceNUTS(model)).')
