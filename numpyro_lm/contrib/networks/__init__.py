"""PIHAM: attributed multilayer networks with Laplace Matching memberships (thesis chapter 5).

``piham_model`` (the NumPyro model), ``fit_piham`` (MAP from vmapped restarts, per-node
Laplace, Dirichlet memberships), the thesis' synthetic generators, the MTCOV baseline and the
scores of appendix C.
"""

from .fit import Memberships, PIHAMFit, fit_piham, logistic_normal_intervals, memberships
from .generate import GeneratedNetwork, mtcov_network, piham_network, prior_network
from .model import ATTRIBUTE_KINDS, LAYER_KINDS, Network, attribute_means, edge_means, log_joint, piham_model

__all__ = ["Network", "LAYER_KINDS", "ATTRIBUTE_KINDS", "piham_model", "log_joint", "edge_means", "attribute_means",
           "fit_piham", "PIHAMFit", "Memberships", "memberships", "logistic_normal_intervals", "mtcov_network",
           "piham_network", "prior_network",
           "GeneratedNetwork"]
