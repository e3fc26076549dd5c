"""Curvature: the precision of a Laplace Gaussian as data with operations (see :mod:`.base`)."""

from .base import Curvature, Gaussian, covariance, singular_floor
from .dense import CholeskyCurvature, DenseCurvature

__all__ = ["Curvature", "Gaussian", "DenseCurvature", "CholeskyCurvature", "covariance", "singular_floor"]
