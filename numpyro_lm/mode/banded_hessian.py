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

from ..curvature.banded import BandedCurvature, band_blocks
from ..curvature.banded_arrowhead import BandedArrowheadCurvature
from .hessian import relative_error, structure_tol, value_grad_products

__all__ = ["BandedHessian", "band_from_products", "band_matvec", "smallest_width", "column_reach", "find_half_width",
           "cyclic_colours", "band_offsets", "HALF_WIDTH_MAX", "REACH_COLUMNS"]

HALF_WIDTH_MAX = 64
"""Widest half-bandwidth :func:`find_half_width` tries (``2w + 2`` products, ``w^3`` a block): a
field over a 50 x 50 grid, numbered row by row (a CAR prior's), has half-bandwidth 50."""
REACH_COLUMNS = 9
"""Unit vectors spread over the field whose Hessian columns :func:`column_reach` reads."""


def cyclic_colours(half_width: int, offsets: tuple = ()) -> int:
    r"""The fewest colours ``m`` for which colouring column ``j`` by ``j mod m`` reads every entry
    of a band whose nonzero diagonals are ``offsets`` (all ``0..w`` where empty: ``2w + 1``).

    Two columns may share a colour when no row holds a nonzero of both: their distance is then
    outside :math:`D = \{a - b : a, b \in \pm K\}`, ``K`` the offsets. ``j mod m`` separates every
    pair at a distance in ``D`` when ``m`` divides no nonzero element of ``D``. A grid's field
    numbered row by row (a CAR prior over a 50 x 50 grid: ``K = {0, 1, 50}``) needs 6 colours
    where its band's 101 would be read."""
    full = 2 * half_width + 1
    if not offsets:
        return full
    signed = np.unique(np.concatenate([np.asarray(offsets, int), -np.asarray(offsets, int)]))
    distances = np.abs(signed[:, None] - signed[None, :])
    distances = np.unique(distances[distances > 0])
    for m in range(1, full):
        if not np.any(distances % m == 0):
            return m
    return full


def band_offsets(band, tol: float) -> tuple:
    """The diagonals ``k`` of a lower band ``(..., n, w + 1)`` (several bands of one field: read at
    several points) that hold an entry above ``tol`` times the largest, as the band's structure
    (its zeros are exact under autodiff)."""
    band = np.asarray(band)
    largest = np.max(np.abs(band.reshape(-1, band.shape[-1])), axis=0)
    return tuple(int(k) for k in np.flatnonzero(largest > tol * np.max(largest)))


def band_from_products(products, half_width: int, offsets: tuple = ()):
    """The lower band ``(D, w + 1)`` from the colouring probes' products ``(m, D)``
    (:func:`cyclic_colours`): ``band[i, k] = H[i, i - k]``, row ``i`` of the product of
    ``i - k``'s colour; zero on the diagonals outside ``offsets`` (where given), whose colours
    other columns share."""
    dim = products.shape[-1]
    rows = np.arange(dim)[:, None]
    columns = rows - np.arange(half_width + 1)[None, :]
    colour = np.mod(columns, cyclic_colours(half_width, offsets))
    kept = columns >= 0
    if offsets:
        kept = kept & np.isin(np.arange(half_width + 1), offsets)[None, :]
    return jnp.where(kept, products[colour, np.broadcast_to(rows, colour.shape)], 0.0)


def band_matvec(band, v):
    """``H v`` from the lower band, ``v (D,)``."""
    out = band[:, 0] * v
    for k in range(1, band.shape[1]):
        out = out.at[k:].add(band[k:, k] * v[:-k]).at[:-k].add(band[k:, k] * v[k:])
    return out


class BandedHessian(NamedTuple):
    """The Hessian as a band of half-width ``half_width`` over the field, with a dense border for
    the coordinates at positions ``glob`` (static; the rest, in order, is the field): ``hess`` is
    ``(band (n, w + 1), B (n, G), C (G, G))`` (module docstring;
    :class:`~numpyro_lm.curvature.banded_arrowhead.BandedArrowheadCurvature` where ``G > 0``).
    ``offsets``: the band's nonzero diagonals where it is sparse inside (a grid's field), read
    with :func:`cyclic_colours`' fewer probes; empty: every diagonal, ``2w + 1`` probes."""

    half_width: int
    glob: tuple = ()
    check: bool = True  # the random probe of the band at each evaluation
    value_first: bool = True  # a rejected trial costs fn alone (numpyro_lm.mode.newton.newton_iteration)
    structure_final = True  # a band the model exceeds does so at every point: the search ends
    offsets: tuple = ()  # the nonzero diagonals (all where empty): cyclic_colours

    @property
    def colours(self) -> int:
        return cyclic_colours(self.half_width, self.offsets)

    def bind(self, prior: Callable) -> "BandedHessian":
        return self

    def _field(self, dim: int) -> np.ndarray:
        return np.setdiff1d(np.arange(dim), np.asarray(self.glob, int))

    def init(self, x0):
        n, g = x0.shape[-1] - len(self.glob), len(self.glob)
        band = jnp.zeros((n, self.half_width + 1), x0.dtype)
        diag, lower, _ = band_blocks(band, self.half_width)
        hess = (band, jnp.zeros((n, g), x0.dtype), jnp.zeros((g, g), x0.dtype))
        return hess, (jnp.zeros_like(diag), jnp.zeros_like(lower), jnp.zeros((g, g), x0.dtype))

    def _probes(self, dim: int, dtype):
        """Colours over the field, a unit vector per global, a random sign probe over all."""
        field, glob, colours = self._field(dim), np.asarray(self.glob, int), self.colours
        probes = np.zeros((colours + glob.size + 1, dim))
        probes[np.arange(field.size) % colours, field] = 1.0
        probes[colours + np.arange(glob.size), glob] = 1.0
        probes[-1] = np.random.default_rng(0).choice([-1.0, 1.0], dim)
        # behind a barrier: XLA otherwise folds the products of these constants through a model's
        # own constants (a CAR prior's static adjacency: seconds per compile at 2500 regions)
        return jax.lax.optimization_barrier(jnp.asarray(probes, dtype))

    def evaluate(self, fn, x, previous=None):
        dim, colours = x.shape[-1], self.colours
        field, glob = self._field(dim), np.asarray(self.glob, int)
        probes = self._probes(dim, x.dtype)
        value, grad, products = value_grad_products(fn, x, probes if self.check else probes[:-1], batched=True)
        band = band_from_products(products[:colours][:, field], self.half_width, self.offsets)
        border = products[colours:colours + glob.size]
        hess = (band, border[:, field].T, border[:, glob])
        if not self.check:
            return value, grad, hess, jnp.zeros((), x.dtype)
        # the field's rows alone: a global's row sums over every observation (rounding, not structure)
        structured = band_matvec(band, probes[-1][field]) + hess[1] @ probes[-1][glob]
        return value, grad, hess, relative_error(products[-1][field], structured)

    def _curvature(self, hess):
        band, b, c = hess
        field = BandedCurvature.from_band(band, self.half_width)
        if not self.glob:
            return field
        return BandedArrowheadCurvature.from_blocks(field, self._field(band.shape[0] + len(self.glob)),
                                                    np.asarray(self.glob, int), b, c)

    def step(self, grad, hess):
        curvature = self._curvature(hess)
        positive = curvature.positive()
        solved = curvature.solve(grad)
        scale = jnp.maximum(jnp.abs(curvature.diagonal()), jnp.finfo(grad.dtype).tiny)
        step = jnp.where(positive, -solved, -grad / scale)
        decrement = jnp.sqrt(jnp.maximum(jnp.where(positive, jnp.dot(grad, solved), jnp.dot(grad, grad / scale)), 0.0))
        field = curvature if not self.glob else curvature.field
        s_chol = jnp.zeros((0, 0), grad.dtype) if not self.glob else curvature.s_chol
        return step, decrement, (field.diag_chol, field.lower_chol, s_chol), positive

    def curvature(self, hess, regularize=None):
        if regularize is not None:
            band, b, c = hess
            hess = (band.at[:, 0].add(regularize), b, c + regularize * jnp.eye(c.shape[-1], dtype=c.dtype))
        return self._curvature(hess)

    def half_logdet(self, factor):
        d, _, s = factor
        return (jnp.sum(jnp.log(jnp.abs(jnp.diagonal(d, axis1=-2, axis2=-1))), axis=(-2, -1))
                + jnp.sum(jnp.log(jnp.abs(jnp.diagonal(s, axis1=-2, axis2=-1))), axis=-1))


def column_reach(fn: Callable, x, glob: tuple = ()):
    """The farthest row from its column of a nonzero entry of ``fn``'s Hessian at ``x``, over
    :data:`REACH_COLUMNS` columns spread over the field (``glob``: the border, left out): a
    guess of the half-bandwidth that :func:`smallest_width` starts from and checks. A grid's
    field has the same reach in every column (its width), a chain's its order; the doubling
    alone would check 1, 2, 4, ..., each width one compiled probe, and stop at up to twice
    the band (a factor of eight in the band's factor)."""
    dim = x.shape[-1]
    field = np.setdiff1d(np.arange(dim), np.asarray(glob, int))
    where = np.unique(np.linspace(0, field.size - 1, REACH_COLUMNS).round().astype(int))
    probes = np.zeros((where.size, dim))
    probes[np.arange(where.size), field[where]] = 1.0
    probes = jax.lax.optimization_barrier(jnp.asarray(probes, x.dtype))  # as BandedHessian's
    columns = jnp.abs(value_grad_products(fn, x, probes, batched=True)[2][:, field])
    # entries of structure, not rounding: the model's own zeros are exact under autodiff
    nonzero = columns > jnp.finfo(x.dtype).eps * jnp.max(columns, axis=1, keepdims=True)
    distance = np.abs(np.arange(field.size)[None, :] - where[:, None])
    return jnp.max(jnp.where(nonzero, distance, 0))


def smallest_width(error: Callable, dim: int, border: int = 0, tol: float = 0.0, largest: int = HALF_WIDTH_MAX,
                   start: int = 1):
    """The smallest half-bandwidth ``w`` in ``start, 2 start, 4 start, ..., largest`` with
    ``error(w) <= tol`` (``error``: the band's probe, :meth:`BandedHessian.evaluate`'s), or
    ``None`` where none holds before ``2w + 2`` products and the ``border`` would cost what the
    dense Hessian's ``dim`` do. ``start``: :func:`column_reach`'s guess."""
    w = max(int(start), 1)
    while w <= largest and 2 * w + 2 + border < dim:
        if float(error(w)) <= tol:
            return w
        w *= 2
    return None


def find_half_width(fn: Callable, x, largest: int = HALF_WIDTH_MAX, glob: tuple = ()):
    """:func:`smallest_width` for ``fn``'s Hessian at ``x`` (a dense border at the coordinates
    ``glob``), each width's probe compiled here (a library caller compiles it once per model:
    :func:`~numpyro_lm.marginal.conditional.banded_inner_hessian`). Concrete values: run it on
    the host, once per data set."""
    def error(w):
        return jax.jit(lambda y: BandedHessian(w, tuple(glob)).evaluate(fn, y)[3])(x)

    start = int(jax.jit(lambda y: column_reach(fn, y, tuple(glob)))(x))
    return smallest_width(error, x.shape[-1], len(glob), structure_tol(x.dtype), largest, start)
