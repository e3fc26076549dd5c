"""LM + GP: Gaussian-process regression on non-Gaussian data through Laplace Matching (thesis
chapter 3, Algorithm 2): :mod:`~numpyro_lm.contrib.gp.pseudo` turns binary labels, counts, categories
or zero-mean vectors into heteroskedastic Gaussian pseudo-observations,
:mod:`~numpyro_lm.contrib.gp.regression` (scalar) and :mod:`~numpyro_lm.contrib.gp.blocks` (a vector with a
noise block per group) fit an ordinary GP to them and map its predictions back to the matched
family, :mod:`~numpyro_lm.contrib.gp.loo` chooses the kernel by the data's leave-one-out predictive,
:mod:`~numpyro_lm.contrib.gp.refine` re-expands the pseudo-observations at the GP's posterior mode,
:class:`LMGP` holds one fit."""

from .blocks import block_predictive, fit_block_hyperparameters, predictive
from .loo import LOO_KINDS, fit_by_leave_one_out, leave_one_out
from .model import LMGP, SEARCHES, Choices, Prediction, default_choices
from .pseudo import BLOCK_KINDS, DATA_KINDS, EPS, PseudoObservations, group_labels, pseudo_observations
from .refine import relinearise
from .regression import (KernelParams, default_params, fit_hyperparameters, latent_predictive,
                         log_marginal_likelihood, matched_predictive, rbf_kernel)

__all__ = ["LMGP", "Prediction", "SEARCHES", "Choices", "default_choices", "relinearise", "LOO_KINDS", "fit_by_leave_one_out", "leave_one_out",
           "BLOCK_KINDS", "DATA_KINDS", "EPS", "block_predictive", "fit_block_hyperparameters", "predictive", "PseudoObservations", "group_labels", "pseudo_observations",
           "KernelParams", "default_params", "fit_hyperparameters", "latent_predictive", "log_marginal_likelihood",
           "matched_predictive", "rbf_kernel"]
