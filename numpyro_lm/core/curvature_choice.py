"""Which curvature a fit uses, and what it would cost in memory.

:func:`curvature_candidates` gives the Hessian strategies of :mod:`numpyro_lm.mode.hessian` a fit
tries in turn (block-arrowhead, low-rank, dense: each where the one before fails its
check, :class:`StructureError`), :func:`hessian_for` builds one from its name, and the memory
guards (:func:`check_dense_memory`, :func:`event_block_bytes`) refuse, before anything is
allocated, a curvature that would not fit, naming the size and the fix.
"""

from __future__ import annotations

import os
from typing import Optional

import jax.numpy as jnp

from ..families import get_family
from ..mode.hessian import (ARROWHEAD_MIN_DIM, GLOBAL_MAX, LOCAL_MAX, NUMERICAL_TOL, ArrowheadHessian, DenseHessian,
                            diagonal_structure, exact_lowrank_rank, lowrank_hessian, lowrank_max, plate_structure,
                            structure_tol)
from .trace import is_elementwise, site_runs

__all__ = ["StructureError", "DenseMemoryError", "dense_bytes", "available_bytes", "event_block_bytes",
           "check_dense_memory", "structure_message", "CURVATURES", "curvature_candidates", "choose_curvature",
           "hessian_for"]


class StructureError(ValueError):
    """A structured curvature whose structure does not hold at the fit (:func:`structure_message`)."""


class DenseMemoryError(MemoryError):
    """A dense curvature that would not fit in memory (raised before anything is allocated)."""


def dense_bytes(dim: int, observed_size: int, itemsize: int) -> int:
    """What a dense fit of ``dim`` coordinates holds at once, roughly: about ten ``D x D``
    matrices (the Hessian, its factor, the Newton state's copies, the eigendecomposition) and
    the ``D`` tangents of the forward-over-reverse Hessian, each a copy of the model's
    intermediates (taken as five times its observed and latent values)."""
    return itemsize * (10 * dim * dim + 5 * dim * (observed_size + dim))


def available_bytes() -> int:
    """Memory available now (``MemAvailable`` of ``/proc/meminfo``; else physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def event_block_bytes(layout, itemsize: int) -> int:
    """Memory of the largest dense block a structured curvature still forms: the covariance over
    one site matched as a whole (an event vector: a Dirichlet's, a multivariate normal's), about
    three copies of its ``size^2`` numbers. Without a plate a site can hold every coordinate."""
    sizes = [s.size for s in layout.sites if not is_elementwise(s, get_family(s.family, s.basis))]
    return 3 * itemsize * max(sizes, default=0) ** 2


def check_dense_memory(layout, itemsize: int, why: str):
    """Refuse a dense curvature that would not fit in memory, naming the size, why no structure
    serves and the fix."""
    need, have = dense_bytes(layout.size, layout.observed_size, itemsize), available_bytes()
    if need > 0.8 * have:
        structure = plate_structure(layout)
        rank = exact_lowrank_rank(layout, structure or diagonal_structure(layout.size))
        if structure is None:
            fix = ("Put the model's local latent sites (random effects) in a numpyro.plate so that "
                   f"curvature='auto' can use the block-arrowhead structure, with at most {LOCAL_MAX} coordinates "
                   f"per plate entry and {GLOBAL_MAX} outside the plate.")
        else:
            fix = (f"Plate {structure.plate!r} has the block-arrowhead layout but its entries interact (through the "
                   "likelihood: a regression on all of them, a covariance over them).")
        if rank > lowrank_max(layout):
            fix += (f" A low-rank update of the prior's curvature serves where the model has few observations; "
                    f"its {layout.observed_size} observed numbers would need rank {rank} (at most "
                    f"{lowrank_max(layout)}). Fit a smaller model, or sample with NUTS.")
        else:
            fix += " Fit a smaller model, or sample with NUTS."
        raise DenseMemoryError(
            f"a dense curvature over the model's {layout.size} latent coordinates would need about "
            f"{need / 2**30:.1f} GiB ({have / 2**30:.1f} GiB available); {why} {fix}"
        )


def structure_message(layout, plate: Optional[str], error: float, dtype, curvature: str = "arrowhead") -> str:
    """Why a fit with a structured curvature was refused (its random-probe check failed)."""
    limit = f"(relative; the limit is {structure_tol(dtype):.0e})"
    if curvature == "lowrank":
        strategy = hessian_for(layout, "lowrank", plate)
        rank = strategy.rank
        if strategy.numerical:  # reported scaled (LowRankHessian.evaluate): its own measure and limit
            error = error * NUMERICAL_TOL / structure_tol(dtype)
            limit = f"(root-mean-square per direction of the prior's whitened coordinates; the limit is {NUMERICAL_TOL:.0e})"
        why = (f"the likelihood's Hessian is not close to rank {rank} (its {layout.observed_size} observations "
               "are too many for an exact low-rank update, and its spectrum does not fall off as a smooth "
               "kernel's does)" if strategy.numerical else
               f"the likelihood's Hessian has rank above {rank} (for example through nonlinear predictors, or more "
               "than a few prior blocks that are not positive definite at the mode)")
        return (f"the low-rank curvature (the prior's structured Hessian plus a rank-{rank} update) does not hold: "
                f"on a random probe the structured Hessian-vector product is off by {error:.1e} {limit}: {why}. "
                "Pass curvature='dense' (if the model fits in memory), or sample with NUTS.")
    structure = plate_structure(layout, plate)
    name = "?" if structure is None else structure.plate
    return (f"the block-arrowhead curvature read from plate {name!r} does not hold: on a random probe the "
            f"structured Hessian-vector product is off by {error:.1e} {limit}: the latent sites of "
            f"different entries of {name!r} interact (for example through a likelihood outside the plate, or a "
            "covariance over the plate's entries). Pass curvature='dense' (if the model fits in memory), name "
            "another plate with plate=..., or write the model so that each observation depends on one entry "
            "of the plate.")



CURVATURES = ("auto", "dense", "arrowhead", "lowrank")


def curvature_candidates(layout, curvature: str = "auto", plate: Optional[str] = None) -> list:
    """The curvatures a fit tries in order, the next where a structure's check fails
    (:class:`StructureError`): ``[curvature]`` unless ``"auto"``, which above
    :data:`ARROWHEAD_MIN_DIM` coordinates tries the block-arrowhead (where a plate gives one),
    then the low-rank update (where the observations are few: :func:`lowrank_max`), then dense."""
    itemsize = jnp.dtype(jnp.result_type(float)).itemsize
    if curvature != "auto":
        if curvature != "dense":
            hessian_for(layout, curvature, plate)  # refuse a model without the structure now
        if curvature == "lowrank" and event_block_bytes(layout, itemsize) > 0.5 * available_bytes():
            site = max(layout.sites, key=lambda s: s.size if not is_elementwise(s, get_family(s.family, s.basis)) else 0)
            raise DenseMemoryError(
                f"curvature='lowrank' keeps a dense covariance over each site matched as a whole, and site "
                f"{site.name!r} has {site.size} coordinates in one event (about "
                f"{event_block_bytes(layout, itemsize) / 2**30:.1f} GiB; {available_bytes() / 2**30:.1f} GiB "
                "available). Write its coordinates in a numpyro.plate (independent entries), or pass "
                f"families={{{site.name!r}: 'gaussian'}} with an elementwise basis.")
        return [curvature]
    out = []
    if layout.size > ARROWHEAD_MIN_DIM:
        if plate_structure(layout, plate) is not None:
            out.append("arrowhead")
        if (hessian_for(layout, "lowrank", plate).rank <= lowrank_max(layout)
                and event_block_bytes(layout, itemsize) <= 0.5 * available_bytes()):
            out.append("lowrank")
    return out + ["dense"]


def choose_curvature(layout, curvature: str = "auto", plate: Optional[str] = None) -> str:
    """The first of :func:`curvature_candidates`."""
    return curvature_candidates(layout, curvature, plate)[0]


def hessian_for(layout, curvature: str, plate: Optional[str] = None, by_site: bool = False):
    """The strategy a fit uses: ``curvature`` is ``"dense"``, ``"arrowhead"`` (the plate's
    structure, ``plate`` or the largest: :func:`plate_structure`) or ``"lowrank"`` (that
    structure for the prior, each coordinate its own block where no plate gives one, and a
    low-rank update of rank :func:`lowrank_rank`; unbound: :meth:`LowRankHessian.bind`).
    ``by_site``: the log density takes the model's flat vector as it is, so the dense Hessian
    may be taken by runs of sites (:func:`numpyro_lm.core.trace.site_runs`)."""
    if curvature == "dense":
        return DenseHessian(site_runs(layout) if by_site else ())
    structure = plate_structure(layout, plate)
    if curvature == "lowrank":
        if structure is None and plate is not None:
            raise ValueError(f"curvature='lowrank': plate {plate!r} gives no block-arrowhead structure of the prior "
                             f"(at least two entries, at most {LOCAL_MAX} latent coordinates per entry and "
                             f"{GLOBAL_MAX} outside the plate).")
        return lowrank_hessian(layout, structure or diagonal_structure(layout.size))
    if structure is None:
        raise ValueError(f"curvature='arrowhead': no plate{'' if plate is None else ' ' + repr(plate)} of the "
                         f"model has a block-arrowhead structure (at least two entries, at most {LOCAL_MAX} "
                         f"latent coordinates per entry and {GLOBAL_MAX} outside the plate).")
    return ArrowheadHessian(structure)
