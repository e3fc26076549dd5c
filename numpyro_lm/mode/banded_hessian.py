r"""The Hessian of a latent Markov field, read as a band by coloured Hessian-vector products.

A field whose coordinates interact only with their neighbours in a chain (an AR(p) trend or a
random walk written with ``scan``, a CAR field after a bandwidth-reducing ordering) has a
banded Hessian: :math:`H_{ij} = 0` for :math:`|i - j| > w`. Columns more than :math:`2w` apart
touch disjoint rows, so :math:`2w + 1` probes, probe :math:`c` the sum of the unit vectors of
the coordinates :math:`j \equiv c \pmod{2w + 1}`, give every entry of the band: row :math:`i`
of product :math:`c` is :math:`H_{i,j}` for the one :math:`j` of colour :math:`c` within
:math:`w` of :math:`i` (Curtis, Powell and Reid 1974, the colouring the block-arrowhead
strategy of :mod:`.hessian` uses for a plate). A random sign probe checks the band, as the
arrowhead's does: its product from the model against the band's, relative error within
:func:`~numpyro_lm.mode.hessian.structure_tol`. The whole Hessian costs :math:`2w + 2`
products whatever the field's length, and its factor :math:`O(n w^3)`
(:class:`~numpyro_lm.curvature.banded.BandedCurvature`), where the dense Hessian costs
:math:`n` products and :math:`n^3`.

:func:`find_half_width` finds :math:`w` from the model, by the same check at
:math:`w = 1, 2, 4, \dots`: the smallest that holds.

A :class:`BandedHessian` is a strategy of :mod:`.hessian`'s protocol (``hess``: the lower band
``(D, w + 1)``, ``band[i, k] = H[i, i - k]``). Where the band is not positive definite the
Newton step falls back to ``-g / |diag H|``: a descent direction, as the saddle-free step of the
dense strategy is, that needs no factor.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..curvature.banded import BandedCurvature, band_blocks, banded_factor
from .hessian import relative_error, value_grad_products, structure_tol

__all__ = ["BandedHessian", "band_probes", "band_from_products", "band_matvec", "find_half_width", "HALF_WIDTH_MAX"]

HALF_WIDTH_MAX = 16
"""Widest half-bandwidth :func:`find_half_width` tries (``2w + 2`` products, ``w^3`` a block)."""


def band_probes(dim: int, half_width: int, dtype) -> jnp.ndarray:
    """``(2w + 2, D)``: the colouring probes (module docstring), then a random sign probe."""
    colours = 2 * half_width + 1
    probes = np.zeros((colours + 1, dim))
    probes[np.arange(dim) % colours, np.arange(dim)] = 1.0
    probes[-1] = np.random.default_rng(0).choice([-1.0, 1.0], dim)
    return jnp.asarray(probes, dtype)


def band_from_products(products, half_width: int):
    """The lower band ``(D, w + 1)`` from the colouring probes' products ``(2w + 1, D)``:
    ``band[i, k] = H[i, i - k]``, row ``i`` of the product of ``i - k``'s colour."""
    dim = products.shape[-1]
    rows = np.arange(dim)[:, None]
    columns = rows - np.arange(half_width + 1)[None, :]
    colour = np.mod(columns, 2 * half_width + 1)
    return jnp.where(columns >= 0, products[colour, np.broadcast_to(rows, colour.shape)], 0.0)


def band_matvec(band, v):
    """``H v`` from the lower band, ``v (D,)``."""
    out = band[:, 0] * v
    for k in range(1, band.shape[1]):
        out = out.at[k:].add(band[k:, k] * v[:-k]).at[:-k].add(band[k:, k] * v[k:])
    return out


class BandedHessian(NamedTuple):
    """The Hessian as a band of half-width ``half_width`` (module docstring)."""

    half_width: int
    check: bool = True  # the random probe of the band at each evaluation
    value_first: bool = True  # a rejected trial costs fn alone (numpyro_lm.mode.newton.newton_iteration)
    structure_final = True  # a band the model exceeds does so at every point: the search ends

    def bind(self, prior: Callable) -> "BandedHessian":
        return self

    def _blocks(self, band):
        return band_blocks(band, self.half_width)

    def init(self, x0):
        band = jnp.zeros((x0.shape[-1], self.half_width + 1), x0.dtype)
        diag, lower, _ = self._blocks(band)
        return band, (jnp.zeros_like(diag), jnp.zeros_like(lower))

    def evaluate(self, fn, x, previous=None):
        probes = band_probes(x.shape[-1], self.half_width, x.dtype)
        if not self.check:
            value, grad, products = value_grad_products(fn, x, probes[:-1])
            return value, grad, band_from_products(products, self.half_width), jnp.zeros((), x.dtype)
        value, grad, products = value_grad_products(fn, x, probes)
        band = band_from_products(products[:-1], self.half_width)
        return value, grad, band, relative_error(products[-1], band_matvec(band, probes[-1]))

    def step(self, grad, hess):
        diag, lower, pad = self._blocks(hess)
        factor = banded_factor(diag, lower)
        curvature = BandedCurvature(diag, lower, *factor, jnp.zeros(pad, hess.dtype))
        positive = curvature.positive()
        solved = curvature.solve(grad)
        scale = jnp.maximum(jnp.abs(hess[:, 0]), jnp.finfo(hess.dtype).tiny)
        step = jnp.where(positive, -solved, -grad / scale)
        decrement = jnp.sqrt(jnp.maximum(jnp.where(positive, jnp.dot(grad, solved), jnp.dot(grad, grad / scale)), 0.0))
        return step, decrement, factor, positive

    def curvature(self, hess, regularize=None):
        if regularize is not None:
            hess = hess.at[:, 0].add(regularize)
        return BandedCurvature.from_band(hess, self.half_width)

    def half_logdet(self, factor):
        d, _ = factor
        return jnp.sum(jnp.log(jnp.abs(jnp.diagonal(d, axis1=-2, axis2=-1))), axis=(-2, -1))


def find_half_width(fn: Callable, x, largest: int = HALF_WIDTH_MAX):
    """The smallest half-bandwidth ``w`` in ``1, 2, 4, ..., largest`` whose band holds for
    ``fn``'s Hessian at ``x`` (its random probe within :func:`~numpyro_lm.mode.hessian.structure_tol`),
    or ``None`` (the Hessian is not banded, or ``2w + 2`` products would cost as much as the
    dense Hessian's ``D``). Concrete values: run it on the host, once per data set."""
    dim, tol = x.shape[-1], structure_tol(x.dtype)
    w = 1
    while w <= largest and 2 * w + 2 < dim:
        error = jax.jit(lambda y, w=w: BandedHessian(w).evaluate(fn, y)[3])(x)
        if float(error) <= tol:
            return w
        w *= 2
    return None
