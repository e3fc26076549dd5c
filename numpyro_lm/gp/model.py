"""The one stateful object of LM + GP: a fit of one data set, and its predictions.

``LMGP(kind).fit(inputs, y)`` makes the pseudo-observations (:func:`~numpyro_lm.gp.pseudo.pseudo_observations`),
fits the kernel's hyperparameters by marginal likelihood
(:func:`~numpyro_lm.gp.regression.fit_hyperparameters`) and keeps both; ``predict(test_inputs)``
returns the latent Gaussian and the matched family at each test input. A failed ``fit`` leaves
the object as it was.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np

from ..validation import check_count
from .pseudo import DATA_KINDS, pseudo_observations
from .regression import fit_hyperparameters, latent_predictive, matched_predictive, rbf_kernel

__all__ = ["LMGP", "Prediction"]


class Prediction(NamedTuple):
    """At each test input: the latent Gaussian (``mean``, ``variance``, in the family's basis),
    the matched family (``distribution``: Beta over the probability, Gamma over the rate) and
    its mean (``expected``: the class-1 probability, or the expected count)."""

    mean: np.ndarray
    variance: np.ndarray
    distribution: object
    expected: np.ndarray


class LMGP:
    """LM + GP for binary labels (``kind="binary"``) or counts (``kind="counts"``).

    :param kind: the data kind (:data:`~numpyro_lm.gp.pseudo.DATA_KINDS`).
    :param eps: the conjugate prior's weight (default :data:`~numpyro_lm.gp.pseudo.EPS`).
    :param kernel: ``KernelParams -> tinygp kernel`` (default the ARD squared exponential).
    :param num_steps, learning_rate: the Adam search of the hyperparameters.
    """

    def __init__(self, kind: str, *, eps: Optional[float] = None, kernel: Callable = rbf_kernel,
                 num_steps: int = 300, learning_rate: float = 0.05):
        if kind not in DATA_KINDS:
            raise ValueError(f"kind must be one of {sorted(DATA_KINDS)}, not {kind!r}")
        check_count(num_steps, "num_steps", minimum=0)
        self.kind, self.eps, self.kernel = kind, eps, kernel
        self.num_steps, self.learning_rate = num_steps, float(learning_rate)
        self.pseudo = self.params = self.trace = None

    def fit(self, inputs, y, labels=None) -> "LMGP":
        """Pseudo-observations of ``(inputs, y)`` grouped by ``labels`` (default: shared inputs),
        and the hyperparameters that maximise their marginal likelihood."""
        pseudo = pseudo_observations(inputs, y, self.kind, labels, self.eps)
        params, trace = fit_hyperparameters(pseudo, kernel=self.kernel, num_steps=self.num_steps,
                                            learning_rate=self.learning_rate)
        if not np.all(np.isfinite(np.asarray(trace[-1:]))):
            raise FloatingPointError("the marginal likelihood of the hyperparameters is not finite after the "
                                     "search: lower learning_rate, or rescale the inputs")
        self.pseudo, self.params, self.trace = pseudo, params, np.asarray(trace)
        return self

    def predict(self, test_inputs) -> Prediction:
        """The latent Gaussian and the matched family at each test input."""
        if self.pseudo is None:
            raise RuntimeError("call fit() first")
        test = np.asarray(test_inputs, np.float64)
        test = test[:, None] if test.ndim == 1 else test
        if test.shape[1] != self.pseudo.inputs.shape[1]:
            raise ValueError(f"test_inputs have {test.shape[1]} dimensions, the training inputs "
                             f"{self.pseudo.inputs.shape[1]}")
        mean, variance = latent_predictive(self.params, self.pseudo, test, self.kernel)
        distribution = matched_predictive(self.kind, mean, variance)
        return Prediction(np.asarray(mean), np.asarray(variance), distribution, np.asarray(distribution.mean))
