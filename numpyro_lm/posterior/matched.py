"""Each site's matched family as a NumPyro distribution on the site's own domain.

The family lives on the core domain of the basis (the positive reals for ``log``, the unit
interval for ``logit``); the bounds of the site's support (``Uniform(a, b)``, a positive
site shifted by ``lb``) are applied as the affine part of the basis transform, built from
the model's trace at the mode. A site whose support depends on other latent sites has no
closed-form marginal and is refused (its draws are right: they map each draw with the
drawn values of the sites it depends on).

Each distribution handed out prints its parameters (``Gamma(concentration=14.0, rate=4.0)``)
instead of NumPyro's ``<... object at 0x...>``: :func:`readable` swaps in a subclass that only
adds a ``__repr__``, so ``isinstance(d, dist.Gamma)`` and every method are unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Callable

import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions.distribution import validation_enabled
from numpyro.distributions.transforms import (AffineTransform, ComposeTransform, ExpTransform, IndependentTransform,
                                                LowerCholeskyAffine)

from ..core.trace import is_elementwise
from ..families import get_family

__all__ = ["MatchedPosterior", "AffineTransformed", "site_distribution", "readable", "describe"]


def _value(v) -> str:
    a = np.asarray(v)
    if a.ndim == 0:
        return f"{float(a):.5g}"
    if a.size > 12:
        return f"<array {a.shape}>"
    return np.array2string(a, precision=4, separator=", ").replace("\n", "")


def describe(d) -> str:
    """A distribution as ``Family(param=value, ...)``; wrappers show what they wrap."""
    if isinstance(d, dist.Independent):
        return f"Independent({describe(d.base_dist)}, reinterpreted_batch_ndims={d.reinterpreted_batch_ndims})"
    if isinstance(d, dist.TransformedDistribution):
        if isinstance(d, AffineTransformed):
            t = d._affine
            return f"{describe(d.base_dist)} * {_value(t.scale)} + {_value(t.loc)}"
        names = ", ".join(type(t).__name__ for t in d.transforms)
        return f"TransformedDistribution({describe(d.base_dist)}, transforms=[{names}])"
    name = getattr(type(d), "_readable_of", type(d)).__name__
    # parameters as given: lazily computed alternatives (probs of a logits Bernoulli) are
    # skipped, and of a covariance given three ways only the first is shown
    params = [(k, d.__dict__[k]) for k in d.arg_constraints if k in d.__dict__]
    shown = [p for p in params if p[0] not in _COVARIANCE_FORMS]
    shown += [p for p in params if p[0] in _COVARIANCE_FORMS][:1]
    params = sorted(shown, key=lambda p: list(d.arg_constraints).index(p[0]))
    return f"{name}(" + ", ".join(f"{k}={_value(v)}" for k, v in params) + ")"


_READABLE = {}
_COVARIANCE_FORMS = ("covariance_matrix", "precision_matrix", "scale_tril")


def readable(d):
    """``d`` with a ``__repr__`` that shows its parameters (module docstring), in place."""
    cls = type(d)
    if getattr(cls, "_readable_of", None) is None:
        if cls not in _READABLE:
            # a subclass registers itself as a JAX pytree (numpyro's __init_subclass__)
            _READABLE[cls] = type(cls.__name__, (cls,), {"__repr__": describe, "_readable_of": cls,
                                                         "__module__": cls.__module__, "__doc__": cls.__doc__})
        d.__class__ = _READABLE[cls]
    return d


class MatchedPosterior(Mapping):
    """``{site: numpyro Distribution}``: each site's matched family on its own domain.

    Built lazily, site by site; ``refuse(name)`` returns an error message for a site that
    has no closed-form marginal (else ``None``).
    """

    def __init__(self, build: Callable, names: tuple, refuse: Callable):
        self._build, self._names, self._refuse = build, names, refuse
        self._cache = {}

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(f"{name!r} is not a latent site; latent sites are {list(self._names)}")
        if name not in self._cache:
            why = self._refuse(name)
            if why is not None:
                raise ValueError(why)
            self._cache[name] = self._build(name)
        return self._cache[name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def __repr__(self):
        return f"MatchedPosterior({list(self._names)})"

    def __str__(self):
        lines = []
        for name in self._names:
            try:
                lines.append(f"  {name}: {self[name]!r}")
            except ValueError as e:  # a site without a closed-form marginal
                lines.append(f"  {name}: no closed-form marginal ({str(e).split('.')[0]})")
        return "MatchedPosterior(\n" + "\n".join(lines) + "\n)"


class AffineTransformed(dist.TransformedDistribution):
    """``loc + scale * X`` for a matched family ``X`` (bounded sites), with its moments."""

    @property
    def _affine(self):
        (t,) = self.transforms
        return t

    @property
    def mean(self):
        return self._affine.loc + self._affine.scale * self.base_dist.mean

    @property
    def variance(self):
        return jnp.square(self._affine.scale) * self.base_dist.variance


class NoClosedFormMoments(dist.TransformedDistribution):
    """A matched Gaussian mapped through a site's nonlinear basis transform (ordered, zero-sum,
    correlation-Cholesky, stick-breaking...): its density and draws are exact, its mean and
    variance have no closed form, and asking for them names the site and the way to them
    (numpyro's own ``TransformedDistribution`` raises a bare ``NotImplementedError``)."""

    pytree_aux_fields = ("site_name",)

    def __init__(self, base_distribution, transforms, site_name: str = "", validate_args=None):
        self.site_name = site_name
        super().__init__(base_distribution, transforms, validate_args=validate_args)

    def _no_closed_form(self, moment: str):
        return NotImplementedError(
            f"site {self.site_name!r}: the {moment} of its matched Gaussian mapped through "
            f"{type(self.transforms[-1]).__name__} has no closed form. Estimate it from draws: "
            f"lm.get_samples()[{self.site_name!r}].{'mean' if moment == 'mean' else 'var'}(0).")

    @property
    def mean(self):
        raise self._no_closed_form("mean")

    @property
    def variance(self):
        raise self._no_closed_form("variance")


def _outer_transform(t):
    """The part of a basis transform after its core (``exp``/``sigmoid``): the bounds."""
    if isinstance(t, IndependentTransform):
        t = t.base_transform
    if isinstance(t, ComposeTransform) and len(t.parts) > 1:
        rest = t.parts[1:]
        return rest[0] if len(rest) == 1 else ComposeTransform(rest)
    return None


def site_distribution(site, params: dict, transform):
    """The matched family of ``site`` (a :class:`~numpyro_lm.core.trace.SiteSpec`) with ``params``,
    on the site's domain; ``transform`` is the site's basis transform at the mode. A site with no
    entries (a zero-size plate or event) gets its family with zero-size parameters, built without
    numpyro's argument checks (a 0 x 0 covariance has no smallest eigenvalue to check)."""
    with validation_enabled(False) if site.size == 0 else contextlib.nullcontext():
        return readable(_site_distribution(site, params, transform))


def _site_distribution(site, params: dict, transform):
    family = get_family(site.family, site.basis)
    d = family.distribution(params)
    if is_elementwise(site, family) and site.basis_event_dim > 0:
        d = d.to_event(site.basis_event_dim)
    if family.in_basis:
        if isinstance(transform, LowerCholeskyAffine) and isinstance(d, dist.MultivariateNormal):
            # a whitened site (f = loc + L z): the Gaussian over z is a Gaussian over f
            scale = transform.scale_tril
            return dist.MultivariateNormal(transform.loc + (scale @ d.loc[..., None])[..., 0],
                                           scale_tril=scale @ d.scale_tril)
        if isinstance(transform, ExpTransform) and type(d) is dist.Normal:
            # the same distribution, with the mean and variance a TransformedDistribution lacks
            return dist.LogNormal(d.loc, d.scale)
        return NoClosedFormMoments(d, transform, site.name)
    outer = _outer_transform(transform)
    if outer is None:
        return d
    if isinstance(outer, AffineTransform):
        return AffineTransformed(d, outer)
    return NoClosedFormMoments(d, outer, site.name)
