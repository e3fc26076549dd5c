"""How a nested fit splits the model's flat coordinates into hyperparameters and the rest."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...core.structure import MAX_CCD_DIM
from ...core.trace import split_coordinates
from ...marginal.conditional import quantile_sites
from .design import ccd_points

__all__ = ["Coordinates", "nested_coordinates"]


class Coordinates(NamedTuple):
    """How a nested fit splits the flat coordinates: the hyperparameter sites and their
    coordinates ``theta_index``, the rest ``x_index``; ``mapped`` (all ``D``): drawn through each
    design point's matched family (quantile sites); ``gaussian_cols`` (the ``x`` ones): drawn from
    their conditional Gaussians, with a conditional mean that follows the hyperparameters."""

    hyper: list
    theta_index: np.ndarray
    x_index: np.ndarray
    mapped: np.ndarray
    gaussian_cols: np.ndarray


def nested_coordinates(layout, hyper: list) -> Coordinates:
    """The :class:`Coordinates` of a nested fit over the ``hyper`` sites (refused where it would
    leave no latent coordinate, or integrate over too many)."""
    theta_index, x_index = split_coordinates(layout, set(hyper))
    if x_index.size == 0:
        raise ValueError("hyper= names every latent site: nothing is left for the conditional Laplace step")
    if theta_index.size > MAX_CCD_DIM:
        ccd_points(theta_index.size)  # refuses, naming the limit
    mapped = np.zeros(layout.size, bool)
    for site, _ in quantile_sites(layout, theta_index):
        mapped[site.offset : site.offset + site.size] = True
    return Coordinates(hyper, theta_index, x_index, mapped, ~mapped[x_index])
