"""What a matched family is, and the registry that finds one by name."""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

from .bases import get_basis

__all__ = [
    "MatchedFamily",
    "register_family",
    "get_family",
    "family_names",
    "family_bases",
    "register_prior_family",
    "family_for_prior",
    "basis_log_prob",
]


class MatchedFamily(NamedTuple):
    """An exponential family matched to a Gaussian in one basis (Laplace Matching).

    :param name: what users pass in ``families={site: name}``.
    :param basis: the name of the basis (:mod:`numpyro_lm.families.bases`) the maps are exact in.
    :param event_dim: ``None`` to follow the site (Normal for scalar coordinates,
        MultivariateNormal for vector sites), 0 for families matched coordinate by coordinate (``mean``, ``var``
        elementwise), 1 for families matched on a vector (``mean (..., d)``,
        ``cov (..., d, d)``).
    :param from_gaussian: ``(mean, var_or_cov) -> params`` (a dict of arrays).
    :param to_gaussian: ``params -> (mean, var_or_cov)``: the Laplace approximation of
        the family in the basis.
    :param distribution: ``params -> numpyro Distribution`` on the core domain of the
        basis (positive reals for ``log``, the unit interval for ``logit``...). Affine
        parts of the support (bounds) are applied by the caller.
    :param copula: how draws keep the Laplace correlations (:mod:`numpyro_lm.posterior.copula`):
        ``"gaussian"`` uses the joint Gaussian draw itself, ``"quantile"`` maps its
        standardised coordinate through ``basis_quantile``, ``"independent"`` draws the
        site from ``sample_basis`` alone.
    :param basis_quantile: ``(params, u) -> y``, the quantile function in basis
        coordinates (``copula="quantile"``).
    :param sample_basis: ``(rng_key, params, num_samples) -> y`` of shape ``(num_samples,) +
        batch + event`` (``copula="independent"``), from ``jax.random`` keys; draw ``i``
        should not depend on ``num_samples`` (:mod:`numpyro_lm.runtime.random`).
    :param in_basis: ``distribution`` lives on the basis coordinates themselves and is
        pushed through the whole basis transform (the transformed Gaussian).
    :param log_prob: ``(params, y) -> log density of the basis coordinates y`` (per
        coordinate for ``event_dim=0``, per event vector for ``event_dim=1``); optional,
        for a closed form that is stabler than the default of :func:`basis_log_prob`.
    :param host_sample: ``(rng: numpy Generator, params: dict of NumPy arrays) -> y``,
        optional: independent draws in basis coordinates on the host (NumPy), for
        coordinates whose copula is the independence copula (no quantile function needed).
    """

    name: str
    basis: Optional[str]
    event_dim: Optional[int]
    from_gaussian: Callable
    to_gaussian: Callable
    distribution: Callable
    copula: str = "quantile"
    basis_quantile: Optional[Callable] = None
    sample_basis: Optional[Callable] = None
    in_basis: bool = False
    log_prob: Optional[Callable] = None
    host_sample: Optional[Callable] = None


_FAMILIES: dict[tuple, MatchedFamily] = {}
_PRIOR_FAMILIES: dict[str, str] = {}


def register_family(family: MatchedFamily) -> MatchedFamily:
    """Register ``family`` under ``(family.name, family.basis)`` (replacing any earlier one).

    ``basis=None`` registers a family that lives on the basis coordinates of any basis
    (the transformed Gaussian).
    """
    _FAMILIES[(family.name, family.basis)] = family
    return family


def family_names() -> list[str]:
    return sorted({name for name, _ in _FAMILIES})


def family_bases(name: str) -> list:
    """The bases in which family ``name`` has a map (``[None]``: any basis)."""
    return sorted((b for n, b in _FAMILIES if n == name), key=str)


def get_family(name: str, basis: Optional[str] = None) -> MatchedFamily:
    """The family ``name`` matched in ``basis`` (any basis if the name has only one)."""
    if (name, basis) in _FAMILIES:
        return _FAMILIES[(name, basis)]
    if (name, None) in _FAMILIES:
        return _FAMILIES[(name, None)]
    bases = family_bases(name)
    if not bases:
        raise ValueError(f"unknown matched family {name!r}; registered families are {family_names()}.")
    if basis is None and len(bases) == 1:
        return _FAMILIES[(name, bases[0])]
    raise ValueError(f"family {name!r} has no map in the {basis!r} basis; it is matched in {bases}.")


def register_prior_family(prior: str, name: str) -> None:
    """Match sites whose prior is the distribution class named ``prior`` with family ``name``.

    Used where the family has a map in the site's basis; e.g. an ``InverseGamma`` prior
    gives an ``inverse_gamma`` posterior in the log or sqrt basis.
    """
    _PRIOR_FAMILIES[prior] = name


def family_for_prior(prior: str, basis: str) -> Optional[str]:
    """The family registered for a prior class name, if it has a map in ``basis``."""
    name = _PRIOR_FAMILIES.get(prior)
    if name is not None and ((name, basis) in _FAMILIES or (name, None) in _FAMILIES):
        return name
    return None


def basis_log_prob(family: MatchedFamily, params: dict, y):
    r"""Log density of the matched family expressed in its basis coordinates ``y``.

    .. math:: \log q(y) = \log p_\theta(T(y)) + \log|\det \partial T / \partial y|

    with ``T`` the basis transform onto the family's support (``exp`` for ``log``,
    ``sigmoid`` for ``logit``, the zero-sum softmax for ``softmax``...). Affine parts of a
    site's support (bounds) do not enter: the density is over the basis coordinates.
    """
    if family.log_prob is not None:
        return family.log_prob(params, y)
    d = family.distribution(params)
    if family.in_basis:
        return d.log_prob(y)
    t = get_basis(family.basis).transform(d.support)
    x = t(y)
    return d.log_prob(x) + t.log_abs_det_jacobian(y, x)
