r"""The Laplace marginal of a model's hyperparameters, and its gradient by implicit differentiation.

The latent coordinates of a model split into hyperparameters :math:`\phi` (global scales,
locations: few) and a latent field :math:`\theta` (sites inside plates, Gaussian-process
values: many), both in their Laplace Matching bases. The *Laplace marginal* is

.. math:: \log \tilde p(\phi \mid y) = \log p(y, \theta^*(\phi), \phi)
          + \tfrac{d}{2}\log 2\pi - \tfrac12 \log\det H(\phi) + \text{const},

with :math:`\theta^*(\phi) = \arg\max_\theta \log p(y, \theta, \phi)` found by the package's
Newton method (:func:`numpyro_lm.laplace.laplace_update`) and :math:`H(\phi)` the negative
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
(:func:`~numpyro_lm.nested.quadrature.block_quadrature_correction`, 25 model gradients):
Laplace underestimates a binary group's spread and with it the variance component (Breslow
and Lin 1995; lme4's ``glmer(nAGQ=)``); :func:`quadrature_correction` is the log of the ratio,
:math:`c(\phi)`. :class:`~numpyro_lm.laplace_nuts.LaplaceNUTS` samples from these.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from .curvature_choice import hessian_for
from .hessian import ArrowheadHessian, DenseHessian, plate_structure, structure_tol
from .laplace import laplace_init, laplace_update
from .nested.inner import scalar_blocks
from .nested.quadrature import block_quadrature_correction
from .trace import Layout

__all__ = ["conditional_mode", "mode_search", "laplace_marginal", "quadrature_correction", "theta_layout",
           "inner_hessian", "INNER_CURVATURES"]


@partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4, 5))
def conditional_mode(log_density, phi, theta0, tol, max_iter, hessian=DenseHessian()):
    r"""``(theta*, converged)``: the mode of ``log_density(theta, phi)`` in ``theta`` by Newton
    from ``theta0``, differentiable in ``phi`` by the implicit function theorem (module
    docstring); ``converged`` is False where the search stopped short or found no mode.
    ``hessian``: the search's Hessian strategy (:mod:`numpyro_lm.hessian`)."""
    return _solve(log_density, phi, theta0, tol, max_iter, hessian)


def _solve(log_density, phi, theta0, tol, max_iter, hessian):
    theta, ok, _ = mode_search(log_density, phi, theta0, tol, max_iter, hessian)
    return theta, ok


def mode_search(log_density, phi, theta0, tol, max_iter, hessian):
    """``(theta*, ok, the strategy's Hessian of -log p at theta*)``."""
    fn = lambda theta: log_density(theta, phi)
    state = laplace_update(fn, laplace_init(fn, theta0, hessian=hessian), tol=tol, max_iter=max_iter,
                           hessian=hessian)
    ok = state.converged & state.positive & jnp.isfinite(state.value)
    return state.x, ok & (state.structure_error <= structure_tol(state.x.dtype)), state.hess


def _mode_fwd(log_density, phi, theta0, tol, max_iter, hessian):
    theta, ok, hess = mode_search(log_density, phi, theta0, tol, max_iter, hessian)
    return (theta, ok), (theta, phi, hess)


def _mode_bwd(log_density, tol, max_iter, hessian, residual, cotangent):
    theta, phi, hess = residual  # the search's last Hessian is the one at its end point
    if isinstance(hessian, DenseHessian):
        u = jnp.linalg.solve(hess, cotangent[0])
    else:
        u = hessian.curvature(hess).solve(cotangent[0])
    # d theta*/d phi = H^-1 d2 log p / d theta d phi: its transpose applied to the cotangent
    grad_phi = jax.grad(lambda p: jnp.vdot(jax.grad(log_density)(theta, p), u))(phi)
    return grad_phi, jnp.zeros_like(theta)


conditional_mode.defvjp(_mode_fwd, _mode_bwd)


def laplace_marginal(log_density, phi, theta0, tol, max_iter, hessian=DenseHessian(), quadrature: bool = False,
                     batched: bool = False):
    r"""``(log p~(phi | y) up to a constant, theta*, the strategy's Hessian at theta*, ok)``
    (module docstring). Where the inner solve failed the value is ``-inf``. ``quadrature``:
    where the Hessian is block-arrowhead with scalar blocks (a random intercept per group),
    each block's integral by adaptive Gauss-Hermite quadrature instead of Laplace
    (:func:`~numpyro_lm.nested.quadrature.block_quadrature_correction`, differentiated like
    the rest; ``batched``: its gradients at once, see there)."""
    theta, ok = conditional_mode(log_density, phi, theta0, tol, max_iter, hessian)
    value, _, hess, _ = hessian.evaluate(lambda t: -log_density(t, phi), theta)
    half_logdet, positive = _half_logdet(hessian, hess)
    out = -value + 0.5 * theta.shape[-1] * jnp.log(2.0 * jnp.pi) - half_logdet
    if quadrature and scalar_blocks(hessian):
        out = out + quadrature_correction(log_density, phi, theta, hessian, hess, batched)
    ok = ok & positive & jnp.isfinite(out)
    return jnp.where(ok, out, -jnp.inf), theta, hess, ok


def quadrature_correction(log_density, phi, theta, hessian, hess, batched):
    r""":math:`c(\phi)`: the scalar blocks' Gauss-Hermite correction at the conditional mode."""
    return block_quadrature_correction(lambda t: log_density(t, phi), theta, hessian.structure.local_index[:, 0],
                                        hessian.curvature(hess).a[:, 0, 0], batched)


def _half_logdet(hessian, hess):
    """``(log det H / 2, H positive definite)``, differentiable: JAX's own Cholesky (the
    package's batched one has no derivative rule) or the arrowhead's block factor."""
    if isinstance(hessian, DenseHessian):
        chol = jnp.linalg.cholesky(hess)
        return jnp.sum(jnp.log(jnp.diagonal(chol))), jnp.all(jnp.isfinite(chol))
    curvature = hessian.curvature(hess)
    return 0.5 * curvature.logdet(), curvature.positive()


def theta_layout(layout, theta_sites) -> Layout:
    """The layout of the latent field alone (its sites, offsets counted within it): the
    structured curvatures (:mod:`numpyro_lm.hessian`) read its plates."""
    sites, offset = [], 0
    for s in layout.sites:
        if s.name in theta_sites:
            sites.append(s._replace(offset=offset))
            offset += s.size
    return Layout(tuple(sites), offset)


INNER_CURVATURES = ("auto", "dense", "arrowhead")
QUADRATURE_BATCH_MAX = 2**22
"""Numbers (latent and observed, times :data:`~numpyro_lm.nested.quadrature.SLOPE_POINTS`) up to
which the quadrature's gradients run at once (``vmap``): about 0.1 GB of a model's
intermediates in float32; above, one after another."""
INNER_ARROWHEAD_MIN_DIM = 32
"""Field coordinates above which ``"auto"`` takes a plate's block-arrowhead Hessian. Lower than
the joint fit's :data:`~numpyro_lm.hessian.ARROWHEAD_MIN_DIM`: the inner Hessian is formed at
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
    # accepted one a forward pass more (a 1000-group GLMM's gradient: 1.5 -> 1.1 ms with the
    # linearised evaluation of numpyro_lm.hessian)
    return hessian._replace(value_first=False) if isinstance(hessian, ArrowheadHessian) else hessian
