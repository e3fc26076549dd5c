"""The approximations a fit can return, each a function of the traced model that returns a
complete, immutable result (:mod:`.result`): the joint Laplace Matching fit (:mod:`.joint_fit`,
:mod:`.joint`), nested Laplace over hyperparameters (:mod:`.nested`), the auto-pilot that tries
them in turn with PSIS-corrected moments and refinement (:mod:`.autopilot`), and the NUTS
fallback for an answer that is not trusted (:mod:`.fallback`).

Imports every stage below it (runtime to samplers); nothing imports it but the top level.
"""
