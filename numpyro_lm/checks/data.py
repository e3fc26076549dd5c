"""What is wrong with the observed data, named: the cause behind a fit that failed.

A NaN or an infinity among the observations, or a value outside the likelihood's support
(a count of -1, a Bernoulli label of 2, a negative value under a Gamma), makes the log
density not finite, or silently meaningless, wherever the latent values are. The fit then
fails with an error about the log density or the curvature; :func:`observed_data_problem`
reads the observed sites of one run of the model and says which site, how many values,
where, and what to do, so that :meth:`numpyro_lm.LaplaceMatching.run` can raise that
instead. It is run on failure only (a fit that succeeds costs nothing more).
"""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np
from numpyro.distributions import MaskedDistribution

from ..core.starts import origin_point

__all__ = ["ObservedDataError", "observed_data_problem"]


class ObservedDataError(ValueError):
    """The observed data cannot be evaluated by the model (non-finite or outside the support)."""


def _family(fn) -> str:
    while hasattr(fn, "base_dist"):  # Expanded, Independent, Masked: the distribution the user wrote
        fn = fn.base_dist
    return type(fn).__name__


def _positions(bad: np.ndarray, name: str, limit: int = 3) -> str:
    where = np.argwhere(bad)[:limit]
    text = ", ".join(f"{name}[{', '.join(str(int(i)) for i in index)}]" if index.size else name for index in where)
    return text + (" ..." if bad.sum() > limit else "")


def observed_data_problem(info, args, kwargs) -> Optional[ObservedDataError]:
    """The :class:`ObservedDataError` for the first observed site with non-finite values or
    values outside its distribution's support (entries a mask drops are not counted), or
    ``None`` where the data are fine or cannot be read."""
    try:
        trace = info.trace(jax.numpy.asarray(origin_point(info.layout), jax.numpy.result_type(float)), args, kwargs)
        sites = [(name, site) for name, site in trace.items() if site["type"] == "sample" and site["is_observed"]]
        for name, site in sites:
            value, fn = np.asarray(site["value"]), site["fn"]
            if not np.issubdtype(value.dtype, np.number):
                continue
            kept = np.ones(value.shape, bool)
            if isinstance(fn, MaskedDistribution) and not isinstance(fn._mask, bool):
                mask = np.asarray(fn._mask, bool)
                kept = np.broadcast_to(mask.reshape(mask.shape + (1,) * (value.ndim - mask.ndim)), value.shape)
            bad = kept & ~np.isfinite(value)
            if bad.any():
                kinds = " or ".join(k for k, f in (("NaN", np.isnan), ("infinite", np.isinf)) if (f(value) & kept).any())
                return ObservedDataError(
                    f"observed site {name!r}: {int(bad.sum())} of {value.size} values are {kinds} (at "
                    f"{_positions(bad, name)}). Drop them from the data, or mark them missing with "
                    f"numpyro.sample({name!r}, ..., obs=..., obs_mask=mask) (False where missing).")
            inside = np.asarray(fn.support(value), bool)
            inside = np.broadcast_to(inside.reshape(inside.shape + (1,) * (value.ndim - inside.ndim)), value.shape)
            outside = kept & ~inside
            if outside.any():
                first = tuple(int(i) for i in np.argwhere(outside)[0])
                return ObservedDataError(
                    f"observed site {name!r}: {int(outside.sum())} of {value.size} values lie outside the support "
                    f"of its {_family(fn)} likelihood ({fn.support}), e.g. {_positions(outside, name, 1)} = "
                    f"{value[first].item()!r}. Check the data (its coding, units or sign) or the likelihood.")
    except Exception:  # noqa: BLE001 - a diagnosis that cannot run leaves the original error
        return None
    return None
