r"""Each scalar block's own log density, read off the model's per-site log probabilities.

The blocks' Gauss-Hermite quadrature (:mod:`.quadrature`) needs, for every block :math:`j` at
once, the values :math:`\varphi_j(\delta) = f_j(\hat z_j + \delta) - f_j(\hat z_j)` of the terms
of the log density that involve :math:`z_j`. The model gives the sum of every term; the
trace gives more: each sample site's log probability entry by entry (an observation, a group's
prior; ``numpyro.infer.util.compute_log_probs`` with ``sum_log_prob=False``). Where every entry
involves at most one block, block :math:`j`'s terms are the entries that involve it, summed
(a segment sum), and an entry that involves no block is the same at every node and cancels.
One evaluation of the model at a node then gives every block's value there: the 5-node rule
costs 5 evaluations where integrating the blocks' slopes costs 13 gradients, and the values
carry only the round-off of the entries themselves, not the slope integration's error.

Which entry involves which block is found once per data set (:func:`find_block_entries`):
forward-mode products of the entries along four directions that move every block at once,
in float64. An entry that involves block :math:`j` alone changes along a direction :math:`d`
by :math:`g_e\,d_j`; with :math:`d = 1` and :math:`d_j = 1 + (j \bmod B)`,
:math:`1 + \lfloor j / B\rfloor` the two ratios spell out :math:`j` in base :math:`B`, and a
fourth, random direction checks it (an entry that involves two blocks fails the check). The
point is the basis origin moved in every coordinate (at the exact origin a prior's slope, and
with it the entry's tie to its block, can vanish). Where any entry fails, or the model's
derivatives are not finite there, or forward mode is refused (``odeint``), the quadrature
keeps integrating slopes (:func:`find_block_entries` returns ``None``).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..core.starts import origin_point, spread_points
from ..core.trace import site_values
from ..mode.derivatives import forward_mode_refused
from ..runtime.programs import in_float64, program
from .laplace_marginal import scalar_blocks

__all__ = ["BlockEntries", "find_entries", "scalar_block_entries", "conditional_block_values", "entry_products", "entry_directions", "find_block_entries",
           "block_log_density", "ENTRY_BASE", "ENTRY_OFFSET"]

ENTRY_BASE = 1024
"""The base in which two direction ratios spell a block's index (:func:`find_block_entries`):
ratios of at most 1024 are exact to 1e-10 in float64 however many blocks."""
_CHECK_TOL = 1e-6  # relative: the ratios' float64 round-off is 1e-13
ENTRY_OFFSET = 0.25
"""How far (basis units, at most) :func:`find_entries` moves each block from the origin."""


class BlockEntries(NamedTuple):
    """Which entries of the model's per-site log probabilities belong to which block.

    ``sites``: ``((site, per_block), ...)``, the sites with entries in some block (static:
    part of a compiled program's key); ``per_block = k >= 1`` where the site's entries are the
    blocks' in order, ``k`` to a block (``1``: the blocks themselves), summed by a reshape, else
    ``0`` (a segment sum: a scatter, which XLA:CPU runs at 3-4 ms a row over 2 10^6 entries where
    the reshape's sum takes 0.3, vmapped or not); ``ids``: for each such site, its entries' block
    indices ``(entries,)`` int32, ``blocks`` where an entry involves none.
    """

    sites: tuple
    ids: tuple
    blocks: int


def find_entries(info, local: np.ndarray, args, kwargs, compiler_options=None) -> Optional[BlockEntries]:
    """The :class:`BlockEntries` of the scalar blocks at the flat coordinates ``local (J,)``
    (module docstring), or ``None`` where the quadrature integrates slopes instead (entries
    shared by blocks, a model forward mode cannot differentiate, ``obs_mask`` sites). The
    block indices go to the device once: the programs that read them run many times."""
    if info.layout.missing_data:
        return None
    point = origin_point(info.layout)
    point[local] += ENTRY_OFFSET * spread_points(1, local.size)[0]  # away from a prior's flat top
    directions = entry_directions(info.size, local)
    try:
        products = in_float64(program(entry_products, info, compiler_options=compiler_options),
                              (point, directions), args, kwargs)
    except TypeError as error:
        if not forward_mode_refused(error):
            raise
        return None
    if any(isinstance(p, jax.core.Tracer) for p in jax.tree.leaves(products)):
        return None  # called under a trace (LaplaceNUTS' chains inside pmap): nothing can be read
    entries = find_block_entries(products, directions, local)
    return None if entries is None else entries._replace(ids=jax.device_put(entries.ids))


def scalar_block_entries(info, hessian, x_index, args, kwargs, compiler_options=None) -> Optional[BlockEntries]:
    """:func:`find_entries` for the scalar blocks of a conditional Hessian strategy ``hessian``
    over the flat coordinates ``x_index`` (a nested fit's inner fits, LaplaceNUTS' field), else ``None``."""
    if not scalar_blocks(hessian):
        return None
    local = np.asarray(x_index)[np.asarray(hessian.structure.local_index[:, 0])]
    return find_entries(info, local, args, kwargs, compiler_options)


def conditional_block_values(info, hyper_index, hyper, x, args, kwargs, sites: tuple, ids: tuple, blocks: int):
    """:func:`block_log_density` at the hyperparameters ``hyper`` (flat coordinates ``hyper_index``)
    and the rest ``x``; ``sites``, ``ids``, ``blocks``: a :class:`BlockEntries`' fields."""
    terms = info.site_log_probs(site_values(info.layout, hyper_index, hyper, x), args, kwargs)
    return block_log_density(terms, sites, ids, blocks)


def entry_products(info, point, directions, args, kwargs):
    """``{site: (4, entries)}``: the forward-mode products of every site's log-probability
    entries at ``point`` along each of ``directions (4, D)`` (a program body)."""
    def terms(v):
        return {k: jnp.ravel(t) for k, t in info.site_log_probs(v, args, kwargs).items()}

    return jax.vmap(lambda d: jax.jvp(terms, (point,), (d,))[1])(directions)


def entry_directions(size: int, local: np.ndarray, seed: int = 0) -> np.ndarray:
    """``(4, size)``: the directions of :func:`find_block_entries`, zero but on the blocks' coordinates ``local``."""
    j = np.arange(local.size)
    out = np.zeros((4, size))
    out[0, local] = 1.0
    out[1, local] = 1.0 + j % ENTRY_BASE
    out[2, local] = 1.0 + j // ENTRY_BASE
    out[3, local] = np.random.default_rng(seed).uniform(1.0, 2.0, local.size)
    return out


def find_block_entries(products: dict, directions: np.ndarray, local: np.ndarray) -> Optional[BlockEntries]:
    """The :class:`BlockEntries` read from :func:`entry_products` (host arrays, float64) along
    :func:`entry_directions`, or ``None`` where some entry involves more than one block or is
    not finite (module docstring)."""
    blocks, check = local.size, directions[3, local]
    sites, ids = [], []
    for name, t in products.items():
        t = np.asarray(t, np.float64).reshape(4, -1)
        if not np.all(np.isfinite(t)):
            return None
        involved = np.any(t != 0, axis=0)
        if not involved.any():
            continue
        base = np.where(involved, t[0], 1.0)
        low, high = np.rint(t[1] / base) - 1, np.rint(t[2] / base) - 1
        block = (low + ENTRY_BASE * high).astype(np.int64)
        inside = (low >= 0) & (low < ENTRY_BASE) & (block >= 0) & (block < blocks)
        block = np.where(inside, block, 0)
        scale = np.abs(t).max(axis=0) + np.finfo(np.float64).tiny
        exact = ((np.abs(t[1] - base * (1 + low)) <= _CHECK_TOL * scale)
                 & (np.abs(t[2] - base * (1 + high)) <= _CHECK_TOL * scale)
                 & (np.abs(t[3] - base * check[block]) <= _CHECK_TOL * scale))
        if not np.all(~involved | (inside & exact)):
            return None
        block = np.where(involved, block, blocks).astype(np.int32)
        sites.append((name, _per_block(block, blocks)))
        ids.append(block)
    if not sites:
        return None
    return BlockEntries(tuple(sites), tuple(ids), blocks)


def _per_block(block: np.ndarray, blocks: int) -> int:
    """``k`` where the entries' block indices ``block`` are ``0, .., 0, 1, .., 1, ...``, ``k`` of each
    block (a balanced design in group order), else ``0`` (:class:`BlockEntries`)."""
    per, left = divmod(block.size, blocks)
    if left or not per:
        return 0
    return per if np.array_equal(block, np.repeat(np.arange(blocks, dtype=block.dtype), per)) else 0


def block_log_density(terms: dict, sites: tuple, ids: tuple, blocks: int):
    """``(J,)``: each block's share of the log density, from the per-site log-probability
    entries ``terms`` (:meth:`~numpyro_lm.core.model.ModelInfo.site_log_probs`) and a
    :class:`BlockEntries`' ``sites`` and ``ids``."""
    total = None
    for (name, per_block), block in zip(sites, ids):
        entries = jnp.ravel(terms[name])
        if per_block:
            part = entries if per_block == 1 else jnp.sum(entries.reshape(blocks, per_block), axis=-1)
        else:
            part = jax.ops.segment_sum(entries, block, blocks + 1)[:blocks]
        total = part if total is None else total + part
    return total
