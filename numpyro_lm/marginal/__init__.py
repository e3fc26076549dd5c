"""The conditional Laplace marginal of a latent field given hyperparameters: the inner Newton
solve and its implicit gradient (:mod:`.laplace_marginal`), conditional fits over many
hyperparameter points (:mod:`.conditional`) and the adaptive Gauss-Hermite correction of
scalar local blocks (:mod:`.quadrature`). Nested Laplace and LaplaceNUTS both build on it.

Imports the stages below it: runtime, curvature, mode, families, core.
"""
