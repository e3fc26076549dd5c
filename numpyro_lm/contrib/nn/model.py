"""The one stateful object of the last-layer Laplace: a classifier's fit and its predictives.

``LastLayerLaplace(feature_fn, weight, bias).fit(x, y)`` runs the feature function on the
training inputs, builds the last layer's posterior (:func:`~numpyro_lm.contrib.nn.last_layer.fit_last_layer`,
the prior precision by marginal likelihood) and keeps it; ``predict(x, method)`` returns class
probabilities (and, for the bridges, Dirichlet concentrations) at new inputs. A failed ``fit``
leaves the object as it was.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from .last_layer import STRUCTURES, LastLayerPosterior, fit_last_layer, logit_gaussian
from .predictive import PREDICTIVES, ClassPredictive, class_probabilities
from ...runtime.precision import precise_jit

__all__ = ["LastLayerLaplace"]


class LastLayerLaplace:
    """Last-layer Laplace with Laplace Bridge predictives for a classifier
    ``logits = feature_fn(x) @ weight + bias``.

    :param feature_fn: ``x -> (n, D)`` features (the network without its last layer; a flax
        ``apply`` with its parameters bound, an equinox module, any JAX function).
    :param weight: ``(D, K)`` trained last-layer weights (an equinox ``Linear.weight`` is
        ``(K, D)``: pass its transpose).
    :param bias: ``(K,)`` trained bias.
    :param structure: the curvature's structure, ``"kron"`` (default), ``"full"`` or ``"diag"``.
    :param prior_precision: fixed; default chosen by the marginal likelihood.
    """

    def __init__(self, feature_fn: Callable, weight, bias, *, structure: str = "kron",
                 prior_precision: Optional[float] = None):
        if structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, not {structure!r}")
        self.feature_fn, self.weight, self.bias = feature_fn, weight, bias
        self.structure, self.prior_precision = structure, prior_precision
        self.posterior: Optional[LastLayerPosterior] = None
        self._logits = precise_jit(lambda posterior, x: logit_gaussian(posterior, self.feature_fn(x)))

    def fit(self, x, y) -> "LastLayerLaplace":
        """The last layer's posterior given training inputs ``x`` and integer labels ``y``."""
        self.posterior = fit_last_layer(self.feature_fn(x), y, self.weight, self.bias, structure=self.structure,
                                        prior_precision=self.prior_precision)
        return self

    def logits(self, x):
        """``(mean (n, K), cov (n, K, K))``: the Gaussian over the logits at ``x``."""
        if self.posterior is None:
            raise RuntimeError("call fit() first")
        mean, cov = self._logits(self.posterior, x)
        if isinstance(mean, jax.core.Tracer):  # inside the user's jit: no value to check
            return mean, cov
        bad = int(jnp.sum(~jnp.isfinite(mean)) + jnp.sum(~jnp.isfinite(cov)))
        if bad:
            raise ValueError(f"the logit Gaussian at x holds {bad} values that are not finite: check x and the "
                             "feature function")
        return mean, cov

    def predict(self, x, method: str = "bridge_zero_sum", *, num_samples: int = 1000,
                rng_key=None) -> ClassPredictive:
        """Class probabilities at ``x`` by ``method`` (:data:`~numpyro_lm.contrib.nn.predictive.PREDICTIVES`)."""
        if method not in PREDICTIVES:
            raise ValueError(f"method must be one of {PREDICTIVES}, not {method!r}")
        mean, cov = self.logits(x)
        return class_probabilities(mean, cov, method, num_samples=num_samples, rng_key=rng_key)
