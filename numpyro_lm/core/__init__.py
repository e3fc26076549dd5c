"""The model as the fit sees it: its latent sites and their bases and families
(:mod:`.trace`), the flat log density and its maps (:mod:`.model`), the dependency
structure and the hyperparameters (:mod:`.structure`), and which curvature that structure
allows (:mod:`.curvature_choice`).

Imports :mod:`numpyro_lm.runtime`, :mod:`numpyro_lm.curvature`, :mod:`numpyro_lm.mode` and
:mod:`numpyro_lm.families`.
"""
