"""The one stateful object of LM + GP: a fit of one data set, and its predictions.

``LMGP(kind).fit(inputs, y)`` makes the pseudo-observations (:func:`~numpyro_lm.contrib.gp.pseudo.pseudo_observations`),
fits the kernel's hyperparameters (by the labels' leave-one-out predictive,
:mod:`~numpyro_lm.contrib.gp.loo`, or the pseudo-observations' marginal likelihood,
:func:`~numpyro_lm.contrib.gp.regression.fit_hyperparameters`) and keeps both; ``predict(test_inputs)``
returns the latent Gaussian and the matched family at each test input. A failed ``fit`` leaves
the object as it was.
"""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple, Optional

import numpy as np

from ...checks.validation import check_count
from .blocks import fit_block_hyperparameters, predictive
from .loo import fit_by_leave_one_out
from .pseudo import BLOCK_KINDS, DATA_KINDS, PseudoObservations, pseudo_observations
from .refine import relinearise
from .regression import fit_hyperparameters, matched_predictive, rbf_kernel

__all__ = ["LMGP", "Prediction", "Choices", "SEARCHES", "default_choices"]

SEARCHES = {"binary": ("loo", "exact"), "counts": ("loo", "exact"), "categorical": ("loo", "exact", "diagonal"),
            "covariance": ("diagonal", "exact")}
"""Data kind -> the objectives its hyperparameters can maximise: ``"loo"`` the data's
leave-one-group-out predictive (:mod:`~numpyro_lm.contrib.gp.loo`), ``"exact"`` the pseudo-observations'
marginal likelihood, ``"diagonal"`` that of the blocks' diagonals (:mod:`~numpyro_lm.contrib.gp.blocks`)."""

NEWTON_STEPS = 10
"""Newton steps taken by default after a marginal-likelihood search (5-8 reached a change of
1e-4 on the benchmark's data)."""


class Choices(NamedTuple):
    """What a fit used: the kernel ``search`` and the number of ``newton_steps``."""

    search: str
    newton_steps: int


def default_choices(pseudo: PseudoObservations, search: Optional[str] = None,
                    newton_steps: Optional[int] = None) -> Choices:
    """The search and Newton steps for these pseudo-observations where the user left them out.

    As measured in the LM + GP benchmark:

    - labels (binary, categorical) where every group is one point: ``"loo"``, no Newton steps.
      The pseudo-observations' evidence picked amplitudes that left the class probabilities
      underconfident and 2-6 points less accurate (breast cancer, wine); the leave-one-out
      search, which scores the held-out point as a test point is scored, matched the full
      latent GP.
    - labels in larger groups (k-means clusters): ``"exact"`` and :data:`NEWTON_STEPS`.
      Leaving a whole cluster out is harder than the test points' task (50 groups of breast
      cancer: accuracy 0.923 against 0.964); the Newton steps make the evidence's
      prediction the Laplace GP's (NLL 0.20 -> 0.12).
    - counts: ``"exact"`` (``"loo"`` over 100 k-means groups: RMSE 0.22 against 0.16) and
      Newton steps, which remove the bias of pooled skewed sites (1000 single counts: RMSE
      0.66 and 12 % coverage without, 0.17 and 94 % with).
    - covariances: ``"diagonal"`` (no data-level predictive here) and Newton steps (235 months:
      67 % of the true entries within 2 SD without, 94 % with).

    Newton steps left out default to :data:`NEWTON_STEPS` after a marginal-likelihood search
    and to none after ``"loo"``.
    """
    if search is None:
        single = pseudo.kind in ("binary", "categorical") and np.all(pseudo.size == 1)
        search = "loo" if single else ("diagonal" if pseudo.kind == "covariance" else "exact")
    if newton_steps is None:
        newton_steps = 0 if search == "loo" else NEWTON_STEPS
    return Choices(search, int(newton_steps))


_CONVERGED = 1e-3  # the largest change of the posterior mean in the last Newton step, in basis units


class Prediction(NamedTuple):
    """At each test input: the latent Gaussian (``mean``, ``variance``, in the family's basis;
    for categories and covariances a vector and a covariance block), the matched family
    (``distribution``: Beta over the probability, Gamma over the rate, Dirichlet over the class
    probabilities, inverse Wishart over the covariance matrix) and its mean (``expected``: the
    class-1 probability, the expected count, the class probabilities, the covariance matrix)."""

    mean: np.ndarray
    variance: np.ndarray
    distribution: object
    expected: np.ndarray


class LMGP:
    """LM + GP for binary labels, counts, categories or covariances (``kind``).

    :param kind: the data kind (:data:`~numpyro_lm.contrib.gp.pseudo.DATA_KINDS`).
    :param eps: the conjugate prior's weight (default :data:`~numpyro_lm.contrib.gp.pseudo.EPS`).
    :param kernel: ``KernelParams -> tinygp kernel`` (default the ARD squared exponential).
    :param num_steps, learning_rate: the Adam search of the hyperparameters.
    :param num_classes: for ``"categorical"`` with category indices: ``K`` (default: the largest
        index + 1).
    :param output_kernel: for ``"categorical"`` and ``"covariance"``: the ``D x D`` output kernel
        ``B`` of the product kernel over the pseudo-observations' coordinates (default the
        identity; :mod:`~numpyro_lm.contrib.gp.blocks`).
    :param ard: one lengthscale per input dimension (default) or one shared by all (``False``: for
        many inputs of one kind, such as pixels, where per-dimension lengthscales overfit).
    :param search: the objective the hyperparameters maximise (:data:`SEARCHES`; default
        :func:`default_choices`, from the kind and the groups): ``"loo"``, the data's leave-one-group-out log predictive
        probability (labels and counts), ``"exact"``, the pseudo-observations' marginal
        likelihood, or ``"diagonal"`` (vector kinds), that of the blocks' diagonals. With few
        large groups (k-means clusters), ``"loo"`` scores predicting a whole cluster from the
        others, harder than the test points' task; ``"exact"`` can then do better.
    :param newton_steps: Newton steps that re-expand the pseudo-observations at the GP's posterior
        mean, after the search (:mod:`~numpyro_lm.contrib.gp.refine`; default :func:`default_choices`):
        ``0`` is the thesis' LM + GP; enough steps make its
        predictions the Laplace GP's. ``fit`` warns if the last step still moved the mean by
        more than 1e-3.

    After ``fit``: ``pseudo`` (Laplace Matching's pseudo-observations), ``sites`` (what the GP
    conditions on: ``pseudo`` re-expanded by the Newton steps, or ``pseudo`` itself), ``params``
    (the hyperparameters), ``trace`` (the search's objective per step) and ``choices`` (the
    search and Newton steps used).
    """

    def __init__(self, kind: str, *, eps: Optional[float] = None, kernel: Callable = rbf_kernel,
                 num_steps: int = 100, learning_rate: float = 0.1, num_classes: Optional[int] = None,
                 output_kernel=None, search: Optional[str] = None, ard: bool = True,
                 newton_steps: Optional[int] = None):
        if kind not in DATA_KINDS:
            raise ValueError(f"kind must be one of {sorted(DATA_KINDS)}, not {kind!r}")
        check_count(num_steps, "num_steps", minimum=0)
        if newton_steps is not None:
            check_count(newton_steps, "newton_steps", minimum=0)
        if search is not None and search not in SEARCHES[kind]:
            raise ValueError(f"search must be one of {SEARCHES[kind]} for {kind!r} data, not {search!r}")
        if output_kernel is not None and kind not in BLOCK_KINDS:
            raise ValueError(f"output_kernel is for the kinds with vector pseudo-observations {BLOCK_KINDS}, "
                             f"not {kind!r}")
        self.kind, self.eps, self.kernel = kind, eps, kernel
        self.num_steps, self.learning_rate = num_steps, float(learning_rate)
        self.num_classes, self.output_kernel, self.search, self.ard = num_classes, output_kernel, search, ard
        self.newton_steps = newton_steps
        self.pseudo = self.sites = self.params = self.trace = self.choices = None

    def fit(self, inputs, y, labels=None) -> "LMGP":
        """Pseudo-observations of ``(inputs, y)`` grouped by ``labels`` (default: shared inputs),
        the hyperparameters that maximise ``search``'s objective, then ``newton_steps`` re-expansions
        of the pseudo-observations at them."""
        pseudo = pseudo_observations(inputs, y, self.kind, labels, self.eps, self.num_classes)
        choices = default_choices(pseudo, self.search, self.newton_steps)
        options = dict(kernel=self.kernel, num_steps=self.num_steps, learning_rate=self.learning_rate, ard=self.ard)
        if choices.search == "loo":
            params, trace = fit_by_leave_one_out(pseudo, output_kernel=self.output_kernel, **options)
        elif self.kind in BLOCK_KINDS:
            params, trace = fit_block_hyperparameters(pseudo, output_kernel=self.output_kernel, search=choices.search,
                                                      **options)
        else:
            params, trace = fit_hyperparameters(pseudo, **options)
        if not np.all(np.isfinite(np.asarray(trace[-1:]))):
            raise FloatingPointError(f"the {choices.search!r} objective of the hyperparameters is not finite after "
                                     "the search: lower learning_rate, or rescale the inputs")
        sites = pseudo
        if choices.newton_steps:
            sites, change = relinearise(pseudo, params, num_steps=choices.newton_steps,
                                        output_kernel=self.output_kernel, kernel=self.kernel)
            change = np.asarray(change)
            if not (np.all(np.isfinite(sites.mean)) and np.all(np.isfinite(sites.noise))):
                raise FloatingPointError("the Newton steps from the pseudo-observations diverged: set "
                                         "newton_steps=0 (Laplace Matching's sites alone)")
            if change[-1] > _CONVERGED:
                warnings.warn(f"the last of {choices.newton_steps} Newton steps still moved the posterior mean by "
                              f"{change[-1]:.2g}: raise newton_steps", RuntimeWarning, stacklevel=2)
        self.pseudo, self.sites, self.params, self.trace = pseudo, sites, params, np.asarray(trace)
        self.choices = choices
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
        mean, variance = predictive(self.params, self.sites, test, output_kernel=self.output_kernel,
                                    kernel=self.kernel)
        distribution = matched_predictive(self.kind, mean, variance)
        return Prediction(np.asarray(mean), np.asarray(variance), distribution, np.asarray(distribution.mean))
