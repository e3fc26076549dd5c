"""The hyperparameters' Laplace marginal at points: the inner fits' program and its batched calls.

:func:`inner_program` compiles the inner Laplace fits at a batch of hyperparameter points
(:mod:`numpyro_lm.marginal.conditional`: conditional fits, mean shifts, matched normalisers) once
per model and shapes; :class:`MarginalAtPoints` calls it in fixed-size batches (one point per
call where a batch would share nothing), in float64 for structured fits, and refuses fits whose
structure did not hold. The mode search (:mod:`.search`), the design (:mod:`.design`) and the
field's verdict (:mod:`.field`) read the marginal through it; :mod:`.fit` runs them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...core.curvature_choice import StructureError, structure_message
from ...core.trace import site_values
from ...marginal.block_terms import conditional_block_values, scalar_block_entries
from ...marginal.conditional import (banded_mean_shift, conditional_fit, conditional_hessian, matched_normaliser,
                                     mean_shift, point_params, structured_mean_shift)
from ...marginal.laplace_marginal import scalar_blocks
from ...mode.banded_hessian import BandedHessian
from ...mode.hessian import DenseHessian, structure_tol
from ...runtime.programs import in_float64, options_for_repeats, program
from ..joint_fit import FitOptions
from ..result import density_profile
from .lattice_design import BATCH, joined

__all__ = ["inner_program", "model_loops", "LOOP_BATCH_NUMBERS", "MarginalAtPoints"]


def _inner(info, tol, max_iter, theta_index: tuple, gaussian_cols: tuple, curvature: str, plate, entry_sites,
           loops: bool, thetas, x0s, with_shift, ids, args, kwargs):
    """The inner fits at a batch of points (the program :func:`run_nested` compiles); with scalar
    blocks whose log-probability entries are known (``entry_sites``: :class:`.blocks.Blocks`'
    ``(sites, blocks)``, ``ids`` theirs), the blocks' quadrature reads them. ``loops``: the model
    runs a loop (:func:`~numpyro_lm.approximations.joint_fit.runs_loops`), whose fits are vmapped."""
    hessian = conditional_hessian(info.layout, theta_index, curvature, plate)
    layout, theta_index, gaussian_cols = info.layout, np.asarray(theta_index), np.asarray(gaussian_cols, bool)

    def neg(theta, x):
        return -info.log_density(site_values(layout, theta_index, theta, x), args, kwargs)

    def block_values(theta, x):
        return conditional_block_values(info, theta_index, theta, x, args, kwargs, entry_sites[0], ids, entry_sites[1])

    blocks = None if entry_sites is None else block_values

    def at(theta):  # the strategy at theta (the low-rank update needs the prior there)
        return hessian.bind(lambda x: -info.log_prior(site_values(layout, theta_index, theta, x), args, kwargs))

    # one point after another (lax.map), not vmap: a point's fit compiles without the batching
    # transformation (less compile time, the same run time), and each point's Newton iterations
    # stop when it converges. A model that loops pays a fixed time per operation and step of its
    # loop whatever the batch: its points share the steps (AR(1) over 200 steps, 134 fits:
    # 0.38 s one after another, 0.11 s eight at a time)
    each = (lambda f, xs: jax.vmap(f)(xs)) if loops else lax.map
    fits, curvature = each(lambda tx: conditional_fit(neg, tx[0], tx[1], tol, max_iter, at(tx[0]), blocks),
                           (thetas, x0s))
    shift, gain = jnp.zeros_like(fits.x), jnp.zeros_like(fits.log_density)
    if scalar_blocks(hessian):
        # the globals' shift enters the Laplace marginal too (structured_mean_shift); on the
        # design's points only (a 10^5-group fit's shifts cost as much as its inner fits): the
        # mode search centres the lattice without it, the lattice's weights carry it
        def shifts_and_gains():
            shift, gain = lax.map(lambda a: structured_mean_shift(neg, *a, at(a[0]), with_gain=True, blocks=blocks),
                                  (thetas, fits.x, curvature))
            return jnp.where(gaussian_cols, shift, 0.0), gain

        shift, gain = lax.cond(with_shift, shifts_and_gains, lambda: (shift, gain))
        fits = fits._replace(log_density=fits.log_density + gain)
    elif np.any(gaussian_cols):  # only the design's points need it (not the mode search's)
        if isinstance(hessian, DenseHessian):
            def shifted(a):
                return mean_shift(neg, *a)
        else:
            def shifted(a):
                return structured_mean_shift(neg, *a, at(a[0]))

        def shifts():
            if not isinstance(hessian, BandedHessian):
                return each(shifted, (thetas, fits.x, curvature))
            # a field's shift from its third derivatives' diagonal where they are (every point of
            # the batch: one branch taken, also where the points are vmapped)
            fast, ok = each(lambda a: banded_mean_shift(neg, *a, hessian), (thetas, fits.x, curvature))
            return lax.cond(jnp.all(ok), lambda: fast, lambda: each(shifted, (thetas, fits.x, curvature)))

        shift = lax.cond(with_shift, lambda: jnp.where(gaussian_cols, shifts(), 0.0), lambda: shift)
    params = point_params(layout, theta_index, fits.x, fits.var)
    log_density = fits.log_density + matched_normaliser(
        layout, theta_index, fits.x, fits.precision_diagonal, fits.uncoupled, params
    )
    return fits._replace(log_density=log_density, params=params, shift=shift, gain=gain)


def inner_program(info, tol: float, max_iter: int, theta_index: tuple, gaussian_cols: tuple, curvature: str, plate,
                  args, kwargs, compiler_options=None, loops: bool = False):
    """``(run, entries)``: :func:`_inner` compiled, ``run((thetas, x0s, with_shift, ids), args, kwargs)``,
    and with scalar blocks the blocks' log-probability entries
    (:func:`~numpyro_lm.marginal.block_terms.scalar_block_entries`; ``ids = entries.ids``, else ``()``).
    ``loops``: the model runs a loop (:func:`model_loops`)."""
    hessian = conditional_hessian(info.layout, theta_index, curvature, plate)
    x_index = np.setdiff1d(np.arange(info.size), theta_index)
    entries = scalar_block_entries(info, hessian, x_index, args, kwargs, compiler_options)
    entry_sites = None if entries is None else (entries.sites, entries.blocks)
    # 20-60 calls (the search, the design): LLVM's optimisations pay for themselves but on small models
    return program(_inner, info, tol, max_iter, theta_index, gaussian_cols, curvature, plate, entry_sites, loops,
                   compiler_options=options_for_repeats(compiler_options, info.size + info.layout.observed_size)
                   ), entries


def _only(fits, fields):
    """``fits`` with its fields outside ``fields`` set to ``None`` (all kept for ``None``)."""
    return fits if fields is None else fits._replace(**{f: None for f in fits._fields if f not in fields})


def model_loops(info, args, kwargs) -> bool:
    """Whether the model's density runs a loop (:func:`~numpyro_lm.approximations.joint_fit.runs_loops`:
    a Markov chain written with ``scan``), traced once per model and argument shapes
    (:func:`~numpyro_lm.approximations.result.density_profile`)."""
    return density_profile(info, args, kwargs)[1]


LOOP_BATCH_NUMBERS = 50_000
"""Latent and observed numbers below which a model that loops fits :data:`~.lattice_design.BATCH`
points per call (vmapped: they share each step's fixed cost), one at a time from there (the mode
search's line search then tries one length at a time). Sixteen inner fits of an AR(1) trend of
Poisson counts, eight per call against one: 0.22 / 0.22-0.24 s over 4000 steps, 0.52-0.61 /
0.49-0.54 s over 10^4, 6.0 / 5.1-5.4 s over 10^5; eight against one over 2000 steps 0.032 /
0.007 s (1.75x less a fit batched). The whole call over 10^5 steps: 137 -> 112 s, peak memory
6.0 -> 5.3 GB (the search's 113 inner fits 78); over 10^4 steps one at a time was 2.7 s slower
(32.3 against 29.6 s cold), hence the threshold above it."""


class MarginalAtPoints:
    """The hyperparameters' Laplace marginal at a batch of points, ``(thetas (K, d), x0s (K, Dx),
    with_shift) -> PointFits`` (:func:`_inner` compiled), in fixed-size batches of ``batch`` inner
    fits per call: one compilation serves the mode search's stencil and line search and the
    design. A ``structured`` (block-arrowhead, banded) model fits one point per call (padding a
    batch costs whole fits, which large models cannot spare), unless it ``loops``
    (:func:`model_loops`: its fits share each step's fixed cost) and is smaller than
    :data:`LOOP_BATCH_NUMBERS`, in float64, and its structure is checked."""

    def __init__(self, inner, structured: bool, layout, options: FitOptions, dtype, bar, args, kwargs, ids=(),
                 loops: bool = False):
        self.inner, self.structured, self.layout, self.options, self.dtype = inner, structured, layout, options, dtype
        numbers = layout.size + layout.observed_size
        self.batch = BATCH if (loops and numbers < LOOP_BATCH_NUMBERS) or not structured else 1
        self.bar, self.args, self.kwargs = bar, args, kwargs
        self.ids = ids  # the blocks' entries' ids (:func:`~numpyro_lm.marginal.block_terms.scalar_block_entries`), device arrays

    def __call__(self, thetas, x0s, with_shift=False, keep=None):
        """``keep``: the :class:`PointFits` fields to return (the others ``None``): the verdict
        reads its fits' values alone, and 200 fits' conditionals over 10^5 field coordinates
        held 3 GB."""
        return joined(self.pieces(thetas, x0s, with_shift, keep))

    def pieces(self, thetas, x0s, with_shift=False, keep=None) -> list:
        """:meth:`__call__`'s fits as its compiled calls return them (the last's padding dropped),
        not concatenated: the lattice keeps them so and concatenates its points once (a 50 x 50
        grid's banded conditionals, 4 MB a point: each wave's concatenation took 2.2 s of the warm
        call's 19 s)."""
        # padding and gathering on the host (eager JAX slicing costs more than the fit)
        self.bar.update(len(thetas))
        batch, n, pad = self.batch, len(thetas), -len(thetas) % self.batch
        arrays = [np.asarray(a, self.dtype) for a in (thetas, x0s)]
        arrays = [np.concatenate([a, np.broadcast_to(a[:1], (pad,) + a.shape[1:])]) for a in arrays]
        flag = np.asarray(with_shift)
        kept = None if keep is None else set(keep) | {"structure_error"}
        parts = [_only(self._call((arrays[0][i : i + batch], arrays[1][i : i + batch], flag)), kept)
                 for i in range(0, n + pad, batch)]
        if pad:  # a view of the last call's points
            parts[-1] = jax.tree.map(lambda a: np.asarray(a)[:batch - pad], parts[-1])
        if self.structured:
            errors = np.concatenate([np.ravel(np.asarray(part.structure_error)) for part in parts])
            _check_structure(self.layout, self.options, errors, self.dtype)
        return parts

    def _call(self, arrays):
        arrays = (*arrays, self.ids)
        if self.structured:
            # a large model's Laplace marginal is a difference of sums of 10^5-10^6 terms, below
            # float32's resolution (an ulp of 1e6 is 0.06); and a regression with more coefficients
            # than data, at a small noise scale, has a curvature of condition 10^6 and more (a
            # p = 10^4 Student-t regression's inner fits failed in float32 below sigma = 0.03):
            # the inner fits run in float64
            return in_float64(self.inner, arrays, self.args, self.kwargs)
        return jax.device_get(self.inner(arrays, self.args, self.kwargs))


def _check_structure(layout, options, errors, dtype):
    """Refuse inner fits whose structure did not hold (:mod:`numpyro_lm.mode.hessian`)."""
    errors = np.asarray(errors)
    dtype = errors.dtype if np.issubdtype(errors.dtype, np.floating) else dtype  # the inner fits' (float64)
    worst = float(np.nanmax(errors.astype(np.float64), initial=0.0))
    if worst > structure_tol(dtype):
        raise StructureError(structure_message(layout, options.plate, worst, dtype, options.curvature))
