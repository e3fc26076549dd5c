r"""How the mode search evaluates and inverts the curvature: dense, or block-arrowhead from a plate.

A *Hessian strategy* is a small object the Newton method (:mod:`numpyro_lm.optimize`) is
given, blackjax-style, instead of a flag:

=====================  ======================================================================
``init(x0)``           ``(hess, factor)``: empty pytrees of the strategy's shapes
``evaluate(fn, x)``    ``(value, grad, hess, error)``: ``fn``, its gradient and its Hessian
                       as the strategy stores it; ``error`` the relative error of the
                       stored structure on a random probe (0 where nothing is assumed)
``step(grad, hess)``   ``(step, decrement, factor, positive)``: the Newton step (a descent
                       step where ``hess`` is not positive definite) and its length in
                       posterior SDs
``curvature(hess)``    the :class:`~numpyro_lm.curvature.Curvature` of the Laplace Gaussian
``half_logdet(f)``     :math:`\tfrac12\log\det H` from the factor
=====================  ======================================================================

:class:`DenseHessian`: ``D`` Hessian-vector products (forward over reverse, one vmapped
trace), ``O(D^2)`` memory and a Cholesky factor: the right choice up to a few thousand
coordinates.

:class:`ArrowheadHessian`: the block-arrowhead structure of a hierarchical model
(:mod:`numpyro_lm.curvature.arrowhead`), read from a plate (:func:`plate_structure`: the
latent sites in the plate are the local blocks, one per plate entry; everything else is
global). Its Hessian costs ``b + G + 1`` Hessian-vector products, whatever ``J``: by
*colouring* (Curtis, Powell and Reid 1974; Gebremedhin, Manne and Pothen 2005), one probe
per position in a block sums that position over all blocks (blocks do not interact, so the
sum separates), one per global coordinate gives its whole column, and one random probe
checks the assumption on the local rows of the product: a plate says that its entries' *priors* are independent, not that
the likelihood keeps them apart (a GP's whitened field sits in a plate and couples every
entry through ``L z``). The relative error of the structured product on that probe is
carried to the fit's info (``structure_error``); where it exceeds :func:`structure_tol` the
structure does not hold and the fit is refused, naming the plate.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .curvature import ArrowheadCurvature, DenseCurvature
from .curvature.arrowhead import arrowhead_factor, arrowhead_matvec, modified_factor
from .optimize import newton_step, value_grad_hessian

__all__ = ["DenseHessian", "ArrowheadHessian", "PlateStructure", "plate_structure", "structure_tol",
           "ARROWHEAD_MIN_DIM", "GLOBAL_MAX", "LOCAL_MAX", "dense_bytes", "available_bytes", "check_dense_memory",
           "DenseMemoryError", "StructureError", "structure_message", "choose_curvature", "hessian_for"]

ARROWHEAD_MIN_DIM = 500
"""``curvature="auto"`` uses a plate's block-arrowhead structure above this many coordinates
(below it the dense Hessian is as fast and needs no assumption)."""
GLOBAL_MAX = 256
"""Most global coordinates of a block-arrowhead structure (``G^3`` per Newton step)."""
LOCAL_MAX = 64
"""Most coordinates per local block."""


def structure_tol(dtype) -> float:
    """Relative error of a structured Hessian-vector product above which the structure does
    not hold: ``sqrt(eps)`` (float32 3e-4, float64 1.5e-8), well above the rounding of
    sums of many terms and far below a coupling that changes the answer."""
    return float(np.sqrt(np.finfo(dtype).eps))


class DenseHessian(NamedTuple):
    """The full ``D x D`` Hessian (module docstring)."""

    def init(self, x0):
        square = jnp.zeros(x0.shape[-1:] * 2, x0.dtype)
        return square, square

    def evaluate(self, fn, x):
        value, grad, hess = value_grad_hessian(fn, x)
        return value, grad, hess, jnp.zeros((), x.dtype)

    def step(self, grad, hess):
        return newton_step(grad, hess)

    def curvature(self, hess, regularize=None):
        if regularize is not None:
            hess = hess + regularize * jnp.eye(hess.shape[-1], dtype=hess.dtype)
        return DenseCurvature.from_precision(hess)

    def half_logdet(self, factor):
        return jnp.sum(jnp.log(jnp.abs(jnp.diagonal(factor, axis1=-2, axis2=-1))), axis=-1)


class PlateStructure(NamedTuple):
    """Where a plate puts the flat coordinates: ``local_index (J, b)``, ``global_index (G,)``."""

    plate: str
    local_index: np.ndarray
    global_index: np.ndarray

    @property
    def sizes(self) -> tuple:
        """``(J, b, G)``."""
        return self.local_index.shape + self.global_index.shape


def _site_blocks(site, name: str):
    """The site's flat coordinates as ``(J, b_site)`` blocks along plate ``name``, or ``None``."""
    for plate, dim, size in site.plate_dims:
        if plate != name:
            continue
        axis = site.batch_ndim + dim
        if axis < 0 or site.basis_shape[axis] != size:
            return None
        index = site.offset + np.arange(site.size).reshape(site.basis_shape)
        return np.moveaxis(index, axis, 0).reshape(size, -1)
    return None


@lru_cache(maxsize=32)
def plate_structure(layout, plate: Optional[str] = None) -> Optional[PlateStructure]:
    """The block-arrowhead structure of a plate (the named one, else the plate holding the
    most latent coordinates): each latent site in it contributes its coordinates of plate
    entry ``j`` to local block ``j``; the other coordinates are global. ``None`` where no
    plate gives at least two blocks of at most :data:`LOCAL_MAX` coordinates and at most
    :data:`GLOBAL_MAX` globals."""
    names = {p for s in layout.sites for p, _, _ in s.plate_dims} if plate is None else {plate}
    best = None
    for name in sorted(names):
        blocks = [b for b in (_site_blocks(s, name) for s in layout.sites) if b is not None]
        if not blocks:
            continue
        local = np.concatenate(blocks, axis=1)
        glob = np.setdiff1d(np.arange(layout.size), local.ravel())
        if local.shape[0] < 2 or local.shape[1] > LOCAL_MAX or glob.size > GLOBAL_MAX:
            continue
        if best is None or local.size > best.local_index.size:
            best = PlateStructure(name, local.astype(np.int32), glob.astype(np.int32))
    return best


class ArrowheadHessian(NamedTuple):
    """The Hessian in a plate's block-arrowhead structure, by coloured Hessian-vector products
    (module docstring); ``hess`` is ``(A, B, C)``, the factor :func:`arrowhead_factor`'s."""

    structure: PlateStructure
    value_first = True  # rejected line-search trials cost one evaluation (optimize.newton_iteration)

    def _probes(self, dtype):
        """``(b + G + 1, D)``: one colour per block position, one unit vector per global, a random sign probe."""
        local, glob = self.structure.local_index, self.structure.global_index
        size = local.size + glob.size
        j, b = local.shape
        probes = np.zeros((b + glob.size + 1, size))
        for k in range(b):
            probes[k, local[:, k]] = 1.0
        probes[b + np.arange(glob.size), glob] = 1.0
        probes[-1] = np.random.default_rng(0).choice([-1.0, 1.0], size)
        return jnp.asarray(probes, dtype)

    def init(self, x0):
        j, b, g = self.structure.sizes
        zeros = (jnp.zeros((j, b, b), x0.dtype), jnp.zeros((j, b, g), x0.dtype), jnp.zeros((g, g), x0.dtype))
        return zeros, zeros

    def evaluate(self, fn, x):
        local, glob = self.structure.local_index, self.structure.global_index
        b = local.shape[1]
        probes = self._probes(x.dtype)
        # one Hessian-vector product after another (lax.map): as fast as vmapping them on a
        # large model, and a fraction of the memory (measured on a 10^5-group GLMM: 1.1 GB
        # against 1.8 GB; the log-determinant's gradient of the mean shift 0.7 s against 1.2 s)
        value, grad = jax.value_and_grad(fn)(x)
        products = jax.lax.map(lambda v: jax.jvp(jax.grad(fn), (x,), (v,))[1], probes)
        a = jnp.transpose(products[:b][:, local], (1, 2, 0))  # A[j, i, k] = (H c_k)[local[j, i]]
        columns = products[b:-1]  # H e_g for each global g
        blocks = (0.5 * (a + jnp.swapaxes(a, -1, -2)), jnp.transpose(columns[:, local], (1, 2, 0)),
                  0.5 * (columns[:, glob] + columns[:, glob].T))
        # only the local rows can show entries outside the structure (the global rows are the
        # global columns' transpose, exact by construction); they are sums over one entry's
        # data, while a global row sums over all data (in float32 off by 1e-3 of itself at
        # 2 10^6 observations: rounding, not structure)
        exact = products[-1][local]
        structured = arrowhead_matvec(local, glob, *blocks, probes[-1])[local]
        error = jnp.linalg.norm(exact - structured) / jnp.maximum(jnp.linalg.norm(exact), jnp.finfo(x.dtype).tiny)
        return value, grad, blocks, error

    def step(self, grad, hess):
        factor = arrowhead_factor(*hess)
        positive = _factor_positive(factor)
        factor = jax.lax.cond(positive, lambda: factor, lambda: modified_factor(*hess))
        curv = ArrowheadCurvature(jnp.asarray(self.structure.local_index), jnp.asarray(self.structure.global_index),
                                  *hess, *factor)
        solved = curv.solve(grad)
        decrement = jnp.sqrt(jnp.maximum(jnp.dot(grad, solved), 0.0))
        return -solved, decrement, factor, positive

    def curvature(self, hess, regularize=None):
        a, b, c = hess
        if regularize is not None:
            a = a + regularize * jnp.eye(a.shape[-1], dtype=a.dtype)
            c = c + regularize * jnp.eye(c.shape[-1], dtype=c.dtype)
        return ArrowheadCurvature.from_blocks(self.structure.local_index, self.structure.global_index, a, b, c)

    def half_logdet(self, factor):
        la, _, ls = factor
        return (jnp.sum(jnp.log(jnp.abs(jnp.diagonal(la, axis1=-2, axis2=-1))), axis=(-2, -1))
                + jnp.sum(jnp.log(jnp.abs(jnp.diagonal(ls, axis1=-2, axis2=-1))), axis=-1))


def _factor_positive(factor):
    la, _, ls = factor
    ok = True
    for l in (la, ls):
        diagonal = jnp.diagonal(l, axis1=-2, axis2=-1)
        ok = ok & jnp.all(jnp.isfinite(l)) & jnp.all(diagonal > 0)
    return ok


# ---------------------------------------------------------------- memory


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


def check_dense_memory(layout, itemsize: int, why: str):
    """Refuse a dense curvature that would not fit in memory, naming the size, why no structure
    serves and the fix."""
    need, have = dense_bytes(layout.size, layout.observed_size, itemsize), available_bytes()
    if need > 0.8 * have:
        structure = plate_structure(layout)
        if structure is None:
            fix = ("Put the model's local latent sites (random effects) in a numpyro.plate so that "
                   f"curvature='auto' can use the block-arrowhead structure, with at most {LOCAL_MAX} coordinates "
                   f"per plate entry and {GLOBAL_MAX} outside the plate.")
        else:
            fix = (f"Plate {structure.plate!r} has the block-arrowhead layout but its entries interact (through the "
                   "likelihood: a regression on all of them, a covariance over them), which needs a low-rank or "
                   "sparse curvature that numpyro_lm does not have yet: fit a smaller model, or sample with NUTS.")
        raise DenseMemoryError(
            f"a dense curvature over the model's {layout.size} latent coordinates would need about "
            f"{need / 2**30:.1f} GiB ({have / 2**30:.1f} GiB available); {why} {fix}"
        )


def structure_message(layout, plate: Optional[str], error: float, dtype) -> str:
    """Why a fit with a block-arrowhead curvature was refused (its random-probe check failed)."""
    structure = plate_structure(layout, plate)
    name = "?" if structure is None else structure.plate
    return (f"the block-arrowhead curvature read from plate {name!r} does not hold: on a random probe the "
            f"structured Hessian-vector product is off by {error:.1e} (relative; the limit is "
            f"{structure_tol(dtype):.0e}): the latent sites of "
            f"different entries of {name!r} interact (for example through a likelihood outside the plate, or a "
            "covariance over the plate's entries). Pass curvature='dense' (if the model fits in memory), name "
            "another plate with plate=..., or write the model so that each observation depends on one entry "
            "of the plate.")


def choose_curvature(layout, curvature: str = "auto", plate: Optional[str] = None) -> str:
    """``"dense"`` or ``"arrowhead"`` for a model: ``curvature`` itself unless ``"auto"``, which
    picks the arrowhead above :data:`ARROWHEAD_MIN_DIM` coordinates where a plate gives one."""
    if curvature != "auto":
        if curvature == "arrowhead":
            hessian_for(layout, curvature, plate)  # refuse a model without the structure now
        return curvature
    if layout.size > ARROWHEAD_MIN_DIM and plate_structure(layout, plate) is not None:
        return "arrowhead"
    return "dense"


def hessian_for(layout, curvature: str, plate: Optional[str] = None):
    """The strategy a fit uses: ``curvature`` is ``"dense"`` or ``"arrowhead"`` (the plate's
    structure, ``plate`` or the largest: :func:`plate_structure`)."""
    if curvature == "dense":
        return DenseHessian()
    structure = plate_structure(layout, plate)
    if structure is None:
        raise ValueError(f"curvature='arrowhead': no plate{'' if plate is None else ' ' + repr(plate)} of the "
                         f"model has a block-arrowhead structure (at least two entries, at most {LOCAL_MAX} "
                         f"latent coordinates per entry and {GLOBAL_MAX} outside the plate).")
    return ArrowheadHessian(structure)
