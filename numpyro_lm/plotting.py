"""Overlay the marginals of two posteriors (LM and NUTS, or any two InferenceData).

Needs matplotlib (``pip install "numpyro_lm[plot]"``); nothing else in the package does.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

__all__ = ["plot_marginals"]


def _as_inference_data(obj):
    """``(InferenceData, matched posterior or None)`` from an LM fit or InferenceData."""
    if hasattr(obj, "to_inference_data") and hasattr(obj, "posterior") and hasattr(obj, "layout"):
        return obj.to_inference_data(log_likelihood=False), obj.posterior
    if hasattr(obj, "posterior"):
        return obj, None
    raise TypeError(f"expected a fitted LaplaceMatching or an arviz.InferenceData, not {type(obj).__name__}")


def coordinate_density(d, index: tuple, grid):
    """Density of coordinate ``index`` of a site distribution ``d`` on ``grid``, or ``None``.

    Elementwise distributions (Gamma, Beta, Normal with any batch shape, bounded ones) are
    evaluated coordinate by coordinate; a Dirichlet's coordinate is its Beta marginal
    ``Beta(alpha_i, sum(alpha) - alpha_i)``. Other multivariate families have no curve.
    """
    if isinstance(d, dist.Dirichlet):
        alpha = d.concentration
        a = alpha[index]
        rest = jnp.sum(alpha, axis=-1)[index[:-1]] - a
        return np.exp(np.asarray(dist.Beta(a, rest).log_prob(grid)))
    if isinstance(d, dist.Independent):
        d = d.base_dist
    if d.event_shape != ():
        return None
    value = jnp.broadcast_to(jnp.reshape(grid, (-1,) + (1,) * len(d.batch_shape)), grid.shape + d.batch_shape)
    log_prob = d.log_prob(value)
    return np.exp(np.asarray(log_prob[(slice(None),) + tuple(index)]))


def _panels(idata, var_names):
    for name in var_names:
        values = np.asarray(idata.posterior[name].values)
        shape = values.shape[2:]
        for index in np.ndindex(*shape):
            label = name if not shape else f"{name}[{', '.join(map(str, index))}]"
            yield name, index, label


def plot_marginals(
    first,
    second=None,
    *,
    var_names: Optional[Sequence[str]] = None,
    labels: Sequence[str] = ("LM", "NUTS"),
    bins: int = 40,
    max_panels: int = 30,
    ncols: int = 4,
    path: Optional[str] = None,
):
    """One panel per scalar coordinate: histograms of two posteriors, and the matched curve.

    :param first: a fitted :class:`~numpyro_lm.LaplaceMatching` (its matched family of
        each coordinate is drawn as a curve) or an ``arviz.InferenceData``.
    :param second: another fit or ``InferenceData`` to overlay (e.g. NUTS), or ``None``.
    :param var_names: variables to show (default: those of ``first`` that ``second`` has
        too, latent sites only when ``first`` is an LM fit).
    :param labels: legend names of ``first`` and ``second``.
    :param int max_panels: show at most this many coordinates (the first ones).
    :param str path: save the figure there.
    :returns: the matplotlib ``Figure``.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError('plot_marginals needs matplotlib: pip install "numpyro_lm[plot]"') from None

    idata_a, matched = _as_inference_data(first)
    idata_b = None if second is None else _as_inference_data(second)[0]
    if var_names is None:
        names = [s.name for s in first.layout.sites] if matched is not None else list(idata_a.posterior.data_vars)
        if idata_b is not None:
            names = [n for n in names if n in idata_b.posterior]
        var_names = names
    panels = list(_panels(idata_a, var_names))[:max_panels]
    if not panels:
        raise ValueError(f"nothing to plot: no posterior variables among {list(var_names)}")
    ncols = min(ncols, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.4 * nrows), squeeze=False)
    for ax, (name, index, label) in zip(axes.ravel(), panels):
        a = np.asarray(idata_a.posterior[name].values)[(slice(None), slice(None)) + index].ravel()
        draws = [a]
        if idata_b is not None:
            draws.append(np.asarray(idata_b.posterior[name].values)[(slice(None), slice(None)) + index].ravel())
        lo, hi = np.percentile(np.concatenate(draws), [0.5, 99.5])
        edges = np.linspace(lo, hi, bins + 1)
        for x, lab, color in zip(draws, labels, ("C0", "C1")):
            ax.hist(x, bins=edges, density=True, alpha=0.45, color=color, label=lab)
        if matched is not None and name in matched:
            grid = np.linspace(lo, hi, 200)
            try:
                density = coordinate_density(matched[name], index, jnp.asarray(grid))
            except ValueError:  # e.g. a site whose support depends on another site
                density = None
            if density is not None:
                ax.plot(grid, density, color="C0", lw=1.5, label=f"{labels[0]} matched")
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    axes.ravel()[0].legend(fontsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
