"""Laplace-marginal NUTS as pure functions over an immutable :class:`MarginalTarget` (blackjax's
``laplace_hmc`` style): the target's potential, the chain's state after a NUTS step (a draw of
the latent field at NUTS's point), and a step with the quadrature's correction taken by tilted
delayed acceptance. :class:`~.laplace_nuts.LaplaceNUTS` is the NumPyro ``MCMCKernel`` over them;
its module docstring has the mathematics.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..core.trace import split_coordinates
from ..marginal.laplace_marginal import laplace_marginal, mode_search, quadrature_correction, scalar_blocks

__all__ = ["TILT_MIN_MOVES", "LaplaceNUTSState", "MarginalTarget", "default_marginalized", "split_coordinates",
           "joint_vector", "potential_energy", "correction", "found_mode", "chain_state", "sample_chain",
           "retilted", "chain_keys", "no_moves", "moves_added", "tilt_from_moves"]

TILT_MIN_MOVES = 2
"""Proposed moves per hyperparameter a tilt's slope needs (:func:`tilt_from_moves`); fewer, and
they gather on until the next re-take."""


class LaplaceNUTSState(NamedTuple):
    r"""``z``: every latent coordinate (``phi`` from NUTS, ``theta`` drawn given it), flat, in
    the LM bases; ``hmc``: NUTS's state over ``phi``; ``theta_mode``: the conditional mode at
    ``phi``; ``theta_hess``: the inner Hessian there (the strategy's, :mod:`numpyro_lm.mode.hessian`);
    ``inner_failed``: its Newton solve did not converge or found no mode;
    ``diverging``, ``num_steps`` as NUTS reports them; ``rng_key`` for the draws of theta;
    ``log_correction``, ``correction_rejected``, ``tilt``: delayed acceptance's :math:`c(\phi)`,
    verdict and :math:`g` (:mod:`~.laplace_nuts`); ``tilt_moves``: the sums
    :func:`tilt_from_moves` reads, over the warm-up moves proposed since the last tilt."""

    z: jnp.ndarray
    hmc: object
    theta_mode: jnp.ndarray
    theta_hess: object
    inner_failed: jnp.ndarray
    diverging: jnp.ndarray
    num_steps: jnp.ndarray
    rng_key: jnp.ndarray
    log_correction: jnp.ndarray
    correction_rejected: jnp.ndarray
    tilt: jnp.ndarray
    tilt_moves: tuple


class MarginalTarget(NamedTuple):
    """What the kernel functions need of a model: ``log_density(theta, phi)`` in the LM bases, the
    flat coordinates of the field ``theta_index`` and of the hyperparameters ``phi_index`` (of
    ``size`` in all), the inner Hessian strategy, the inner Newton tolerance ``tol(dtype)`` and
    evaluations ``max_iter``; ``quadrature``: ``True`` (the correction by delayed acceptance),
    ``"potential"`` or ``False``; ``batched``: the correction's gradients at once;
    ``block_values(theta, phi) -> (J,)``: each scalar block's own terms, where the model's
    log-probability entries give them (:mod:`~numpyro_lm.marginal.block_terms`)."""

    log_density: Callable
    theta_index: np.ndarray
    phi_index: np.ndarray
    size: int
    hessian: object
    tol: Callable
    max_iter: int
    quadrature: object = True
    batched: bool = True
    block_values: Optional[Callable] = None

    @property
    def delayed(self) -> bool:
        """The quadrature's correction by delayed acceptance (where the field has scalar blocks)."""
        return self.quadrature is True and scalar_blocks(self.hessian)


def default_marginalized(layout) -> list:
    """The latent field a default :class:`~.laplace_nuts.LaplaceNUTS` integrates out: every site
    inside a plate, and every multivariate-normal latent (a GP's values); the rest (global sites
    outside the plates) are the hyperparameters NUTS samples."""
    return [s.name for s in layout.sites if s.plates or s.prior == "MultivariateNormal"]


def joint_vector(theta, phi, theta_index, phi_index, size):
    """The flat vector of ``size`` coordinates with ``theta`` and ``phi`` in their places."""
    flat = jnp.zeros(size, jnp.result_type(theta, phi))
    return flat.at[theta_index].set(theta).at[phi_index].set(phi)


def potential_energy(target: MarginalTarget, phi, theta_start, corrected: bool = True):
    """``-log p~(phi | y)``, the chain's target, its inner search started at ``theta_start``;
    ``corrected=False``: without the quadrature's correction (the Laplace marginal alone)."""
    value, _, _, _ = laplace_marginal(target.log_density, phi, theta_start, target.tol(phi.dtype), target.max_iter,
                                      target.hessian, bool(target.quadrature) and corrected, target.batched,
                                      target.block_values)
    return -value


def correction(target: MarginalTarget, phi, mode, hess):
    r""":math:`c(\phi)` at the conditional mode (0 without delayed acceptance)."""
    if not target.delayed:
        return jnp.zeros((), phi.dtype)
    return quadrature_correction(target.log_density, phi, mode, target.hessian, hess, target.batched,
                                 target.block_values)


def found_mode(target: MarginalTarget, phi, theta_start):
    """``(mode, ok, hess, c(phi))``: the mode and its Hessian are all a draw needs, not the
    marginal's value or log-determinant."""
    mode, ok, hess = mode_search(target.log_density, phi, theta_start, target.tol(phi.dtype), target.max_iter,
                                 target.hessian)
    return mode, ok, hess, correction(target, phi, mode, hess)


def chain_state(target: MarginalTarget, hmc_state, theta_start, rng_key, tilt, found=None, rejected=None,
                moves=None) -> LaplaceNUTSState:
    """The chain's state at NUTS's point: the conditional mode there (``found``: already
    searched, ``(mode, ok, hess, correction)``), one draw of theta, the correction."""
    phi = hmc_state.z
    mode, ok, hess, corr = found if found is not None else found_mode(target, phi, theta_start)
    rng_key, key = jax.random.split(rng_key)
    eps = jax.random.normal(key, mode.shape, mode.dtype)
    theta = mode + target.hessian.curvature(hess).inv_sqrt(eps)  # N(mode, H^-1)
    z = joint_vector(theta, phi, target.theta_index, target.phi_index, target.size)
    # a failed solve at a kept point (it cannot be one: its potential is infinite) keeps the last start
    mode = jnp.where(ok, mode, theta_start)
    rejected = jnp.zeros((), bool) if rejected is None else rejected
    moves = no_moves(phi) if moves is None else moves
    return LaplaceNUTSState(z, hmc_state, mode, hess, ~ok, hmc_state.diverging, hmc_state.num_steps, rng_key, corr,
                            rejected, tilt, moves)


def sample_chain(target: MarginalTarget, sample_kernel, num_warmup: int, state: LaplaceNUTSState):
    r"""One iteration of a chain: NUTS's move (``sample_kernel``: NumPyro's ``hmc`` sampler over
    ``phi``, its potential the target's minus ``tilt . phi``), then, under delayed acceptance, the
    move kept with probability :math:`\min(1, e^{r(\phi') - r(\phi)})`, :math:`r = c - g^\top\phi`."""
    if not target.delayed:
        proposed = sample_kernel(state.hmc, model_args=(state.theta_mode, state.tilt))
        return chain_state(target, proposed, state.theta_mode, state.rng_key, state.tilt, moves=state.tilt_moves)
    # the tilt is re-taken at warm-up iterations 1, 2, 4, ... and the last, then fixed
    i, moves = state.hmc.i, state.tilt_moves
    warming = i < num_warmup
    retilt = warming & (moves[2] >= TILT_MIN_MOVES * state.tilt.size) & (
        ((i & (i - 1)) == 0) | (i == num_warmup - 1))
    tilt, old = jax.lax.cond(retilt, lambda: retilted(state), lambda: (state.tilt, state.hmc))
    moves = jax.tree.map(lambda fresh, kept: jnp.where(retilt, fresh, kept), no_moves(state.tilt), moves)
    proposed = sample_kernel(old, model_args=(state.theta_mode, tilt))
    # NUTS's move on the tilted Laplace marginal is kept with probability exp(r(phi') - r(phi));
    # a failed inner solve there is turned down
    mode, ok, hess, corr = found_mode(target, proposed.z, state.theta_mode)
    rng_key, key = jax.random.split(state.rng_key)
    log_u = jnp.log(jax.random.uniform(key, (), corr.dtype))
    log_ratio = corr - state.log_correction - jnp.dot(tilt, proposed.z - old.z)
    accept = ok & jnp.isfinite(corr) & (log_u < log_ratio)
    moves = moves_added(moves, proposed.z - old.z, corr - state.log_correction, warming & ok & jnp.isfinite(corr))
    # turned down: NUTS's point, gradient and potential go back; its adaptation and key go on
    hmc_state = proposed._replace(
        z=jnp.where(accept, proposed.z, old.z), z_grad=jnp.where(accept, proposed.z_grad, old.z_grad),
        potential_energy=jnp.where(accept, proposed.potential_energy, old.potential_energy))
    # turned down, the chain stays where its state's mode and Hessian are: no second search
    found = jax.lax.cond(accept, lambda: (mode, ok, hess, corr),
                         lambda: (state.theta_mode, jnp.ones((), bool), state.theta_hess, state.log_correction))
    return chain_state(target, hmc_state, state.theta_mode, rng_key, tilt, found, ~accept, moves)


def retilted(state: LaplaceNUTSState):
    """``(g, NUTS's state)``: the slope of :math:`c` over the recent moves
    (:func:`tilt_from_moves`), and NUTS's potential and its gradient at the chain's point
    moved from the old tilt to it (NUTS's potential is the Laplace marginal's minus ``tilt . phi``)."""
    tilt = _finite_or(tilt_from_moves(state.tilt_moves), state.tilt)
    shift = state.tilt - tilt
    hmc_state = state.hmc._replace(potential_energy=state.hmc.potential_energy + jnp.dot(shift, state.hmc.z),
                                   z_grad=state.hmc.z_grad + shift)
    return tilt, hmc_state


def chain_keys(rng_key):
    """A chain's keys: for its start (the init strategy), NUTS, and the draws of theta."""
    return jax.random.split(rng_key, 3)


def no_moves(phi):
    """``(S, b, n)``: no moves yet (:func:`tilt_from_moves`)."""
    return jnp.zeros((phi.size, phi.size), phi.dtype), jnp.zeros_like(phi), jnp.zeros((), jnp.int32)


def moves_added(moves, step, change, counted):
    """``moves`` with the move ``step`` (of phi) and its ``change`` (of c) added where ``counted``."""
    s, b, n = moves
    step, change = jnp.where(counted, step, 0.0), jnp.where(counted, change, 0.0)
    return s + jnp.outer(step, step), b + step * change, n + counted.astype(n.dtype)


def tilt_from_moves(moves):
    r"""The least-squares slope :math:`g` of the correction's change on the move,
    :math:`\Delta c \approx g^\top\Delta\phi`, from the sums :math:`S = \sum \Delta\phi\,\Delta\phi^\top`
    and :math:`b = \sum \Delta\phi\,\Delta c` over moves: :math:`g = S^{-1} b`, which makes
    :math:`\sum (\Delta c - g^\top\Delta\phi)^2`, the squared log acceptance ratios of delayed
    acceptance (module docstring), least. A relative ridge of 1e-6 keeps a direction no move
    took from a slope."""
    s, b, _ = moves
    ridge = 1e-6 * jnp.maximum(jnp.trace(s) / s.shape[0], jnp.finfo(s.dtype).tiny)
    return jnp.linalg.solve(s + ridge * jnp.eye(s.shape[0], dtype=s.dtype), b)


def _finite_or(tilt, fallback):
    """``tilt`` where every entry is finite, else ``fallback`` (the delayed acceptance stays exact
    for any finite tilt; a slope from moves that never left a point, a singular ``S``, is not one)."""
    return jnp.where(jnp.all(jnp.isfinite(tilt)), tilt, fallback)
