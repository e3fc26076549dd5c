"""What a matched family is, and the registry that finds one by name."""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

__all__ = ["MatchedFamily", "register_family", "get_family", "family_names"]


class MatchedFamily(NamedTuple):
    """An exponential family matched to a Gaussian in one basis (Laplace Matching).

    :param name: what users pass in ``families={site: name}``.
    :param basis: the name of the basis (:mod:`numpyro_lm.bases`) the maps are exact in.
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
    :param copula: how draws keep the Laplace correlations (:mod:`numpyro_lm.copula`):
        ``"gaussian"`` uses the joint Gaussian draw itself, ``"quantile"`` maps its
        standardised coordinate through ``basis_quantile``, ``"independent"`` draws the
        site from ``sample_basis`` alone.
    :param basis_quantile: ``(params, u) -> y``, the quantile function in basis
        coordinates (``copula="quantile"``).
    :param sample_basis: ``(rng_key, params, shape) -> y`` (``copula="independent"``).
    :param in_basis: ``distribution`` lives on the basis coordinates themselves and is
        pushed through the whole basis transform (the transformed Gaussian).
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


_FAMILIES: dict[str, MatchedFamily] = {}


def register_family(family: MatchedFamily) -> MatchedFamily:
    """Register ``family`` under ``family.name`` (replacing any earlier one)."""
    _FAMILIES[family.name] = family
    return family


def family_names() -> list[str]:
    return sorted(_FAMILIES)


def get_family(name: str) -> MatchedFamily:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(
            f"unknown matched family {name!r}; registered families are {family_names()}."
        ) from None
