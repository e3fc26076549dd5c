r"""The density of the hyperparameters and globals with the scalar blocks integrated out.

A plated model whose latent field is one scalar :math:`z_j` per plate entry, independent given
the hyperparameters and the globals :math:`r = (\theta, \beta)` (a random intercept per group:
the block-arrowhead structure with ``b = 1``), has

.. math:: p(r, y) = p(r) \prod_j \int p(y_j, z_j \mid r)\,dz_j
          = e^{f(c)} \prod_j \sqrt{2\pi / a_j}\; R_j(c_j, a_j),

:math:`f` the model's log density with the blocks at :math:`c`, each block's integral by
adaptive Gauss-Hermite quadrature about a centre :math:`c_j` with a scale :math:`a_j^{-1/2}`
(:func:`~numpyro_lm.marginal.quadrature.block_quadrature`: :math:`R_j` its ratio to the one-node
rule, with the conditional's mean and variance). The identity holds for any centre and scale;
the quadrature is accurate where they are near the block's mode and curvature, which the
approximation's own conditional given :math:`r` provides (no search: an offset of a fraction
of an SD costs the 5-node rule nothing measurable). Importance weights of draws of :math:`r`
alone, :math:`p(r, y) / q(r)`, then have a spread that does not grow with the number of blocks,
where the joint weights :math:`p(r, z, y) / q(r, z)` over :math:`10^5` blocks sum :math:`10^5`
small errors of the Gaussian conditionals into a heavy tail whatever the quality of each
marginal (a Rao-Blackwellised, "collapsed" importance sampler: Liu 2001, *Monte Carlo
Strategies in Scientific Computing*, sec. 2.5.5). Each block's conditional is checked on its own
against its quadrature moments (:func:`collapsed_quadrature`).

The three parts are computed where their precision needs: :math:`f(c)`, a sum over every
observation, in float64 (:func:`collapsed_value`); :math:`\sum_j \log R_j`, a sum of small
terms, in float32, from each block's own terms or from gradients (:func:`collapsed_quadrature`,
most of the work); and
:math:`\sum_j \tfrac12 \log(2\pi / a_j)`, which depends only on the design point, on the host
(:func:`block_constants`).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .quadrature import add_at, block_quadrature

__all__ = ["VERDICT_NODES", "block_constants", "collapsed_value", "CollapsedQuadrature", "collapsed_quadrature"]

VERDICT_NODES = 5
"""Gauss-Hermite nodes per block in the verdict's collapsed density (13 gradients per draw): on
the Poisson random-effect benchmark the collapsed log-weights' spread is 0.009 nats with 5 nodes
and with 9, 0.034 with 3."""


def _by_rows(fn: Callable, arrays, rows: int, zeros):
    """``fn`` vmapped over ``rows`` rows at a time inside a sequential loop: ``(outputs per row,
    the sum over the rows of the second output)``; ``fn(*row) -> (per-row output, summed output)``,
    ``zeros`` the summed output's zeros (given, not found by tracing ``fn`` once more: a second
    trace of the quadrature cost a cold call 0.3 s). ``lax.map(batch_size=)`` with the sum carried
    along: the summed output is ``(J,)`` per row, and ``n x J`` of it would not fit at 10^5 blocks."""
    n = jax.tree.leaves(arrays)[0].shape[0]
    pad = -n % rows

    def padded(a):
        a = jnp.concatenate([a, jnp.broadcast_to(a[:1], (pad,) + a.shape[1:])])
        return a.reshape((-1, rows) + a.shape[1:])

    keep = (jnp.arange(n + pad) < n).reshape(-1, rows)

    def chunk(total, inputs):
        part, keep_part = inputs
        each, summed = jax.vmap(fn)(*part)
        summed = jax.tree.map(lambda t, s: t + jnp.sum(jnp.where(keep_part.reshape((-1,) + (1,) * (s.ndim - 1)),
                                                                  s, 0.0), axis=0), total, summed)
        return summed, each

    total, each = jax.lax.scan(chunk, zeros, (jax.tree.map(padded, arrays), keep))
    return jax.tree.map(lambda e: e.reshape((-1,) + e.shape[2:])[:n], each), total


def _centre(proposal: Callable, row, extra, local_index):
    m, s2, log_q = proposal(row, extra)
    # the blocks set to m (as an addition: no scatter where they are a range); the value and the
    # quadrature both take this centre, so its last-bit rounding cancels
    return add_at(row, local_index, m.astype(row.dtype) - row[local_index]), m, s2, log_q


def collapsed_value(log_density: Callable, flat, local_index, proposal: Callable, extras, rows: int):
    r"""``(f(c) (n,), the proposal's log q term (n,))`` at each row of ``flat (n, D)``: the model's log
    density with the row's blocks at their centres ``c``, the proposal's conditional means.

    ``proposal(row, extra) -> (m (J,), s2 (J,), log q)``: the approximation's conditional mean and
    variance of each block given the row's rest, and a term of the row's ``log q`` (``extras``: a
    pytree of arrays with a leading axis of ``n``, one ``extra`` per row). ``local_index``: the
    blocks' coordinates, an integer array or a ``slice`` (a contiguous range: XLA's scatters at
    traced indices cost more on a CPU than the model's gradients they serve)."""
    def one(inputs):
        centre, _, _, log_q = _centre(proposal, *inputs, local_index)
        return log_density(centre), log_q

    return jax.lax.map(one, (flat, extras), batch_size=rows)  # vmapped rows at a time, as joint_fit.map_rows


class CollapsedQuadrature(NamedTuple):
    """What :func:`collapsed_quadrature` returns for ``n`` draws of ``J`` blocks."""

    log_ratio: jnp.ndarray  # (n,) sum over the blocks of log R_j about the draw's centres
    block_distance: jnp.ndarray  # (J,) the draws' mean of each block's conditional distance


def collapsed_quadrature(log_density: Callable, flat, local_index, proposal: Callable, extras, rows: int,
                         num_nodes: int = VERDICT_NODES, values: Optional[Callable] = None) -> CollapsedQuadrature:
    r""":math:`\sum_j \log R_j` at each row of ``flat (n, D)`` (the blocks' quadrature about the
    proposal's conditional means, with its conditional variances: :func:`collapsed_value`'s
    ``proposal``), and each block's conditional check.

    A block's distance at a draw is the Wasserstein-1 distance between the Gaussians with the
    quadrature's moments and with ``q``'s, :math:`|m_p - m_q| + \sqrt{2/\pi}\,|s_p - s_q|` (the
    coupling of two Gaussians through one standard normal: it bounds their W1); averaged over
    ``q``'s draws it bounds the W1 between the two mixtures (W1 is jointly convex): the error of
    ``q``'s marginal of the block that its conditionals make. ``rows``: draws evaluated at once
    (``vmap``) inside a sequential loop. ``values``: each block's own terms
    (:func:`~numpyro_lm.marginal.quadrature.block_quadrature`'s).
    """
    def one(row, extra):
        centre, m, s2, _ = _centre(proposal, row, extra, local_index)
        log_ratio, offset, var = block_quadrature(log_density, centre, local_index, 1.0 / s2, batched=True,
                                                  num_nodes=num_nodes, values=values)
        distance = jnp.abs(offset) + math.sqrt(2 / math.pi) * jnp.abs(jnp.sqrt(var) - jnp.sqrt(s2))
        return jnp.sum(log_ratio), distance

    blocks = np.arange(flat.shape[1])[local_index].size  # J (local_index an array or a slice)
    log_ratio, total = _by_rows(one, (flat, extras), rows, jnp.zeros(blocks, flat.dtype))
    return CollapsedQuadrature(log_ratio, total / flat.shape[0])


def block_constants(precision) -> np.ndarray:
    r""":math:`\sum_j \tfrac12 \log(2\pi / a_j)` for each row of ``precision (K, J)`` (float64, host)."""
    precision = np.asarray(precision, np.float64)
    return 0.5 * precision.shape[-1] * math.log(2 * math.pi) - 0.5 * np.sum(np.log(precision), axis=-1)
