"""A NumPyro model traced once: the flat LM-basis vector, its log density, the map back.

:func:`model_info` (in the spirit of numpyro's ``initialize_model``) runs the model once,
abstractly, and returns an immutable, hashable :class:`ModelInfo`: the layout of the
latent sites in their Laplace Matching bases (:mod:`numpyro_lm.core.trace`) and pure functions
of a flat basis vector ``y`` given the model's arguments:

- :meth:`ModelInfo.log_density`: :math:`\\log p(x(y), \\text{data}) + \\log|\\det \\partial x/\\partial y|`;
- :meth:`ModelInfo.constrain`: the latent and deterministic sites' values at ``y``;
- :meth:`ModelInfo.init`: the basis coordinates of a numpyro init strategy's point;
- :attr:`ModelInfo.parents`: which latent sites each sample site's distribution depends on.

Everything downstream (the fit, nested Laplace, refinement, the NUTS and elliptical slice
adapters, the ArviZ export) works from a ``ModelInfo``; being hashable, it keys compiled
programs (:func:`numpyro_lm.runtime.programs.program`).
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache, partial
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions.distribution import validation_enabled
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import compute_log_probs, log_density

from ..families import get_family
from ..mode.derivatives import forward_mode_refused
from ..runtime.programs import merge_inputs, shape_key, split_inputs
from ..runtime.static_data import StaticArray, mark_static, static_positions, static_where_needed
from .structure import prior_parents
from .trace import Layout, SiteChoice, basis_value, ravel, site_transform, trace_sites, unravel

__all__ = ["ModelInfo", "model_info", "TracedModels"]


@lru_cache(maxsize=64)
def _traced_once(info: "ModelInfo", key, x64: bool):
    """``info``'s log density as one ``jax.jit`` for arguments of the static part ``key``
    (:func:`~numpyro_lm.runtime.programs.split_inputs`), for models given data they need
    concretely (:class:`~numpyro_lm.runtime.static_data.StaticArray`): the programs that evaluate
    the density, and the several evaluations inside one, run the model's Python once per shape
    instead of each time. Such a model computes with those data in NumPy as it runs: a sparse
    CAR prior the eigenvalues of its 2500 x 2500 adjacency, 0.9 s each time (23 times in the
    cold call over a 50 x 50 grid, 6 so: 70 -> 56 s). Other models keep the plain call: on the
    Poisson random-effect benchmark the wrapper cost 0.3-0.7 s of its 7-9 s cold call."""

    def density(flat, arrays):
        args, kwargs = merge_inputs(arrays, key)
        return info._log_density(flat, args, kwargs)

    return jax.jit(density)


class ModelInfo(NamedTuple):
    """A traced model: its latent layout and pure functions of the flat basis vector.

    ``args``/``kwargs`` are the model's arguments, passed to every method (the layout
    holds for any arguments of the traced shapes).
    """

    model: Callable
    layout: Layout
    choice: SiteChoice
    parents: Optional[tuple] = None  # each sample site's latent parents (structure.prior_parents)

    @property
    def size(self) -> int:
        """``D``, the length of the flat vector."""
        return self.layout.size

    def substituted(self, flat):
        """The model with every latent site set from ``flat`` (basis coordinates), the
        log-Jacobian of each basis as a factor; ``flat`` may also be ``{site: coordinates}``."""
        params = flat if isinstance(flat, dict) else unravel(self.layout, flat)
        return handlers.substitute(self.model, substitute_fn=partial(basis_value, params, self.choice))

    def log_density(self, flat, args=(), kwargs=None):
        """log p(x(y), data) + log|det dx/dy| at the flat basis coordinates ``flat``.

        ``flat`` may also be ``{site: basis coordinates}``: sites whose values do not
        depend on what is differentiated then carry no derivative work.
        """
        arrays, key = split_inputs((tuple(args), dict(kwargs or {})))
        if not any(s is not None and isinstance(s.value, StaticArray) for s in key.static):
            return self._log_density(flat, args, kwargs)
        # data the model needs concretely: it computes with them in NumPy each time it runs
        # one per precision mode: jaxlib keeps a static array's conversion by identity, and a
        # float64 program must meet the fresh copy in_float64 makes (runtime.programs.in_float64)
        return _traced_once(self, key, jax.config.jax_enable_x64)(flat, arrays)

    def _log_density(self, flat, args=(), kwargs=None):
        # argument checks cannot fail on traced values: skip tracing them (a fifth of the time)
        with validation_enabled(False):
            value, trace = log_density(self.substituted(flat), args, kwargs or {}, {})
        return value + self._missing_data_density(trace)

    def _missing_data_density(self, trace):
        """A standard normal density on the basis coordinates of the obs_mask sites' entries
        that the mask drops (the observed positions: :func:`numpyro_lm.core.trace.missing_data_sites`)."""
        total = jnp.zeros((), jnp.result_type(float))
        for name in self.layout.missing_data:
            site, spec = trace[name], self.layout.site(name)
            y = jnp.reshape(site_transform(self.choice, site).inv(site["value"]), spec.basis_shape)
            term = -0.5 * y**2 - 0.5 * jnp.log(2 * jnp.pi)
            term = jnp.sum(term, axis=tuple(range(-spec.basis_event_dim, 0))) if spec.basis_event_dim else term
            dropped = ~jnp.broadcast_to(jnp.asarray(site["fn"]._mask, bool), term.shape)
            total = total + jnp.sum(jnp.where(dropped, term, 0.0))
        return total

    def log_prior(self, flat, args=(), kwargs=None):
        """The latent sites' share of :meth:`log_density`: their log prior densities and the
        bases' log-Jacobians, without the observed sites (the likelihood) and ``numpyro.factor``
        terms of the model's own. Structured curvatures hold its Hessian exactly and the rest as
        a low-rank update (:class:`numpyro_lm.mode.hessian.LowRankHessian`)."""
        latent = {s.name for s in self.layout.sites}
        latent |= {f"_{name}_lm_log_det" for name in latent}
        with validation_enabled(False):
            terms, trace = compute_log_probs(self.substituted(flat), args, kwargs or {}, {})
        return sum((v for k, v in terms.items() if k in latent), start=self._missing_data_density(trace))

    def site_log_probs(self, flat, args=(), kwargs=None) -> dict:
        """``{site: its log probability entry by entry}`` (scaled and masked; the bases'
        log-Jacobian factors included): the terms :meth:`log_density` sums, before the sum.
        Refused for models with ``obs_mask`` sites (their dropped entries' density is not a site's)."""
        if self.layout.missing_data:
            raise ValueError("site_log_probs: the model has obs_mask sites, whose dropped entries are no site's")
        with validation_enabled(False):
            terms, _ = compute_log_probs(self.substituted(flat), args, kwargs or {}, {}, sum_log_prob=False)
        return terms

    def trace(self, flat, args=(), kwargs=None):
        """The model's trace with the latent sites at ``flat`` (the LM Jacobian factors included)."""
        return handlers.trace(self.substituted(flat)).get_trace(*args, **(kwargs or {}))

    def constrain(self, flat, args=(), kwargs=None) -> dict:
        """Constrained values of the latent and deterministic sites at ``flat``."""
        tr = self.trace(flat, args, kwargs)
        latent = {s.name for s in self.layout.sites}
        return {name: _empty_as_constant(site["value"]) for name, site in tr.items()
                if name in latent or site["type"] == "deterministic"}

    def init(self, rng_key, args=(), kwargs=None, init_strategy: Callable = init_to_uniform):
        """Flat basis coordinates of the point a numpyro init strategy picks.

        Init strategies sample in numpyro's own unconstrained space; sites with flat priors
        (``ImproperUniform``) fall back to ``init_to_uniform`` there, so nothing is ever
        forward-sampled from a flat prior.
        """
        seeded = handlers.substitute(handlers.seed(self.model, rng_key), substitute_fn=init_strategy)
        tr = handlers.trace(seeded).get_trace(*args, **(kwargs or {}))
        values = {}
        for s in self.layout.sites:
            site = tr[s.name]
            values[s.name] = jnp.broadcast_to(site_transform(self.choice, site).inv(site["value"]), s.basis_shape)
        return ravel(self.layout, values).astype(jnp.result_type(float))

    def transform(self, name: str, trace):
        """The basis transform of site ``name`` as built from its support in ``trace``."""
        return site_transform(self.choice, trace[name])

    def support_bounds(self, flat, args=(), kwargs=None) -> dict:
        """``{site: its support's bounds at flat}`` (to find supports that depend on values)."""
        tr = self.trace(flat, args, kwargs)
        bounds = {}
        for s in self.layout.sites:
            support = tr[s.name]["fn"].support
            while hasattr(support, "base_constraint"):
                support = support.base_constraint
            parts = [jnp.ravel(jnp.asarray(getattr(support, attr), dtype=flat.dtype))
                     for attr in ("lower_bound", "upper_bound") if hasattr(support, attr)]
            bounds[s.name] = jnp.concatenate(parts) if parts else jnp.zeros((0,), flat.dtype)
        return bounds

    def dependent_sites(self, flat, args=(), kwargs=None) -> frozenset:
        """Sites whose support moves with the other latent values (``Uniform(0, 1 - a)``): those
        whose bounds change along either of two random directions (forward-mode products, where a
        full Jacobian would take a ``D x D`` identity: 40 GB at 10^5 coordinates). A bound that
        depends on the latent values changes along almost every direction."""
        directions = jax.random.normal(jax.random.PRNGKey(0), (2,) + jnp.shape(flat), jnp.result_type(flat))
        bounds = lambda y: self.support_bounds(y, args, kwargs)  # noqa: E731
        try:
            moved = jax.vmap(lambda d: jax.jvp(bounds, (flat,), (d,))[1])(directions)
        except TypeError as error:  # forward mode refused (odeint's custom_vjp): each site's bounds by reverse mode
            if not forward_mode_refused(error):
                raise
            return self._dependent_by_reverse(bounds, flat)
        return frozenset(k for k, v in moved.items() if v.size and bool(jnp.any(v != 0)))

    @staticmethod
    def _dependent_by_reverse(bounds: Callable, flat) -> frozenset:
        """:meth:`dependent_sites` by vector-Jacobian products: a site's bounds depend on the latent
        values where a random weighting of them has a non-zero gradient."""
        values, pullback = jax.vjp(bounds, flat)
        found = set()
        for name, v in values.items():
            if v.size:
                weights = {k: (jax.random.normal(jax.random.PRNGKey(1), jnp.shape(u), u.dtype) if k == name
                               else jnp.zeros_like(u)) for k, u in values.items()}
                if bool(jnp.any(pullback(weights)[0] != 0)):
                    found.add(name)
        return frozenset(found)

    def families(self) -> dict:
        """``{site: its MatchedFamily}``."""
        return {s.name: get_family(s.family, s.basis) for s in self.layout.sites}


def model_info(model: Callable, model_args=(), model_kwargs: Optional[dict] = None, *, bases: Optional[dict] = None,
               families: Optional[dict] = None, rng_key=None, init_strategy: Callable = init_to_uniform) -> ModelInfo:
    """Trace ``model(*model_args, **model_kwargs)`` once and describe it (module docstring).

    :param dict bases: per-site basis override, e.g. ``{"sigma": "sqrt"}``.
    :param dict families: per-site matched family override, e.g. ``{"tau": "gaussian"}``.
    :param rng_key: key of the abstract trace (values are never computed; default key 0).
    :param init_strategy: the init strategy the trace runs under (only shapes are kept).

    Array arguments may be ``jax.ShapeDtypeStruct``: only their shapes matter.
    """
    choice = SiteChoice.of(bases, families)
    key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    layout = trace_sites(model, tuple(model_args), dict(model_kwargs or {}), choice, init_strategy, key)
    parents = prior_parents(model, model_args, model_kwargs)
    return ModelInfo(model, layout, choice, parents)


class TracedModels:
    """A model traced once per argument structure and shapes (:func:`model_info`), the data
    arguments it needs as concrete values kept static (:mod:`numpyro_lm.runtime.static_data`, as
    ``MCMC`` closes over its data): what :class:`~numpyro_lm.LaplaceMatching` keeps between runs."""

    def __init__(self, model, bases: Optional[dict] = None, families: Optional[dict] = None):
        self.model, self.bases, self.families = model, bases, families
        self._infos, self._static = _shared_traces(model, SiteChoice.of(bases, families))

    def info(self, args, kwargs, batch_axes=None) -> ModelInfo:
        """The traced model for these arguments; ``batch_axes``: those array arguments carry a
        leading batch axis, and the model is traced for one data set's shapes."""
        arrays, key = split_inputs((args, kwargs))
        if batch_axes is not None:  # one data set's shapes
            arrays = [jax.ShapeDtypeStruct(np.shape(a)[1:], a.dtype) if b else a for a, b in zip(arrays, batch_axes)]
        cache = (key, shape_key(arrays))
        if cache not in self._infos:
            one_args, one_kwargs = merge_inputs(arrays, key)
            self._infos[cache] = model_info(self.model, one_args, one_kwargs, bases=self.bases, families=self.families)
        return self._infos[cache]

    def inputs(self, args, kwargs):
        """``(args, kwargs, info)``: the arguments with the data the model needs concretely marked
        static, and the model traced for them."""
        arrays, structure = split_inputs((args, kwargs))
        key = (structure, shape_key(arrays))
        static = self._static.get(key)
        if static is None:
            args, kwargs, info = static_where_needed(lambda a, k: self.info(a, k), tuple(args), dict(kwargs))
            self._static[key] = static_positions(args, kwargs)
            return args, kwargs, info
        args, kwargs = mark_static(args, kwargs, static)
        return args, kwargs, self.info(args, kwargs)


TRACED_MODELS_KEPT = 64
"""Models whose traces are kept for every :class:`TracedModels` of them (the most recently fitted),
so that a new ``LaplaceMatching(model)`` runs warm as ``jax.jit`` does for a function it has
seen: tracing a model and finding its dependencies was half of a warm call on eight schools (20
of 40 ms). Bounded: a trace holds its model (and whatever data the model closes over)."""

_TRACES: "OrderedDict" = OrderedDict()  # {(model, SiteChoice): (infos, static positions)}, oldest first


def _shared_traces(model, choice: SiteChoice) -> tuple:
    """``(infos, static)`` dicts for ``model`` with ``choice``, shared by every :class:`TracedModels`
    of it while it is among the :data:`TRACED_MODELS_KEPT` last; fresh for a model that cannot be
    hashed."""
    try:
        key = (model, choice)
        shared = _TRACES.pop(key, None) or ({}, {})
    except TypeError:
        return {}, {}
    _TRACES[key] = shared
    while len(_TRACES) > TRACED_MODELS_KEPT:
        _TRACES.popitem(last=False)
    return shared


def _empty_as_constant(value):
    """A zero-size value as a fresh constant of its shape: computed as a slice of the draws it
    came from, in a vmapped program that also calls the host (the Gamma quantiles), XLA:CPU
    (jaxlib 0.10.2) compiled the host call as an untyped custom call and the run failed with
    "No registered implementation for untyped custom call to xla_ffi_python_cpu_callback"."""
    return jnp.zeros(jnp.shape(value), jnp.result_type(value)) if jnp.size(value) == 0 else value
