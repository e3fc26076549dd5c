"""A large nested fit's verdict with its scalar blocks integrated out (:mod:`numpyro_lm.marginal.collapsed`).

Which fits have such blocks (:func:`find_blocks`), how many draws the verdict takes
(:func:`collapsed_draws`), the two programs behind its weights (the model's value at each draw's
blocks' centres in float64, the blocks' quadrature from float32 gradients: :func:`collapsed_weights`)
and the blocks' sites' shifts (:func:`block_shifts`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ...marginal.block_terms import BlockEntries, block_log_density
from ...marginal.collapsed import VERDICT_NODES, block_constants, collapsed_quadrature, collapsed_value
from ...marginal.laplace_marginal import scalar_blocks
from ...marginal.quadrature import as_slice
from ...runtime.programs import long_loop
from ..joint_fit import ROW_BUDGET, rows_at_once
from .design import NestedDesign
from .mixture import MixtureDraws, block_proposal, mixture_variances

__all__ = ["Blocks", "find_blocks", "COLLAPSED_DRAWS", "COLLAPSED_WORK", "COLLAPSED_ROWS", "QUADRATURE_NUMBERS", "quadrature_rows",
           "collapsed_draws", "collapsed_weights", "block_shifts"]


class Blocks(NamedTuple):
    """A nested fit's scalar blocks, integrated out in its verdict: their positions in ``x``
    (``local (J,)``), the globals' (``glob (G,)``), the sites they make up, and which of the
    model's log-probability entries are each block's (``entries``: :func:`~numpyro_lm.marginal.block_terms.scalar_block_entries`)."""

    local: np.ndarray
    glob: np.ndarray
    sites: frozenset
    entries: Optional[BlockEntries] = None


def find_blocks(layout, hessian, x_index, gaussian_cols, entries=None) -> "Blocks | None":
    """The :class:`Blocks` of a structured nested fit (``hessian`` its conditional fits' strategy over
    the coordinates ``x_index``) whose latent field is one scalar per plate entry, every one of them
    drawn from its Gaussian conditional (``gaussian_cols``) and every site either all blocks or none;
    else ``None`` (the joint weights judge it). ``entries``: :func:`~numpyro_lm.marginal.block_terms.scalar_block_entries`'."""
    if not scalar_blocks(hessian) or not np.all(gaussian_cols):
        return None
    local = np.asarray(hessian.structure.local_index[:, 0])
    is_local = np.zeros(layout.size, bool)
    is_local[np.asarray(x_index)[local]] = True
    sites = set()
    for site in layout.sites:
        part = is_local[site.offset:site.offset + site.size]
        if part.any() and not part.all():
            return None
        if part.any():
            sites.add(site.name)
    return Blocks(local.astype(np.int32), np.asarray(hessian.structure.global_index, np.int32), frozenset(sites),
                  entries)


COLLAPSED_DRAWS = (200, 1000)
"""Fewest and most draws behind a verdict with the blocks integrated out: its weights live on the
few hyperparameters and globals (a k-hat from 200 draws is judged against 0.57, from 1000 against 0.67)."""
COLLAPSED_WORK = 4_000_000
"""Numbers (latent and observed, times draws) the collapsed verdict evaluates, within :data:`COLLAPSED_DRAWS`.
Over 40 keys each, 0 of 40 verdicts untrusted with 20 10^6 and with 4 10^6: the 1000-group
logistic GLMM of ``benchmarks/scale.py`` (952 draws: k-hat median 0.19, at most 0.25 in 6 keys,
warm call 2.0 s; 200 draws: median 0.19, 90 % 0.44, at most 0.54 against 0.57, warm call
0.74 s) and the 5000-point Poisson random effect of ``benchmarks/inla.py`` (1000 draws: k-hat
at most 0.46, warm call 0.54 s; 399 draws: at most 0.39, 0.33 s)."""
COLLAPSED_ROWS = 20
"""Most draws whose quadrature runs at once (vmapped, each with its gradients at once)."""
QUADRATURE_NUMBERS = 2**20
"""Numbers (the model's latent and observed numbers, times the draws' gradients) the verdict's
quadrature evaluates at once (:func:`quadrature_rows`): what a 2-core CPU's caches hold. Its
200 draws, each arm alone in one process (s; rows of 2 / 6 / 20 draws): the Poisson random
effect of ``benchmarks/inla.py`` at N = 5 000 0.136 / 0.069 / 0.065, at N = 25 000 0.274 /
0.234 / 0.352, at N = 100 000 (1, 2, 6 draws) 2.14 / 1.09 / 1.55; the logistic GLMM of
``benchmarks/scale.py`` with 1000 groups 0.214 / 0.279 / 0.350, with 10^4 groups (1, 2, 6, 12)
10.3 / 4.20 / 4.13 / 4.26. Those take 8, 2, 2, 3 and 2 draws at once here."""


_SLOPES = 3 * VERDICT_NODES - 2  # the model gradients of one draw's quadrature


def quadrature_rows(numbers: int, num_samples: int) -> int:
    """Draws whose quadrature runs at once (each with its 13 gradients at once):
    :data:`QUADRATURE_NUMBERS` over a draw's, within :data:`COLLAPSED_ROWS`, and at least two
    (one at a time ran at half to a third of the speed of two: the measurements above) unless two
    exceed eight times :data:`~numpyro_lm.approximations.joint_fit.ROW_BUDGET`'s memory.
    The 10^5-group GLMM (2.1 10^6 numbers) takes two: its verdict's 200 draws took 138-153 s one
    at a time, 47-55 s two at a time, and 134-140 s two at a time with their gradients one after
    another."""
    if 2 * _SLOPES * numbers > 8 * ROW_BUDGET:
        return 1
    return int(min(num_samples, COLLAPSED_ROWS, max(2, QUADRATURE_NUMBERS // (_SLOPES * numbers))))


def collapsed_draws(info, num_diagnostic_samples: int) -> int:
    """Draws behind the verdict of a nested fit with :class:`Blocks`: :data:`COLLAPSED_WORK` over the
    model's latent and observed numbers, within :data:`COLLAPSED_DRAWS` and at most ``num_diagnostic_samples``."""
    low, high = COLLAPSED_DRAWS
    numbers = info.size + info.layout.observed_size
    return int(min(num_diagnostic_samples, max(low, min(high, COLLAPSED_WORK // numbers))))


def _as_range(index: np.ndarray):
    """``(start, stop)`` where ``index`` is the contiguous range (:func:`~numpyro_lm.marginal.quadrature.as_slice`),
    else ``None``: hashable, a static argument of the verdict's programs."""
    index = as_slice(np.asarray(index))
    return (index.start, index.stop) if isinstance(index, slice) else None


def _blocks_and_proposal(ranges, x_index, local, glob, x_mean, x_slope, coupling, precision, schur_chol):
    """The blocks' flat coordinates (a slice where contiguous) and :func:`.mixture.block_proposal`."""
    flat_range, x_range = ranges
    local = local if x_range is None else slice(*x_range)
    flat_local = x_index[local] if flat_range is None else slice(*flat_range)
    return flat_local, block_proposal(x_index, local, glob, x_mean, x_slope, coupling, precision, schur_chol)


def _collapsed_value(info, rows, ranges, flat, *rest):
    """The float64 program of :func:`collapsed_weights`: the model at each draw's blocks' centres
    (``ranges``: the blocks' flat coordinates and positions in ``x`` as ``(start, stop)`` where contiguous)."""
    design, (point, offset), (args, kwargs) = rest[:-4], rest[-4:-2], rest[-2:]
    flat_local, proposal = _blocks_and_proposal(ranges, *design)
    return collapsed_value(lambda v: info.log_density(v, args, kwargs), flat, flat_local, proposal, (point, offset),
                           rows)


@long_loop  # 100 steps over 10^5 blocks (runtime.programs.NO_LIBRARY_KERNELS)
def _collapsed_quadrature(info, rows, ranges, entry_sites, flat, *rest):
    """The float32 program of :func:`collapsed_weights`: the blocks' quadrature (from each block's
    log-probability entries where ``entry_sites``, :class:`BlockEntries`' ``(sites, blocks)``, is
    given, their ids the last array)."""
    (args, kwargs), rest = rest[-2:], rest[:-2]
    ids, rest = (rest[-1], rest[:-1]) if entry_sites is not None else (None, rest)
    design, (point, offset) = rest[:-2], rest[-2:]
    flat_local, proposal = _blocks_and_proposal(ranges, *design)
    values = None if entry_sites is None else (
        lambda v: block_log_density(info.site_log_probs(v, args, kwargs), entry_sites[0], ids, entry_sites[1]))
    return collapsed_quadrature(lambda v: info.log_density(v, args, kwargs), flat, flat_local, proposal,
                                (point, offset), rows, values=values)


def collapsed_weights(call: Callable, info, design: NestedDesign, blocks: Blocks, made: MixtureDraws, flat,
                      num_samples: int):
    """``(log p, log q, each block's distance (J,))`` of the draws ``flat`` (device, ``made`` their
    mixture's record) over the hyperparameters and globals with the blocks integrated out
    (:mod:`numpyro_lm.marginal.collapsed`); ``call``: the result's
    :meth:`~numpyro_lm.approximations.result.Result.call`."""
    dtype, curvature = jnp.result_type(float), design.x_curvature
    precision = np.asarray(curvature.a)[:, :, 0, 0]
    arrays = (flat, design.x_index, blocks.local, blocks.glob, design.x_mean, design.x_slope,
              np.asarray(curvature.u)[:, :, 0, :], precision, np.asarray(curvature.s_chol),
              made.point.astype(np.int32), made.offset)
    numbers = info.size + info.layout.observed_size
    ranges = (_as_range(design.x_index[blocks.local]), _as_range(blocks.local))
    # both programs compiled as the quadrature's work asks (XLA's optimisations: the float64
    # values of 1000 draws of a 5000-group model took 0.73 s fast-compiled, 0.1 s optimised)
    points = num_samples * _SLOPES
    value, log_q_globals = call(_collapsed_value, (info, rows_at_once(numbers, num_samples), ranges),
                                arrays, float64=True, points=points)
    rows = quadrature_rows(numbers, num_samples)
    narrow = tuple(np.asarray(a, dtype) if np.issubdtype(np.asarray(a).dtype, np.floating) else a for a in arrays[1:])
    entries = blocks.entries
    entry_sites = None if entries is None else (entries.sites, entries.blocks)
    extra = () if entries is None else (entries.ids,)
    quadrature = jax.device_get(call(_collapsed_quadrature, (info, rows, ranges, entry_sites), (flat,) + narrow + extra,
                                     points=points))
    log_p = (np.asarray(value, np.float64) + np.asarray(quadrature.log_ratio, np.float64)
             + block_constants(precision)[made.point])
    return (log_p, made.log_q_hyper + np.asarray(log_q_globals, np.float64),
            np.asarray(quadrature.block_distance, np.float64))


def block_shifts(layout, design: NestedDesign, blocks: Blocks, distance) -> dict:
    """``{site: worst bound on W1 / SD over its coordinates}`` of the blocks' sites: each block's
    distance (:func:`~numpyro_lm.marginal.collapsed.collapsed_quadrature`) over ``q``'s marginal SD."""
    _, var = mixture_variances(design, layout.size)
    shift = np.zeros(layout.size)
    flat_local = design.x_index[blocks.local]
    shift[flat_local] = distance / np.sqrt(var[flat_local])
    return {s.name: float(np.max(shift[s.offset:s.offset + s.size], initial=0.0))
            for s in layout.sites if s.name in blocks.sites}
