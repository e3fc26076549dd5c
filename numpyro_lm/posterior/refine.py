r"""Mixed Variational Inference: refine the Laplace Gaussian against a variational bound.

Kyriakopoulos-style MVI (Mixed Variational Inference, ``seeds/002``): keep the Laplace
Gaussian :math:`N(\mu_{LA}, \Sigma_{LA})`, parametrise part of it, and maximise the
Monte Carlo evidence lower bound with ``S`` standard normal draws :math:`z_s` drawn once
and kept fixed (so the objective is deterministic and L-BFGS applies):

.. math:: \mathcal{L}(\mu, C) = \frac1S \sum_{s=1}^S \log \tilde p(\mu + C z_s)
          + \tfrac12 \log|2\pi e\, C C^\top| .

The covariance "roots" ``C`` (paper Table 1, plus its baseline):

======== =========================================== =============================== ==========
method   root ``C``                                  initial value                   parameters
======== =========================================== =============================== ==========
mean     :math:`C_{LA}`, fixed                                                        D
eig      :math:`Q_{LA}\,\mathrm{diag}(r)`            ``r`` = sqrt of Sigma_LA's       2D
                                                     eigenvalues
lowrank  :math:`C_{LA} + u v^\top`                   ``u, v ~ N(0, 0.01 I)``          3D
diag     :math:`\mathrm{diag}(\sigma)` (VI_diag)     ``sigma^2 = diag(Sigma_LA)``     2D
dadvi    :math:`Q_{LA}\,\mathrm{diag}(e^{\rho})`     ``rho`` = log sqrt of            2D
                                                     Sigma_LA's eigenvalues
======== =========================================== =============================== ==========

and :math:`\mu` starts at :math:`\mu_{LA}`.

``"dadvi"`` is the refinement at about a Laplace fit's cost: deterministic ADVI (Giordano,
Ingram and Broderick 2024, "Black box variational inference with a deterministic
objective", JMLR 25) in the Laplace eigenbasis. A few hundred fixed draws
(:data:`DADVI_DRAWS`) make the bound a smooth deterministic function of the ``2 D``
parameters, which the package's damped Newton method (:func:`numpyro_lm.mode.newton.newton`:
its Hessian from ``2 D`` Hessian-vector products in one forward-over-reverse pass)
optimises from the Laplace Gaussian in a few steps; the other methods run L-BFGS over 1000
draws. Its fixed-draw optimum differs from the exact bound's by :math:`O(1/S)`. Entropies: :math:`\log|\det C_{LA}|`,
:math:`\sum\log|r_i|`, :math:`\log|\det C_{LA}| + \log|1 + v^\top C_{LA}^{-1} u|` (matrix
determinant lemma), :math:`\sum \log\sigma_i`.

:math:`C_{LA} = S = Q\,\mathrm{diag}(w^{-1/2})` is the Laplace curvature's square root from its
eigendecomposition (``spectrum``: :math:`S S^\top = \Sigma_{LA}`); the paper takes the Cholesky factor, another root of the
same covariance (the Gaussians reachable are the same). The refinement needs a dense
root: it is meant for models of up to a few thousand coordinates.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from ..core.curvature_choice import DenseMemoryError, available_bytes
from ..curvature import DenseCurvature, Gaussian
from ..mode.laplace_state import LaplaceState
from ..mode.lbfgs import lbfgs
from ..mode.newton import default_tol, newton, newton_init

__all__ = ["REFINE_METHODS", "DADVI_DRAWS", "MVI_DRAWS", "Refinement", "refine", "refine_gaussian",
           "evidence_lower_bound", "refine_bytes", "check_refine_memory"]

REFINE_METHODS = ("mean", "eig", "lowrank", "diag", "dadvi")
MVI_DRAWS = 1000
"""Fixed draws of the L-BFGS refinements where ``num_samples`` is not given."""
DADVI_DRAWS = 300
"""Fixed draws of ``"dadvi"`` where ``num_samples`` is not given. Giordano et al. use 30;
on ``benchmarks/refine.py``'s models 30 draws moved the marginals by 0.25-0.36 SD from NUTS
(the fixed draws' own noise: the plain Laplace fit was within 0.06 on two of them), 300 by
0.06-0.19 at two to three times a plain fit's cost."""


class Refinement(NamedTuple):
    """What a refinement did: the bound before (at the Laplace Gaussian) and after."""

    elbo_before: jnp.ndarray
    elbo_after: jnp.ndarray
    num_iter: jnp.ndarray
    grad_norm: jnp.ndarray


def _roots(method: str, gaussian: Gaussian, noise):
    """``(initial parameters, params -> (mean, C, log|det C|))`` of a refinement."""
    curv = gaussian.curvature
    d = gaussian.mean.shape[-1]
    # S = Q diag(w^-1/2) from H's own eigendecomposition (S S' = H^-1): the root fixes which
    # Gaussians C_LA + u v' reaches, so it is the same whatever the curvature stores (a dense
    # curvature decomposes its Jacobi-scaled form, whose root is another)
    w_la, q_la = curv.spectrum()
    root = q_la / jnp.sqrt(w_la)
    log_det_root = -0.5 * jnp.sum(jnp.log(w_la))

    if method == "mean":
        return gaussian.mean, lambda p: (p, root, log_det_root)
    if method == "eig":
        # the eigenvectors of the precision are those of the covariance (eigenvalues 1/w)
        w, q = curv.spectrum()
        return jnp.concatenate([gaussian.mean, 1.0 / jnp.sqrt(w)]), lambda p: (
            p[:d], q * p[d:], jnp.sum(jnp.log(jnp.abs(p[d:])))
        )
    if method == "lowrank":
        uv = 0.1 * noise  # u, v ~ N(0, 0.01 I)

        def unpack(p):
            u, v = p[d : 2 * d], p[2 * d :]
            lemma = 1.0 + v @ ((u @ q_la) * jnp.sqrt(w_la))  # det(S + u v') = det S (1 + v' S^-1 u)
            return p[:d], root + jnp.outer(u, v), log_det_root + jnp.log(jnp.abs(lemma))

        return jnp.concatenate([gaussian.mean, uv]), unpack
    if method == "dadvi":
        w, q = curv.spectrum()
        return jnp.concatenate([gaussian.mean, -0.5 * jnp.log(w)]), lambda p: (
            p[:d], q * jnp.exp(p[d:]), jnp.sum(p[d:])
        )
    if method == "diag":
        log_sigma = 0.5 * jnp.log(curv.variance())
        return jnp.concatenate([gaussian.mean, log_sigma]), lambda p: (
            p[:d], jnp.diag(jnp.exp(p[d:])), jnp.sum(p[d:])
        )
    raise ValueError(f"refine must be one of {REFINE_METHODS} or None, not {method!r}")


def evidence_lower_bound(log_density: Callable, mean, root, log_det_root, z):
    """The fixed-sample bound :math:`\\frac1S\\sum_s \\log p(\\mu + C z_s) + \\tfrac12\\log|2\\pi e CC^\\top|`."""
    d = mean.shape[-1]
    values = jax.vmap(log_density)(mean + z @ root.T)
    # a draw outside the support (-inf, NaN) makes the bound -inf, as it should
    values = jnp.where(jnp.isnan(values), -jnp.inf, values)
    return jnp.mean(values) + log_det_root + 0.5 * d * jnp.log(2.0 * jnp.pi * jnp.e)


def refine_gaussian(log_density: Callable, gaussian: Gaussian, method: str, z, noise, max_iter: int, gtol: float,
                    tol: Optional[float] = None):
    """MVI refinement of ``gaussian`` (module docstring): ``(Gaussian, Refinement)``.

    :param log_density: unnormalised log density over the flat coordinates.
    :param z: ``(S, D)`` fixed standard normal draws.
    :param noise: ``(2 D,)`` standard normal draws: the initial ``u, v`` of ``"lowrank"``.
    :param int max_iter: L-BFGS iterations (Newton evaluations for ``"dadvi"``).
    :param float gtol: L-BFGS stops when the largest gradient entry of the bound is below this.
    :param float tol: ``"dadvi"``'s Newton-decrement tolerance (default
        :func:`~numpyro_lm.mode.newton.default_tol`).
    """
    params0, unpack = _roots(method, gaussian, noise)

    def negative_bound(params):
        return -evidence_lower_bound(log_density, *unpack(params), z)

    before = -negative_bound(params0)
    if method == "dadvi":
        tol = default_tol(params0.dtype) if tol is None else tol
        state = newton(negative_bound, newton_init(params0), tol, max_iter)
        params, num_iter, grad_norm = state.x, state.num_iter, state.grad_norm
    else:
        params, num_iter, grad_norm = lbfgs(negative_bound, params0, gtol=gtol, max_iter=max_iter)
    after = -negative_bound(params)
    # keep the Laplace Gaussian if the optimiser made the bound worse or not finite
    better = jnp.isfinite(after) & (after >= before)
    mean, root, _ = unpack(jnp.where(better, params, params0))
    refined = Gaussian(mean, DenseCurvature.from_covariance(root @ root.T))
    return refined, Refinement(before, jnp.where(better, after, before), num_iter, grad_norm)


def refine_bytes(method: str, dim: int, observed_size: int, num_samples: Optional[int], itemsize: int) -> int:
    """What a refinement holds at once, roughly: the model's intermediates (taken as five times
    its observed and latent values) for every fixed draw, and for ``"dadvi"``'s Newton
    Hessian for each of its ``2 D`` Hessian-vector products as well."""
    if num_samples is None:
        num_samples = DADVI_DRAWS if method == "dadvi" else MVI_DRAWS
    products = 2 * dim if method == "dadvi" else 1
    return itemsize * 5 * num_samples * (observed_size + dim) * products


def check_refine_memory(layout, method: str, num_samples: Optional[int], itemsize: int):
    """Refuse a refinement that would not fit in memory, before anything is allocated."""
    need, have = refine_bytes(method, layout.size, layout.observed_size, num_samples, itemsize), available_bytes()
    if need > 0.8 * have:
        raise DenseMemoryError(
            f"refine={method!r} over {layout.size} latent coordinates and {layout.observed_size} observed values "
            f"would need about {need / 2**30:.1f} GiB ({have / 2**30:.1f} GiB available): it evaluates the model at "
            "every fixed draw" + (" for each of its 2 D Hessian-vector products" if method == "dadvi" else "")
            + ". Leave refine out (large models are refined by nested Laplace over their hyperparameters), pass "
            "fewer refine_num_samples, or choose refine='mean' or 'diag'.")


def refine(log_density: Callable, state: LaplaceState, method: str, rng_key, *, num_samples: Optional[int] = None,
           max_iter: int = 200, gtol: float = 1e-3, tol: Optional[float] = None):
    """MVI refinement of a Laplace fit: ``(LaplaceState, Refinement)``.

    The ``num_samples`` fixed draws (default :data:`DADVI_DRAWS` for ``"dadvi"``,
    :data:`MVI_DRAWS` otherwise; and ``"lowrank"``'s initial ``u, v``) come from
    ``rng_key``. The refined state keeps the mode's ``log_density`` and ``info``; its
    ``mode`` and ``curvature`` are the refined Gaussian's mean and precision.
    """
    if num_samples is None:
        num_samples = DADVI_DRAWS if method == "dadvi" else MVI_DRAWS
    d = state.mode.shape[-1]
    dtype = state.mode.dtype
    z = jax.random.normal(jax.random.fold_in(rng_key, 0), (num_samples, d), dtype)
    noise = jax.random.normal(jax.random.fold_in(rng_key, 1), (2 * d,), dtype)
    refined, info = refine_gaussian(log_density, state.gaussian, method, z, noise, max_iter, gtol, tol)
    return state._replace(mode=refined.mean, curvature=refined.curvature), info
