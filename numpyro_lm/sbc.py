r"""Simulation-based calibration in one call: can Laplace Matching be trusted on this model?

Talts, Betancourt, Simpson, Vehtari and Gelman (2018, "Validating Bayesian inference
algorithms with simulation-based calibration", arXiv:1804.06788): draw parameters
:math:`\tilde\theta \sim p(\theta)` and data :math:`\tilde y \sim p(y \mid \tilde\theta)` from the
model's prior predictive, approximate the posterior given :math:`\tilde y`, and rank
:math:`\tilde\theta` among ``L`` posterior draws. Over data sets the ranks are uniform on
:math:`\{0, \dots, L\}` exactly when the approximation is calibrated; too wide posteriors
pile the ranks in the middle, too narrow ones at the ends, biased ones to one side.

:func:`sbc` fits all ``num_datasets`` simulated data sets at once
(:meth:`~numpyro_lm.LaplaceMatching.run_many`: one compiled, vmapped program) and tests each
coordinate's ranks with the simultaneous confidence band of their empirical CDF (Säilynoja,
Bürkner and Vehtari 2022, "Graphical test for discrete uniformity and its applications in
goodness-of-fit evaluation and multiple sample comparison", Statistics and Computing 32:32;
the band from ``arviz``), at a family-wise level over the coordinates (Bonferroni). A
:math:`\chi^2` test of the binned ranks is reported beside it. :meth:`SBCResult.plot` draws
the ECDF differences with their band, or the rank histograms.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple, Optional

import jax
import numpy as np
from numpyro import handlers
from numpyro.infer import Predictive
from scipy import stats

from .checks.validation import check_count, check_model, check_rng_key
from .core.trace import observed_site_names
from .inference_data import unobserved
from .matching import LaplaceMatching
from .runtime.programs import FAST_COMPILE

__all__ = ["SBCResult", "sbc", "rank_ecdf_band"]


class _Conditioned:
    """The model with its observed sites set to simulated data (keyword ``_sbc_data``)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, _sbc_data, **kwargs):
        return handlers.condition(self.model, data=_sbc_data)(*args, **kwargs)


def rank_ecdf_band(num_ranks: int, num_datasets: int, prob: float):
    """``(eval points k = 0..L-1, lower, upper)``: the simultaneous ``prob`` band of the ECDF
    of ``num_datasets`` ranks uniform on ``{0, ..., L}`` (``L + 1 = num_ranks``), evaluated at ``k``."""
    from arviz.stats.ecdf_utils import ecdf_confidence_band

    points = np.arange(num_ranks - 1)
    cdf = (points + 1.0) / num_ranks
    lower, upper = ecdf_confidence_band(num_datasets, points, cdf, prob=prob, method="optimized")
    return points, lower, upper


class SBCResult(NamedTuple):
    """The outcome of :func:`sbc`.

    :param ranks: ``{site: (n, ...)}`` ranks in ``0..num_draws`` of the n data sets whose fit succeeded.
    :param truths: ``{site: (num_datasets, ...)}`` the parameters the data were simulated from.
    :param uniform: ``{site: bool per coordinate}``: the ranks' ECDF stays inside the band.
    :param chi2_pvalue: ``{site: per coordinate}`` p-value of a chi-square test of binned ranks.
    :param band: ``(eval points, lower, upper)`` of the ECDF band (:func:`rank_ecdf_band`).
    :param failed: indices of the data sets whose fit failed (left out of the ranks).
    :param pareto_k: ``(num_datasets,)`` PSIS k-hat of each fit.
    """

    ranks: dict
    truths: dict
    uniform: dict
    chi2_pvalue: dict
    band: tuple
    num_draws: int
    num_datasets: int
    prob: float
    failed: np.ndarray
    pareto_k: np.ndarray

    @property
    def passed(self) -> bool:
        """Whether every coordinate's ranks pass (family-wise level ``prob``)."""
        return all(bool(np.all(u)) for u in self.uniform.values())

    def summary(self) -> str:
        """One line per site: its worst coordinate's test outcome and chi-square p-value."""
        lines = [f"SBC over {self.num_datasets - len(self.failed)} of {self.num_datasets} simulated data sets, "
                 f"{self.num_draws} draws each; ECDF band at family-wise level {self.prob}:"]
        for site, ok in self.uniform.items():
            ok = np.atleast_1d(ok)
            p = np.atleast_1d(self.chi2_pvalue[site])
            lines.append(f"  {site:<20} {'uniform' if ok.all() else 'NOT uniform'} "
                         f"({int((~ok).sum())} of {ok.size} coordinates outside), min chi2 p-value {p.min():.3g}")
        lines.append("calibrated" if self.passed else "MISCALIBRATED: Laplace Matching's posterior is off on this "
                     "model; see plot() and try hyper=, refine= or NUTS.")
        return "\n".join(lines)

    def __repr__(self):
        return self.summary()

    def plot(self, kind: str = "ecdf", sites=None, axes=None):
        """ECDF differences (``kind="ecdf"``: ECDF of the fractional ranks minus the uniform CDF,
        every coordinate of a site in one panel, with the simultaneous band) or rank
        histograms (``kind="hist"``, with the 99 % range of a uniform bin count). Needs matplotlib."""
        import matplotlib.pyplot as plt

        sites = list(self.ranks) if sites is None else list(sites)
        if axes is None:
            cols = min(3, len(sites))
            rows = -(-len(sites) // cols)
            fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
            axes = axes.ravel()
        fig = np.ravel(axes)[0].figure
        num_ranks = self.num_draws + 1
        for ax, site in zip(np.ravel(axes), sites):
            ranks = self.ranks[site].reshape(self.ranks[site].shape[0], -1)
            bad = ~np.atleast_1d(self.uniform[site]).ravel()
            if kind == "ecdf":
                points, lower, upper = self.band
                x = (points + 1.0) / num_ranks
                ax.fill_between(x, lower - x, upper - x, color="0.85", step="post", label=f"{self.prob:.0%} band")
                for j in range(ranks.shape[1]):
                    ecdf = np.mean(ranks[:, j][:, None] <= points[None, :], axis=0)
                    ax.step(x, ecdf - x, where="post", lw=1.0, color="C3" if bad[j] else "C0", alpha=0.8)
                ax.axhline(0.0, color="k", lw=0.5)
                ax.set_xlabel("fractional rank")
                ax.set_ylabel("ECDF - uniform")
            elif kind == "hist":
                bins = min(20, num_ranks)
                n = ranks.shape[0]
                low, high = stats.binom(n, 1.0 / bins).ppf([0.005, 0.995])
                ax.axhspan(low, high, color="0.85")
                for j in range(ranks.shape[1]):
                    ax.hist(ranks[:, j], bins=np.linspace(0, num_ranks, bins + 1), histtype="step",
                            color="C3" if bad[j] else "C0")
                ax.set_xlabel("rank")
            else:
                raise ValueError(f'kind must be "ecdf" or "hist", not {kind!r}')
            ax.set_title(f"{site}{'' if not bad.any() else f' ({int(bad.sum())} of {bad.size} outside)'}")
        for ax in np.ravel(axes)[len(sites):]:
            ax.set_visible(False)
        fig.tight_layout()
        return fig


def _chi2_pvalues(ranks: np.ndarray, num_ranks: int) -> np.ndarray:
    """Per coordinate: chi-square test of the ranks in ``bins`` equal bins (at least 5 expected per bin)."""
    n = ranks.shape[0]
    bins = int(max(2, min(20, n // 5, num_ranks)))
    edges = np.linspace(0, num_ranks, bins + 1)
    flat = ranks.reshape(n, -1)
    counts = np.stack([np.histogram(flat[:, j], bins=edges)[0] for j in range(flat.shape[1])])
    expected = n * np.diff(np.ceil(edges)) / num_ranks  # the integer ranks in [edge, next edge)
    p = stats.chisquare(counts, expected, axis=1).pvalue
    return p.reshape(ranks.shape[1:])


def sbc(model, *args, num_datasets: int = 200, rng_key=None, num_samples: int = 100, prob: float = 0.95,
        lm_options: Optional[dict] = None, **kwargs) -> SBCResult:
    """Simulation-based calibration of Laplace Matching on ``model(*args, **kwargs)`` (module docstring).

    The model is called with ``args``/``kwargs`` as for a fit; its observed sites (and their
    shapes) come from that call, and their values are replaced by simulations.

    :param int num_datasets: simulated data sets, all fitted in one ``run_many`` call (under
        ``jax.distributed``, split across the processes, each ending with every data set's ranks:
        :mod:`numpyro_lm.approximations.across_processes`).
    :param rng_key: PRNG key (default ``PRNGKey(0)``).
    :param int num_samples: ``L``, posterior draws per data set (ranks in ``0..L``).
    :param float prob: family-wise level of the uniformity test over all coordinates.
    :param dict lm_options: options of :class:`~numpyro_lm.LaplaceMatching` (not ``num_samples``).
    :returns: :class:`SBCResult`; ``print(result)`` tells whether the model is calibrated,
        ``result.plot()`` shows where it is not.
    """

    check_model(model)
    if rng_key is not None:
        check_rng_key(rng_key)
    check_count(num_datasets, "num_datasets")
    check_count(num_samples, "num_samples")

    key_prior, key_fit = jax.random.split(jax.random.PRNGKey(0) if rng_key is None else rng_key)
    trace = handlers.trace(handlers.seed(model, 0)).get_trace(*args, **kwargs)
    observed = observed_site_names(trace)
    if not observed:
        raise ValueError("sbc needs observed sites to simulate: call it with the model's data arguments (their "
                         "values are replaced by simulations; only their shapes matter).")
    try:
        prior = Predictive(unobserved(model), num_samples=num_datasets)(key_prior, *args, **kwargs)
    except NotImplementedError as e:
        raise ValueError(f"sbc draws parameters from the prior, and this model's prior cannot be sampled "
                         f"(an ImproperUniform site?): {e}. Give every latent site a proper prior.") from None
    data = {name: prior[name] for name in observed}
    flags = (jax.tree.map(lambda _: False, (args, kwargs)), jax.tree.map(lambda _: True, data))
    leaves = jax.tree.leaves((args, {**kwargs, "_sbc_data": data}))
    marks = jax.tree.leaves((flags[0][0], {**flags[0][1], "_sbc_data": flags[1]}))
    axes = tuple(m for leaf, m in zip(leaves, marks) if isinstance(leaf, (jax.Array, np.ndarray, np.generic)))
    options = {"progress_bar": False, **(lm_options or {}), "num_samples": num_samples}
    lm = LaplaceMatching(_Conditioned(model), **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # failed fits are reported in the result
        # one call: compile fast (the batch programs' run time is small next to compiling them)
        lm.run_many(key_fit, *args, _sbc_data=data, batch_axes=axes, on_failure="warn", **kwargs,
                    compiler_options=FAST_COMPILE if options.get("compiler_options", "auto") == "auto"
                    else options["compiler_options"])
        d = lm.diagnostics()
    failed = np.flatnonzero(~(np.asarray(d["finite"]) & np.asarray(d["positive_definite"])))
    ok = np.setdiff1d(np.arange(num_datasets), failed)
    samples = lm.get_samples()
    sites = [s for s in samples if s in prior and s not in observed]
    ranks, uniform, pvalues = {}, {}, {}
    num_coords = sum(int(np.prod(np.shape(prior[s])[1:], dtype=int)) for s in sites)
    band = rank_ecdf_band(num_samples + 1, len(ok), 1.0 - (1.0 - prob) / max(num_coords, 1))
    points, lower, upper = band
    for s in sites:
        draws, truth = np.asarray(samples[s])[ok], np.asarray(prior[s])[ok]
        r = np.sum(draws < truth[:, None], axis=1)
        ranks[s] = r
        flat = r.reshape(len(ok), -1)
        ecdf = np.mean(flat[:, None, :] <= points[None, :, None], axis=0)  # (points, coords)
        inside = np.all((ecdf >= lower[:, None] - 1e-12) & (ecdf <= upper[:, None] + 1e-12), axis=0)
        uniform[s] = inside.reshape(r.shape[1:])
        pvalues[s] = _chi2_pvalues(r, num_samples + 1)
    return SBCResult(ranks, {s: np.asarray(prior[s]) for s in sites}, uniform, pvalues, band, num_samples,
                     num_datasets, prob, failed, np.asarray(d["pareto_k"]))
