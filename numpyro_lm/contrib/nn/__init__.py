"""The Laplace Bridge for neural networks (thesis chapter 4): a last-layer Laplace posterior
for any JAX classifier (:mod:`~numpyro_lm.contrib.nn.last_layer`), the Gaussian over its logits, and
class probabilities from it in closed form (:mod:`~numpyro_lm.contrib.nn.predictive`), scored by
:mod:`~numpyro_lm.contrib.nn.metrics`; :class:`LastLayerLaplace` holds one fit."""

from . import metrics
from .last_layer import STRUCTURES, LastLayerPosterior, curvature, fit_last_layer, log_evidence, logit_gaussian
from .model import LastLayerLaplace
from .predictive import PREDICTIVES, ClassPredictive, class_probabilities

__all__ = ["LastLayerLaplace", "STRUCTURES", "LastLayerPosterior", "curvature", "fit_last_layer", "log_evidence",
           "logit_gaussian", "PREDICTIVES", "ClassPredictive", "class_probabilities", "metrics"]
