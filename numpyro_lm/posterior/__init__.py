"""From the Laplace Gaussian to the posterior: MVI refinement of the Gaussian
(:mod:`.refine`), each site's Gaussian marginal and matched family (:mod:`.marginals`), joint
draws through a Gaussian copula (:mod:`.copula`), and each site's distribution on its own
domain (:mod:`.matched`).

Imports the stages below it: runtime, curvature, mode, families, core.
"""

from .matched import AffineTransformed, MatchedPosterior, describe, readable, site_distribution

__all__ = ["MatchedPosterior", "AffineTransformed", "site_distribution", "readable", "describe"]
