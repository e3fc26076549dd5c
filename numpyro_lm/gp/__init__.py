"""LM + GP: Gaussian-process regression on non-Gaussian data through Laplace Matching (thesis
chapter 3, Algorithm 2): :mod:`~numpyro_lm.gp.pseudo` turns data into heteroskedastic Gaussian
pseudo-observations, :mod:`~numpyro_lm.gp.regression` fits an ordinary GP to them and maps
its predictions back to the matched family, :class:`LMGP` holds one fit."""

from .model import LMGP, Prediction
from .pseudo import DATA_KINDS, EPS, PseudoObservations, group_labels, pseudo_observations
from .regression import (KernelParams, default_params, fit_hyperparameters, latent_predictive,
                         log_marginal_likelihood, matched_predictive, rbf_kernel)

__all__ = ["LMGP", "Prediction", "DATA_KINDS", "EPS", "PseudoObservations", "group_labels", "pseudo_observations",
           "KernelParams", "default_params", "fit_hyperparameters", "latent_predictive", "log_marginal_likelihood",
           "matched_predictive", "rbf_kernel"]
