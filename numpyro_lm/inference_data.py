"""ArviZ ``InferenceData`` from a fitted :class:`~numpyro_lm.LaplaceMatching`.

The groups are those of ``arviz.from_numpyro`` on an MCMC run. The draws are independent;
they are split into pseudo-chains (four of ``S / 4`` draws where that divides,
:func:`numpyro_lm.runtime.random.num_pseudo_chains`), so that ``az.summary`` gives r_hat (about 1 by
construction) and ESS (about ``S``) instead of warning about a single chain:

- ``posterior``: latent and deterministic sites, dims named after the model's plates
  (and ``infer={"event_dims": [...]}`` of a site), as ArviZ infers them;
- ``sample_stats``: ``lp`` (the model's log density of each draw in LM-basis
  coordinates), ``log_q`` (the approximation's), ``log_weight`` (their difference);
- ``log_likelihood``: per observation, for ``az.loo``, ``az.waic`` and ``az.compare``;
- ``posterior_predictive``, ``prior`` and ``prior_predictive`` on request, drawn with
  :class:`numpyro.infer.Predictive` from the model with its observed sites set free;
- ``observed_data`` and ``constant_data`` (the model's array arguments).
"""

from __future__ import annotations

import inspect
from typing import Optional

import jax
import numpy as np
from numpyro import handlers
from numpyro.infer import Predictive
from numpyro.infer import log_likelihood as numpyro_log_likelihood
from numpyro.primitives import Messenger

from .core.trace import observed_site_names
from .runtime.random import split_chains

__all__ = ["model_dims", "unobserved", "to_inference_data"]


def model_dims(trace) -> dict:
    """``{site: [dim names]}`` from a model trace: plate names, then event dim names.

    The same rule as ``arviz.from_numpyro``: batch dims are the site's plates ordered by
    their ``dim`` (outermost first), event dims come from ``infer={"event_dims": [...]}``.
    """
    dims = {}
    for name, site in trace.items():
        if site["type"] not in ("sample", "deterministic"):
            continue
        batch = [frame.name for frame in sorted(site.get("cond_indep_stack", []), key=lambda f: f.dim)]
        event = list(site.get("infer", {}).get("event_dims", []))
        if batch or event:
            dims[name] = batch + event
    return dims


class unobserved(Messenger):
    """Samples the model's observed sites instead of conditioning on the data.

    For predictive draws of models written ``numpyro.sample("y", d, obs=y)`` without the
    ``y=None`` convention: under this handler the data are ignored and ``y`` is drawn.
    """

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["is_observed"]:
            msg["value"] = None
            msg["is_observed"] = False


def _model_trace(lm):
    """The user's model traced at the LM mean (no LM-internal Jacobian factors)."""
    args, kwargs = lm.model_args, lm.model_kwargs
    values = lm.model_info.constrain(lm.gaussian.mean, args, kwargs)
    values = {s.name: values[s.name] for s in lm.layout.sites}
    model = handlers.substitute(handlers.seed(lm.model, 0), data=values)
    return handlers.trace(model).get_trace(*args, **kwargs)


def _constant_data(model, args, kwargs, observed: dict) -> dict:
    """The model's array arguments by parameter name, without the observed data."""
    try:
        bound = inspect.signature(model).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return {}
    data = {}
    for name, value in bound.items():
        if not isinstance(value, (jax.Array, np.ndarray)) or np.ndim(value) == 0:
            continue
        if any(value is obs or (np.shape(value) == np.shape(obs) and np.array_equal(value, obs))
               for obs in observed.values()):
            continue
        data[name] = np.asarray(value)
    return data


def _with_chain(tree):
    # independent draws as pseudo-chains: ArviZ's diagnostics are then defined, not warned about
    return {k: split_chains(v) for k, v in tree.items()}


def to_inference_data(
    lm,
    *,
    rng_key=None,
    posterior_predictive=False,
    prior=False,
    num_prior_samples: Optional[int] = None,
    log_likelihood: bool = True,
    constant_data: Optional[dict] = None,
    coords: Optional[dict] = None,
    dims: Optional[dict] = None,
):
    """``arviz.InferenceData`` of a fitted ``lm`` (see the module docstring).

    :param rng_key: PRNG key for the predictive and prior draws.
    :param posterior_predictive: ``True`` to draw one replicate of the observed sites per
        posterior draw, or a dict of draws (as ``az.from_numpyro`` takes).
    :param prior: ``True`` to draw ``num_prior_samples`` (default ``lm.num_samples``) from
        the prior (latent sites to ``prior``, observed sites to ``prior_predictive``), or
        a dict of prior draws.
    :param bool log_likelihood: add the pointwise log likelihood group.
    :param dict constant_data: the ``constant_data`` group; by default the model's array
        arguments other than the observations, named after the model's parameters.
    :param dict coords: coordinate values per dim name, as in ``az.from_numpyro``.
    :param dict dims: dim names per variable; default from the model's plates.
    """
    import arviz as az

    if lm.batch_size is not None:
        raise ValueError("to_inference_data describes one fit; this LaplaceMatching holds run_many's batch of "
                         f"{lm.batch_size}. Use get_samples() (a leading axis per data set), or run() on one data set.")
    model, args, kwargs = lm.model, lm.model_args, lm.model_kwargs
    samples = {k: np.asarray(v) for k, v in jax.device_get(lm.get_samples()).items()}
    trace = _model_trace(lm)
    observed_names = observed_site_names(trace)
    observed = {n: np.asarray(trace[n]["value"]) for n in observed_names}
    dims = {**model_dims(trace), **(dims or {})}
    keys = iter(jax.random.split(jax.random.PRNGKey(0) if rng_key is None else rng_key, 2))
    free_model = unobserved(model)

    if posterior_predictive is True:
        predictive = Predictive(free_model, posterior_samples=samples, return_sites=observed_names, parallel=True)
        posterior_predictive = predictive(next(keys), *args, **kwargs)
    else:
        next(keys)
    prior_predictive = None
    if prior is True:
        n = lm.num_samples if num_prior_samples is None else num_prior_samples
        try:
            draws = Predictive(free_model, num_samples=n, parallel=True)(next(keys), *args, **kwargs)
        except NotImplementedError as e:
            raise ValueError(
                "prior=True needs a model whose prior can be sampled; a site with an improper "
                f"prior (ImproperUniform) cannot ({e}). Pass prior=False."
            ) from None
        prior = {k: v for k, v in draws.items() if k not in observed}
        prior_predictive = {k: v for k, v in draws.items() if k in observed}

    groups = {
        "posterior": _with_chain(samples),
        "sample_stats": _with_chain(lm.get_extra_fields()),
        "observed_data": observed,
        "constant_data": _constant_data(model, args, kwargs, observed) if constant_data is None else constant_data,
    }
    if log_likelihood and observed:
        loglik = numpyro_log_likelihood(model, samples, *args, **kwargs)
        groups["log_likelihood"] = _with_chain(loglik)
    if posterior_predictive:
        groups["posterior_predictive"] = _with_chain(jax.device_get(posterior_predictive))
    if prior:
        groups["prior"] = _with_chain(jax.device_get(prior))
        if prior_predictive:
            groups["prior_predictive"] = _with_chain(jax.device_get(prior_predictive))
    groups = {k: v for k, v in groups.items() if v}
    idata = az.from_dict(**groups, coords=coords, dims=dims)
    idata.posterior.attrs["inference_library"] = "numpyro_lm"
    return idata
