"""Where a model's mode search starts: next to the basis origin (:func:`origin_point`), and for
small models also at points spread over the basis (:func:`spread_points`), so that a second
mode is seen (:data:`DEFAULT_STARTS` searches up to :data:`MULTI_START_MAX_DIM` coordinates)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..families.bases import get_basis

__all__ = ["DEFAULT_STARTS", "MULTI_START_MAX_DIM", "default_starts", "spread_points", "spread_mask", "ORIGIN_OFFSET", "origin_point"]


DEFAULT_STARTS = 4
"""Joint mode searches by default (``num_starts=None``), for models of at most
:data:`MULTI_START_MAX_DIM` coordinates: a local mode is otherwise silent (its draws'
importance weights cannot see mass they never reach)."""
MULTI_START_MAX_DIM = 200
"""Largest model searched from several points by default (each search costs dense Newton steps)."""


def default_starts(dim: int, num_starts: Optional[int] = None) -> int:
    """``num_starts``, or where it is ``None`` the default for a model of ``dim`` coordinates."""
    if num_starts is not None:
        return num_starts
    return DEFAULT_STARTS if dim <= MULTI_START_MAX_DIM else 1


def spread_points(num: int, dim: int, half_width: float = 2.0) -> np.ndarray:
    r"""``(num, dim)`` points spread evenly over ``(-half_width, half_width)^dim``: the
    Kronecker (R_d) low-discrepancy sequence, :math:`u_i = \{1/2 + i\,\alpha\}` with
    :math:`\alpha_j = \varphi_d^{-j}` and :math:`\varphi_d` the root of
    :math:`x^{d+1} = x + 1` (Roberts 2018, "The unreasonable effectiveness of quasirandom
    sequences"). Deterministic, and no two points share a coordinate."""
    phi = 2.0
    for _ in range(60):  # fixed-point iteration for the generalised golden ratio
        phi = (1.0 + phi) ** (1.0 / (dim + 1))
    alpha = phi ** -np.arange(1, dim + 1)
    u = np.mod(0.5 + np.arange(1, num + 1)[:, None] * alpha[None, :], 1.0)
    return half_width * (2.0 * u - 1.0)


def spread_mask(layout) -> np.ndarray:
    """The coordinates multi-start spreads: those of one-to-one bases (see :class:`~numpyro_lm.families.bases.Basis`)."""
    mask = np.zeros(layout.size, bool)
    for site in layout.sites:
        mask[site.offset : site.offset + site.size] = get_basis(site.basis).one_to_one
    return mask


ORIGIN_OFFSET = 1e-3
"""How far from the basis origin the default search starts (basis units)."""


def origin_point(layout) -> np.ndarray:
    """The default starting point: the basis origin moved by :data:`ORIGIN_OFFSET` times a
    :func:`spread_points` direction (one-to-one bases only). Exactly at the origin a GLMM's
    linear predictor is exactly 0, where numpyro's ``Bernoulli(logits=...)`` has the wrong
    gradient (``binary_cross_entropy_with_logits``' ``clip`` and ``abs`` at their kinks: 1
    instead of 0.5 for ``log_prob(1)``), and the first Newton step goes astray."""
    return ORIGIN_OFFSET * spread_points(1, layout.size)[0] * spread_mask(layout)
