from .nuts import WarmStart, unconstrained_gaussian, warm_nuts
__all__ = ["warm_nuts", "WarmStart", "unconstrained_gaussian"]
