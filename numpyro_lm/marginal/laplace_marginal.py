r"""The Laplace marginal of a model's hyperparameters, and its gradient by implicit differentiation.

The latent coordinates of a model split into hyperparameters :math:`\phi` (global scales,
locations: few) and a latent field :math:`\theta` (sites inside plates, Gaussian-process
values: many), both in their Laplace Matching bases. The *Laplace marginal* is

.. math:: \log \tilde p(\phi \mid y) = \log p(y, \theta^*(\phi), \phi)
          + \tfrac{d}{2}\log 2\pi - \tfrac12 \log\det H(\phi) + \text{const},

with :math:`\theta^*(\phi) = \arg\max_\theta \log p(y, \theta, \phi)` found by the package's
Newton method (:func:`numpyro_lm.mode.laplace_state.laplace_update`) and :math:`H(\phi)` the negative
Hessian in :math:`\theta` there (Tierney and Kadane 1986; Rue, Martino and Chopin 2009). The
gradient in :math:`\phi` goes through :math:`\theta^*` by the implicit function theorem:
:math:`\nabla_\theta \log p = 0` at the mode, so
:math:`\partial\theta^*/\partial\phi = H^{-1}\,\partial^2_{\theta\phi}\log p`, applied as one
linear solve and one vector-Jacobian product (:func:`conditional_mode`, a ``custom_vjp``):
the Newton iterations are never differentiated. Margossian et al. (2020, "Hamiltonian Monte
Carlo using an adjoint-differentiated Laplace approximation") and blackjax's ``laplace_hmc``
do the same for a hand-written ``log_joint(theta, phi)``; here any NumPyro model works.

Where the field is one scalar per plate entry given :math:`\phi` (a random intercept per
group), each entry's integral can be taken by adaptive Gauss-Hermite quadrature about its mode
(:func:`~numpyro_lm.marginal.quadrature.block_quadrature_correction`, 25 model gradients):
Laplace underestimates a binary group's spread and with it the variance component (Breslow
and Lin 1995; lme4's ``glmer(nAGQ=)``); :func:`quadrature_correction` is the log of the ratio,
:math:`c(\phi)`. :class:`~numpyro_lm.samplers.laplace_nuts.LaplaceNUTS` samples from these.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from ..core.curvature_choice import hessian_for
from ..core.trace import Layout
from ..mode.hessian import ArrowheadHessian, DenseHessian, plate_structure, structure_tol
from ..mode.newton import is_converged, newton, newton_init, newton_iteration, running
from .quadrature import block_quadrature_correction

__all__ = ["conditional_mode", "mode_search", "inner_search", "laplace_marginal", "quadrature_correction",
           "scalar_blocks", "theta_layout", "inner_hessian", "INNER_CURVATURES"]


@partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4, 5, 6))
def conditional_mode(log_density, phi, theta0, tol, max_iter, hessian=DenseHessian(), unverified_step=False):
    r"""``(theta*, converged)``: the mode of ``log_density(theta, phi)`` in ``theta`` by Newton
    from ``theta0``, differentiable in ``phi`` by the implicit function theorem (module
    docstring); ``converged`` is False where the search stopped short or found no mode.
    ``hessian``: the search's Hessian strategy (:mod:`numpyro_lm.mode.hessian`).

    ``unverified_step``: stop where the next Newton step is predicted to land within ``tol``
    and take it without evaluating there (:func:`_newton_predicted`), for a caller that
    evaluates the model at ``theta*`` anyway and checks the decrement there
    (:func:`laplace_marginal`): one evaluation fewer per search where Newton took three.
    """
    return _solve(log_density, phi, theta0, tol, max_iter, hessian, unverified_step)


def _solve(log_density, phi, theta0, tol, max_iter, hessian, unverified_step=False):
    theta, ok, _ = _search(log_density, phi, theta0, tol, max_iter, hessian, unverified_step)
    return theta, ok


def _search(log_density, phi, theta0, tol, max_iter, hessian, unverified_step):
    if not unverified_step:
        return mode_search(log_density, phi, theta0, tol, max_iter, hessian)
    state, early = _newton_predicted(lambda theta: -log_density(theta, phi), theta0, tol, max_iter, hessian)
    theta = state.x + jnp.where(early, state.step, jnp.zeros_like(state.step))
    return theta, _found_mode(state, early), state.hess


EARLY_MAX_DECREMENT = 0.5
"""The largest decrement (posterior SDs) from which an unverified Newton step is taken: the
implicit gradient then uses the Hessian of the point one step (at most this) before the mode.
NUTS stays exact with any gradient that is a function of the point (the leapfrog map is then
reversible and volume-preserving); on the 1000-group GLMM the gradients moved by 1e-5 relative
(0.1 here: 6e-6, with 12% saved per evaluation instead of 19%)."""


def _newton_predicted(fn, theta0, tol, max_iter, hessian):
    r"""``(Newton state, stopped early)``: :func:`~numpyro_lm.mode.newton.newton` on ``fn``, but
    stopped after an accepted evaluation whose *next* step is predicted to land within ``tol``.
    Newton converges quadratically, :math:`\lambda_{k+1} \approx c\,\lambda_k^2`; with
    :math:`c` read off the last two decrements the prediction is
    :math:`\lambda_k^3 / \lambda_{k-1}^2 \le tol / 2`, trusted only from a decrement of at most
    :data:`EARLY_MAX_DECREMENT`. On a 1000-group logistic GLMM the decrements from a leapfrog
    step away run 2, 0.008, 4e-6 (c = 0.002): stopped after the second evaluation of three."""
    state = newton_init(theta0, hessian)

    def stop_early(s, previous):
        predicted = s.decrement**3 / previous**2
        return (jnp.isfinite(previous) & (s.t == 1) & (s.decrement <= EARLY_MAX_DECREMENT)
                & (predicted <= 0.5 * tol) & s.positive & jnp.isfinite(s.value))

    def cond(carry):
        s, previous = carry
        return running(s, max_iter) & ~stop_early(s, previous)

    def body(carry):
        s, previous = carry
        new = newton_iteration(fn, s, tol, hessian)
        return new, jnp.where(new.t == 1, s.decrement, previous)  # t = 1: the trial was accepted

    state, previous = jax.lax.while_loop(cond, body, (state, jnp.asarray(jnp.inf, theta0.dtype)))
    return state, stop_early(state, previous) & ~(state.converged & state.polished)


def mode_search(log_density, phi, theta0, tol, max_iter, hessian):
    """``(theta*, ok, the strategy's Hessian of -log p at theta*)``."""
    state = inner_search(log_density, phi, theta0, tol, max_iter, hessian)
    return state.x, _found_mode(state), state.hess


def inner_search(log_density, phi, theta0, tol, max_iter, hessian=DenseHessian()):
    """The inner Newton search of every conditional Laplace marginal of the package (LaplaceNUTS's
    potential, nested Laplace's conditional fits: :func:`~.conditional.conditional_fit`): the
    :class:`~numpyro_lm.mode.newton.NewtonState` at the mode of ``log_density(theta, phi)`` in
    ``theta`` from ``theta0``, its Hessian the strategy's at that point."""
    return newton(lambda theta: -log_density(theta, phi), newton_init(theta0, hessian), tol, max_iter, hessian)


def scalar_blocks(hessian) -> bool:
    """Whether the strategy is the block-arrowhead with one coordinate per block (where the
    Gauss-Hermite correction applies)."""
    return isinstance(hessian, ArrowheadHessian) and hessian.structure.local_index.shape[1] == 1


def _found_mode(state, stopped_early=False):
    ok = (state.converged | stopped_early) & state.positive & jnp.isfinite(state.value)
    return ok & (state.structure_error <= structure_tol(state.x.dtype))


def _mode_fwd(log_density, phi, theta0, tol, max_iter, hessian, unverified_step):
    theta, ok, hess = _search(log_density, phi, theta0, tol, max_iter, hessian, unverified_step)
    return (theta, ok), (theta, phi, hess)


def _mode_bwd(log_density, tol, max_iter, hessian, unverified_step, residual, cotangent):
    # the search's last Hessian: at its end point, or one unverified step before it (an error
    # of the order of that step's decrement, at most EARLY_MAX_DECREMENT, in the gradient)
    theta, phi, hess = residual
    return _implicit_vjp(log_density, hessian, theta, phi, hess, cotangent[0]), jnp.zeros_like(theta)


def _implicit_vjp(log_density, hessian, theta, phi, hess, theta_bar):
    """The cotangent of ``phi`` for ``theta_bar`` on the mode ``theta``: d theta*/d phi =
    H^-1 d2 log p / d theta d phi (module docstring), its transpose applied to ``theta_bar``."""
    if isinstance(hessian, DenseHessian):
        u = jnp.linalg.solve(hess, theta_bar)
    else:
        u = hessian.curvature(hess).solve(theta_bar)
    return jax.grad(lambda p: jnp.vdot(jax.grad(log_density)(theta, p), u))(phi)


conditional_mode.defvjp(_mode_fwd, _mode_bwd)


def laplace_marginal(log_density, phi, theta0, tol, max_iter, hessian=DenseHessian(), quadrature: bool = False,
                     batched: bool = False, values=None):
    r"""``(log p~(phi | y) up to a constant, theta*, the strategy's Hessian at theta*, ok)``
    (module docstring). Where the inner solve failed the value is ``-inf``. ``quadrature``:
    where the Hessian is block-arrowhead with scalar blocks (a random intercept per group),
    each block's integral by adaptive Gauss-Hermite quadrature instead of Laplace
    (:func:`~numpyro_lm.marginal.quadrature.block_quadrature_correction`, differentiated like
    the rest; ``batched``: its gradients at once, see there; ``values``: :func:`quadrature_correction`'s)."""
    # the search's last step is verified here, where the model is evaluated anyway
    theta, ok = conditional_mode(log_density, phi, theta0, tol, max_iter, hessian, True)
    value, grad, hess, _ = hessian.evaluate(lambda t: -log_density(t, phi), theta)
    half_logdet, positive, decrement = _half_logdet(hessian, hess, grad)
    out = -value + 0.5 * theta.shape[-1] * jnp.log(2.0 * jnp.pi) - half_logdet
    if quadrature and scalar_blocks(hessian):
        out = out + quadrature_correction(log_density, phi, theta, hessian, hess, batched, values)
    ok = ok & positive & is_converged(decrement, jax.lax.stop_gradient(value), tol) & jnp.isfinite(out)
    return jnp.where(ok, out, -jnp.inf), theta, hess, ok


def quadrature_correction(log_density, phi, theta, hessian, hess, batched, values=None):
    r""":math:`c(\phi)`: the scalar blocks' Gauss-Hermite correction at the conditional mode.
    ``values(theta, phi) -> (J,)``: each block's own terms of the log density
    (:mod:`~numpyro_lm.marginal.block_terms`), read at the nodes instead of integrating slopes."""
    at = None if values is None else (lambda t: values(t, phi))
    return block_quadrature_correction(lambda t: log_density(t, phi), theta, hessian.structure.local_index[:, 0],
                                        hessian.curvature(hess).a[:, 0, 0], batched, values=at)


def _half_logdet(hessian, hess, grad):
    """``(log det H / 2, H positive definite, Newton decrement sqrt(g' H^-1 g))``, the first
    differentiable: JAX's own Cholesky (the package's batched one has no derivative rule) or
    the arrowhead's block factor; the decrement (a check, not differentiated) from the same."""
    grad = jax.lax.stop_gradient(grad)
    if isinstance(hessian, DenseHessian):
        chol = jnp.linalg.cholesky(hess)
        scaled = jax.scipy.linalg.solve_triangular(jax.lax.stop_gradient(chol), grad, lower=True)
        return jnp.sum(jnp.log(jnp.diagonal(chol))), jnp.all(jnp.isfinite(chol)), jnp.linalg.norm(scaled)
    curvature = hessian.curvature(hess)
    solved = jax.lax.stop_gradient(curvature).solve(grad)
    return 0.5 * curvature.logdet(), curvature.positive(), jnp.sqrt(jnp.maximum(jnp.dot(grad, solved), 0.0))


def theta_layout(layout, theta_sites) -> Layout:
    """The layout of the latent field alone (its sites, offsets counted within it): the
    structured curvatures (:mod:`numpyro_lm.mode.hessian`) read its plates."""
    sites, offset = [], 0
    for s in layout.sites:
        if s.name in theta_sites:
            sites.append(s._replace(offset=offset))
            offset += s.size
    return Layout(tuple(sites), offset)


INNER_CURVATURES = ("auto", "dense", "arrowhead")
QUADRATURE_BATCH_MAX = 2**22
"""Numbers (latent and observed, times :data:`~numpyro_lm.marginal.quadrature.SLOPE_POINTS`) up to
which the quadrature's gradients run at once (``vmap``): about 0.1 GB of a model's
intermediates in float32; above, one after another."""
INNER_ARROWHEAD_MIN_DIM = 32
"""Field coordinates above which ``"auto"`` takes a plate's block-arrowhead Hessian. Lower than
the joint fit's :data:`~numpyro_lm.mode.hessian.ARROWHEAD_MIN_DIM`: the inner Hessian is formed at
every gradient of every leapfrog step, and differentiated (a GLMM with 100 groups: 2 coloured
Hessian-vector products instead of 100)."""


def inner_hessian(layout, curvature: str = "auto"):
    """The inner search's Hessian strategy: ``"dense"``, ``"arrowhead"`` (the field's plate),
    or ``"auto"``: the arrowhead above :data:`INNER_ARROWHEAD_MIN_DIM` field coordinates where
    a plate gives one (a GLMM's random effects: one block per group), else dense."""
    if curvature == "auto":
        structured = layout.size > INNER_ARROWHEAD_MIN_DIM and plate_structure(layout) is not None
        curvature = "arrowhead" if structured else "dense"
    hessian = hessian_for(layout, curvature)
    # warm-started searches rarely reject a trial: the value alone first would cost every
    # accepted one a forward pass more than the linearised evaluation of numpyro_lm.mode.hessian
    return hessian._replace(value_first=False) if isinstance(hessian, ArrowheadHessian) else hessian
