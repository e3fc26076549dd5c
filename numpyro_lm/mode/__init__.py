"""The mode and the curvature there, for any flat log density: the damped Newton method
(:mod:`.newton`), its Hessian strategies (:mod:`.hessian`: dense, block-arrowhead, low-rank
update, each a declared object), the L-BFGS warm start, the starting points of a model's
search, and the Laplace state :func:`~.laplace_state.laplace` returns.

Imports :mod:`numpyro_lm.runtime` and :mod:`numpyro_lm.curvature` only: it knows nothing of
models, sites or families.
"""
