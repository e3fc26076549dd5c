"""Samplers beside Laplace Matching: NUTS warm-started from a fit, elliptical slice sampling."""

from .elliptical_slice import EllipticalSlice, ESSState, elliptical_slice_step
from .warm_nuts import WarmStart, unconstrained_gaussian, warm_nuts

__all__ = ["warm_nuts", "WarmStart", "unconstrained_gaussian", "EllipticalSlice", "ESSState", "elliptical_slice_step"]
