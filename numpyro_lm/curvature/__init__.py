"""Curvature: the precision of a Laplace Gaussian as data with operations (see :mod:`.base`)."""

from .arrowhead import ArrowheadCurvature
from .base import Curvature, Gaussian, covariance, eigenvalue_range, singular_floor
from .dense import CholeskyCurvature, DenseCurvature
from .diagonal import DiagonalCurvature
from .lowrank import LowRankUpdateCurvature

__all__ = ["Curvature", "Gaussian", "DenseCurvature", "CholeskyCurvature", "ArrowheadCurvature", "DiagonalCurvature", "LowRankUpdateCurvature", "covariance", "singular_floor",
           "eigenvalue_range"]
