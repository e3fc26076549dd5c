r"""How the mode search evaluates and inverts the curvature: dense, block-arrowhead from a plate,
or the prior's structure plus a low-rank update.

A *Hessian strategy* is a small object the Newton method (:mod:`numpyro_lm.mode.newton`) is
given, blackjax-style, instead of a flag:

=========================  ==================================================================
``init(x0)``               ``(hess, factor)``: empty pytrees of the strategy's shapes
``evaluate(fn, x, prev)``  ``(value, grad, hess, error)``: ``fn``, its gradient and its
                           Hessian as the strategy stores it (``prev``: the last accepted
                           point's, which a strategy may reuse); ``error`` the relative error
                           of the stored structure on a random probe (0 where nothing is assumed)
``step(grad, hess)``       ``(step, decrement, factor, positive)``: the Newton step (a descent
                           step where ``hess`` is not positive definite) and its length in
                           posterior SDs
``curvature(hess)``        the :class:`~numpyro_lm.curvature.Curvature` of the Laplace Gaussian
``half_logdet(f)``         :math:`\tfrac12\log\det H` from the factor
``bind(prior)``            the strategy with the model's negative log prior at the fit's
                           arguments (the low-rank update's structured part); itself elsewhere
``check``                  whether ``evaluate`` probes the assumed structure
``value_first``            a trial is evaluated by ``fn`` alone, its derivatives only where it
                           is accepted (:func:`~numpyro_lm.mode.newton.newton_iteration`)
``structure_final``        a failed structure check ends the search at once (the structure is
                           the model's, not the point's)
=========================  ==================================================================

:class:`HessianStrategy` declares it; every strategy has every entry.

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

:class:`LowRankHessian`: where the likelihood couples every entry of the plate but has few
observations (a regression with more coefficients than data), the *prior's* Hessian is
block-arrowhead and the rest has low rank: :math:`H = M + Q B Q^\top`
(:mod:`numpyro_lm.curvature.lowrank`), found by a randomised range finder on
Hessian-vector products and checked by the same kind of probe.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, NamedTuple, Optional, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from ..curvature import ArrowheadCurvature, DenseCurvature, LowRankUpdateCurvature
from ..curvature.arrowhead import absolute_blocks, arrowhead_factor, arrowhead_matvec, modified_factor
from ..curvature.lowrank import sqrt_transpose
from .derivatives import forward_mode_refused, hvp, hvp_operator, value_grad_hessian
from .steps import newton_step

__all__ = ["HessianStrategy", "DenseHessian", "ArrowheadHessian", "LowRankHessian", "PlateStructure", "plate_structure", "structure_tol",
           "ARROWHEAD_MIN_DIM", "GLOBAL_MAX", "LOCAL_MAX", "LOWRANK_MAX", "lowrank_rank", "exact_lowrank_rank",
           "lowrank_hessian", "lowrank_max", "diagonal_structure", "LOWRANK_MARGIN", "LOWRANK_NUMERICAL",
           "NUMERICAL_TOL", "value_grad_products", "relative_error"]

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


class HessianStrategy(Protocol):
    """What the Newton method asks of a Hessian strategy (module docstring's table)."""

    check: bool
    value_first: bool
    structure_final: bool

    def init(self, x0): ...

    def evaluate(self, fn, x, previous=None): ...

    def step(self, grad, hess): ...

    def curvature(self, hess, regularize=None): ...

    def half_logdet(self, factor): ...

    def bind(self, prior: Callable) -> "HessianStrategy": ...


class DenseHessian(NamedTuple):
    """The full ``D x D`` Hessian (module docstring); ``runs``: by runs of sites
    (:func:`numpyro_lm.core.trace.site_runs`), for a log density of the model's flat vector."""

    runs: tuple = ()
    check = False  # nothing assumed, nothing to probe
    value_first = False  # one trace gives value, gradient and Hessian
    structure_final = False

    def bind(self, prior: Callable) -> "DenseHessian":
        return self

    def init(self, x0):
        square = jnp.zeros(x0.shape[-1:] * 2, x0.dtype)
        return square, square

    def evaluate(self, fn, x, previous=None):
        value, grad, hess = value_grad_hessian(fn, x, self.runs)
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


def _products(fn, x, probes):
    """``H v`` for each row ``v`` of ``probes``, one Hessian-vector product after another
    (lax.map): as fast as vmapping them on a large model (faster still for the
    log-determinant's gradient of the mean shift), and a fraction of the memory."""
    return jax.lax.map(lambda v: hvp(fn, x, v), probes)


def value_grad_products(fn, x, probes, batched: bool = False):
    """``(fn(x), its gradient, H v for each row v of probes)`` from one linearisation of
    ``value_and_grad``: the model's forward and backward pass once, then a tangent pass per
    probe (lax.map, as :func:`_products`), instead of a gradient and then a gradient with its
    tangent per probe (less time for each inner Newton evaluation of a GLMM);
    :func:`_products` where forward mode is refused (:func:`~numpyro_lm.mode.derivatives.hvp`).

    ``batched``: the gradient, then every probe's forward-over-reverse product at once (vmap), for
    a model that loops (``scan``): linearising a ``scan`` costs time quadratic in its length
    (an AR(1) over 2000 steps, four probes: 17 ms linearised, 0.13 ms so)."""
    try:
        if batched:
            value, grad = jax.value_and_grad(fn)(x)
            return value, grad, jax.vmap(lambda v: jax.jvp(jax.grad(fn), (x,), (v,))[1])(probes)
        (value, grad), product = jax.linearize(jax.value_and_grad(fn), x)
    except TypeError as error:
        if not forward_mode_refused(error):
            raise
        value, grad = jax.value_and_grad(fn)(x)
        return value, grad, _products(fn, x, probes)
    return value, grad, jax.lax.map(lambda v: product(v)[1], probes)


def coloured_blocks(structure: PlateStructure, products):
    """``(A, B, C)`` of a block-arrowhead Hessian from its products with the colouring probes
    (one per block position, then one unit vector per global: ``ArrowheadHessian._probes``)."""
    local, glob = structure.local_index, structure.global_index
    b = local.shape[1]
    a = jnp.transpose(products[:b][:, local], (1, 2, 0))  # A[j, i, k] = (H c_k)[local[j, i]]
    columns = products[b:]  # H e_g for each global g
    return (0.5 * (a + jnp.swapaxes(a, -1, -2)), jnp.transpose(columns[:, local], (1, 2, 0)),
            0.5 * (columns[:, glob] + columns[:, glob].T))


def relative_error(exact, structured):
    """``|exact - structured| / |exact|``: a structured product's error on a probe."""
    return jnp.linalg.norm(exact - structured) / jnp.maximum(jnp.linalg.norm(exact), jnp.finfo(exact.dtype).tiny)


class ArrowheadHessian(NamedTuple):
    """The Hessian in a plate's block-arrowhead structure, by coloured Hessian-vector products
    (module docstring); ``hess`` is ``(A, B, C)``, the factor :func:`arrowhead_factor`'s."""

    structure: PlateStructure
    check: bool = True  # the random probe of the structure at each evaluation (off where checked once already)
    value_first: bool = True  # a rejected trial costs fn alone, an accepted one fn more (optimize.newton_iteration)
    structure_final = True  # entries that interact do so at every point: a failed check ends the search

    def bind(self, prior: Callable) -> "ArrowheadHessian":
        return self

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

    def evaluate(self, fn, x, previous=None):
        local, glob = self.structure.local_index, self.structure.global_index
        probes = self._probes(x.dtype)
        if not self.check:
            value, grad, products = value_grad_products(fn, x, probes[:-1])
            return value, grad, coloured_blocks(self.structure, products), jnp.zeros((), x.dtype)
        value, grad, products = value_grad_products(fn, x, probes)
        blocks = coloured_blocks(self.structure, products[:-1])
        # only the local rows can show entries outside the structure (the global rows are the
        # global columns' transpose, exact by construction); they are sums over one entry's
        # data, while a global row sums over all data (in float32 off by 1e-3 of itself at
        # 2 10^6 observations: rounding, not structure)
        exact = products[-1][local]
        structured = arrowhead_matvec(local, glob, *blocks, probes[-1])[local]
        return value, grad, blocks, relative_error(exact, structured)

    def step(self, grad, hess):
        factor = arrowhead_factor(*hess)
        positive = _factor_positive(factor)
        factor = jax.lax.cond(positive, lambda: factor, lambda: modified_factor(*hess))
        curv = ArrowheadCurvature(self.structure.local_index, self.structure.global_index,
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


class LowRankHessian(NamedTuple):
    r"""The Hessian as a structured prior part plus a low-rank rest: :math:`H = M + Q B Q^\top`
    (:class:`~numpyro_lm.curvature.lowrank.LowRankUpdateCurvature`).

    :math:`M` is the block-arrowhead Hessian of the model's *prior* (``prior``, the negative
    :meth:`~numpyro_lm.core.model.ModelInfo.log_prior`: ``b + G`` coloured products of it) with
    the blocks that are not positive definite made so (:func:`absolute_blocks`); the rest,
    :math:`H - M`, is the likelihood's Hessian plus those few blocks' corrections, whose rank
    is about the number of observations when they are fewer than the coordinates (a
    regression's :math:`X^\top W X`). It is found by a randomised range finder (Halko,
    Martinsson and Tropp 2011, algorithm 4.1, without power iterations): ``rank`` products
    of :math:`H - M` with fixed Gaussian probes span its range when its rank is at most
    ``rank``, an orthonormal basis :math:`Q` of them and ``rank`` more products give
    :math:`B = Q^\top (H - M) Q`, exact then. A blocked range finder rather than Lanczos: its
    ``2 rank`` Hessian-vector products run as matrix products, not one after another. A
    fixed random probe checks the result (``error``); where the rank is larger, the fit is
    refused (``structure_tol``), not approximated.

    ``prior`` is bound per fit (:meth:`bind`, the model's arguments are in it).
    """

    structure: PlateStructure
    rank: int
    prior: Optional[Callable] = None
    numerical: bool = False  # rank below the observed numbers (lowrank_rank): the likelihood's spectrum decides
    value_first: bool = True  # a rejected trial costs fn alone, an accepted one fn more (optimize.newton_iteration)
    check = True  # the range finder's result is always probed

    @property
    def structure_final(self) -> bool:
        # a numerical rank that misses the likelihood's Hessian at the start misses it along the
        # search (a smooth kernel's spectrum is the kernel's, whatever the weights): refused at
        # once, and the next curvature tried
        return self.numerical

    def bind(self, prior: Callable) -> "LowRankHessian":
        """The strategy with ``prior(x)``, the negative log prior, for one fit's arguments."""
        return self._replace(prior=prior)

    def init(self, x0):
        j, b, g = self.structure.sizes
        d, m, dtype = x0.shape[-1], self.rank, x0.dtype
        zeros = (jnp.zeros((j, b, b), dtype), jnp.zeros((j, b, g), dtype), jnp.zeros((g, g), dtype),
                 jnp.zeros((d, m), dtype), jnp.zeros((m, m), dtype))
        return zeros, zeros

    def evaluate(self, fn, x, previous=None):
        if self.prior is None:
            raise ValueError("LowRankHessian needs the model's prior: bind(prior) first")
        d, dtype = x.shape[-1], x.dtype
        value, grad = jax.value_and_grad(fn)(x)
        colours = ArrowheadHessian(self.structure)._probes(dtype)[:-1]
        blocks = absolute_blocks(*coloured_blocks(self.structure, _products(self.prior, x, colours)))
        base = ArrowheadCurvature.from_blocks(self.structure.local_index, self.structure.global_index, *blocks)
        product = hvp_operator(fn, x)  # the model's forward pass once (a GP's kernel factor), then products

        def rest(v):  # (H - M) v
            return product(v) - base.matvec(v)

        def rest_rows(v):  # a block of rows at a time: matrix products, bounded memory
            return jax.lax.map(rest, v, batch_size=min(v.shape[0], RANGE_BATCH))

        probe = jnp.asarray(np.random.default_rng(1).choice([-1.0, 1.0], d), dtype)
        if self.numerical:
            # the error in the prior's whitened coordinates, S'(H - QBQ' - M)S e: what a direction's
            # variance loses, whatever the scale of the large eigenvalues (against |H v| a tail of
            # many small ones would pass unseen)
            probe = base.inv_sqrt(probe)
        exact = product(probe)

        def update(q):  # B = Q'(H - M)Q and the probe's relative error
            bmat = q.T @ rest_rows(q.T).T
            bmat = 0.5 * (bmat + bmat.T)
            structured = base.matvec(probe) + q @ (bmat @ (q.T @ probe))
            if self.numerical:
                missed = jnp.linalg.norm(sqrt_transpose(base, exact - structured)) / jnp.sqrt(jnp.asarray(d, dtype))
                return q, bmat, missed * (structure_tol(dtype) / NUMERICAL_TOL)  # compared with structure_tol
            return q, bmat, relative_error(exact, structured)

        def fresh():
            probes = jax.random.normal(jax.random.PRNGKey(0), (self.rank, d), dtype)
            # the range's basis is taken as fixed under differentiation (the nested fit's mean
            # shift differentiates log det H): a QR factor of a rank-deficient block has none
            return update(jax.lax.stop_gradient(jnp.linalg.qr(rest_rows(probes).T)[0]))

        def again():
            # the previous step's range, where it still spans the update (a regression's
            # likelihood keeps its range): rank products instead of twice as many
            reused = update(jax.lax.stop_gradient(previous[3]))
            return jax.lax.cond(reused[2] <= structure_tol(dtype), lambda: reused, fresh)

        if previous is None:
            q, bmat, error = fresh()
        else:
            q, bmat, error = jax.lax.cond(jnp.any(previous[3] != 0), again, fresh)
        return value, grad, blocks + (q, bmat), error

    def curvature(self, hess, regularize=None):
        a, b, c, q, bmat = hess
        if regularize is not None:  # M + r I is M's blocks with r on their diagonals
            a = a + regularize * jnp.eye(a.shape[-1], dtype=a.dtype)
            c = c + regularize * jnp.eye(c.shape[-1], dtype=c.dtype)
        base = ArrowheadCurvature.from_blocks(self.structure.local_index, self.structure.global_index, a, b, c)
        return LowRankUpdateCurvature.from_update(base, q, bmat)

    def step(self, grad, hess):
        curv = self.curvature(hess)
        positive = curv.positive()
        used = curv._replace(mu=jnp.where(positive, curv.mu, curv.absolute_mu()))  # saddle-free elsewhere (a solve needs mu only)
        solved = used.solve(grad)
        decrement = jnp.sqrt(jnp.maximum(jnp.dot(grad, solved), 0.0))
        return -solved, decrement, hess, positive

    def half_logdet(self, factor):
        if factor[3].ndim == 3:  # a batch of starts
            return jax.vmap(self.half_logdet)(factor)
        return 0.5 * self.curvature(factor).logdet()


RANGE_BATCH = 64
"""Hessian-vector products of the low-rank range finder vmapped at a time."""
LOWRANK_MARGIN = 32
"""Rank of the low-rank update beyond the observed numbers and the globals (the prior's
blocks that are not positive definite at the mode, and slack)."""
LOWRANK_MAX = 2048
"""Largest rank of a low-rank update (``D x rank`` arrays, ``2 rank`` products per step)."""


LOWRANK_NUMERICAL = 128
"""Rank of a *numerical* low-rank update: where the observations are too many for an exact one,
the likelihood's Hessian may still be close to low rank (a latent GP's whitened field:
:math:`L^\top W L` has the spectrum of the kernel, whose eigenvalues fall off geometrically for a
smooth kernel: an RBF kernel's on 5000 points on [-3, 3] with lengthscale 0.15 leaves a relative
error of 2e-5 on the probe at rank 64, below float32's :func:`structure_tol`). The probe decides."""


NUMERICAL_TOL = 1e-3
"""Largest root-mean-square error of a numerical low-rank update per whitened direction (a
direction's precision off by 0.1% of the prior's): a latent GP's missed tail is its jitter's,
``1e-3 W`` (at most 2.5e-4 for a Bernoulli likelihood). :class:`LowRankHessian` reports it scaled
by ``structure_tol / NUMERICAL_TOL``, so that every check compares with :func:`structure_tol`."""


def exact_lowrank_rank(layout, structure: PlateStructure) -> int:
    """The rank that holds the likelihood's Hessian exactly: its observed numbers (it has at
    most about that rank), the globals, and :data:`LOWRANK_MARGIN`; at most ``D``."""
    return int(min(layout.size, layout.observed_size + structure.global_index.size + LOWRANK_MARGIN))


def lowrank_rank(layout, structure: PlateStructure) -> int:
    """The update's rank for a model: :func:`exact_lowrank_rank` where that is at most
    :func:`lowrank_max`, else :data:`LOWRANK_NUMERICAL` (a numerical low rank, which the
    probe accepts only where the likelihood's Hessian has it: :func:`lowrank_hessian`)."""
    exact, numerical = exact_lowrank_rank(layout, structure), int(min(layout.size, LOWRANK_NUMERICAL))
    # numerical only where it saves: the exact rank too large, and rank 128 small beside D
    return numerical if exact > lowrank_max(layout) and numerical <= lowrank_max(layout) else exact


def lowrank_hessian(layout, structure: PlateStructure, size: Optional[int] = None) -> "LowRankHessian":
    """:class:`LowRankHessian` over ``size`` coordinates (default the model's) with the prior's
    ``structure`` and the rank of :func:`lowrank_rank`, ``numerical`` where it is below the
    exact one (then refused at the first point where the probe fails: ``structure_final``)."""
    size = layout.size if size is None else size
    rank, exact = min(size, lowrank_rank(layout, structure)), min(size, exact_lowrank_rank(layout, structure))
    return LowRankHessian(structure, rank, numerical=rank < exact)


def diagonal_structure(size: int) -> PlateStructure:
    """Every one of ``size`` coordinates its own block, no globals: the prior structure of a
    model without a suitable plate (independent priors; the check catches the others)."""
    return PlateStructure("", np.arange(size, dtype=np.int32)[:, None], np.zeros(0, np.int32))


def lowrank_max(layout) -> int:
    """Largest rank ``curvature="auto"`` gives a low-rank update: :data:`LOWRANK_MAX`, and a
    quarter of ``D`` (beyond that the dense curvature is as cheap)."""
    return min(LOWRANK_MAX, layout.size // 4)
