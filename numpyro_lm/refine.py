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
mean     :math:`C_{LA}` (Cholesky of Sigma_LA), fixed                                 D
eig      :math:`Q_{LA}\,\mathrm{diag}(r)`            ``r`` = sqrt of Sigma_LA's       2D
                                                     eigenvalues
lowrank  :math:`C_{LA} + u v^\top`                   ``u, v ~ N(0, 0.01 I)``          3D
diag     :math:`\mathrm{diag}(\sigma)` (VI_diag)     ``sigma^2 = diag(Sigma_LA)``     2D
======== =========================================== =============================== ==========

and :math:`\mu` starts at :math:`\mu_{LA}`. Entropies: :math:`\log|\det C_{LA}|`,
:math:`\sum\log|r_i|`, :math:`\log|\det C_{LA}| + \log|1 + v^\top C_{LA}^{-1} u|` (matrix
determinant lemma), :math:`\sum \log\sigma_i`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from .laplace import Gaussian, initial_state, lbfgs_minimize

__all__ = ["REFINE_METHODS", "Refinement", "refine_gaussian", "gaussian_from_cov"]

REFINE_METHODS = ("mean", "eig", "lowrank", "diag")


class Refinement(NamedTuple):
    """What a refinement did: the bound before (at the Laplace Gaussian) and after."""

    elbo_before: jnp.ndarray
    elbo_after: jnp.ndarray
    num_iter: jnp.ndarray
    grad_norm: jnp.ndarray


def _roots(method: str, gaussian: Gaussian, noise):
    """``(initial parameters, params -> (mean, C, log|det C|))`` of a refinement."""
    d = gaussian.mean.shape[-1]
    chol = jnp.linalg.cholesky(gaussian.cov)
    log_det_chol = jnp.sum(jnp.log(jnp.diagonal(chol)))

    if method == "mean":
        return gaussian.mean, lambda p: (p, chol, log_det_chol)
    if method == "eig":
        # the eigenvectors of the precision are those of the covariance (eigenvalues 1/w)
        q = gaussian.eigenvectors
        r0 = 1.0 / jnp.sqrt(gaussian.eigenvalues)
        return jnp.concatenate([gaussian.mean, r0]), lambda p: (
            p[:d], q * p[d:], jnp.sum(jnp.log(jnp.abs(p[d:])))
        )
    if method == "lowrank":
        uv = 0.1 * noise  # u, v ~ N(0, 0.01 I)

        def unpack(p):
            u, v = p[d : 2 * d], p[2 * d :]
            lemma = 1.0 + v @ solve_triangular(chol, u, lower=True)
            return p[:d], chol + jnp.outer(u, v), log_det_chol + jnp.log(jnp.abs(lemma))

        return jnp.concatenate([gaussian.mean, uv]), unpack
    if method == "diag":
        log_sigma = 0.5 * jnp.log(jnp.diagonal(gaussian.cov))
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


def gaussian_from_cov(mean, cov) -> Gaussian:
    """A :class:`~numpyro_lm.laplace.Gaussian` from its mean and covariance."""
    cov = 0.5 * (cov + cov.T)
    eigval, eigvec = jnp.linalg.eigh(cov)
    # the precision's eigenvalues ascending, as everywhere else (reversed: 1 / ascending)
    eigval, eigvec = eigval[::-1], eigvec[:, ::-1]
    return Gaussian(mean, (eigvec / eigval) @ eigvec.T, 1.0 / eigval, eigvec, cov)


def refine_gaussian(log_density: Callable, gaussian: Gaussian, method: str, z, noise, max_iter: int, gtol: float):
    """MVI refinement of ``gaussian`` (module docstring): ``(Gaussian, Refinement)``.

    :param log_density: unnormalised log density over the flat coordinates.
    :param z: ``(S, D)`` fixed standard normal draws.
    :param noise: ``(2 D,)`` standard normal draws: the initial ``u, v`` of ``"lowrank"``.
    :param int max_iter: L-BFGS iterations.
    :param float gtol: stop when the largest gradient entry of the bound is below this.
    """
    params0, unpack = _roots(method, gaussian, noise)

    def negative_bound(params):
        return -evidence_lower_bound(log_density, *unpack(params), z)

    before = -negative_bound(params0)
    state = lbfgs_minimize(negative_bound, initial_state(params0), gtol=gtol, max_iter=max_iter)
    after = -state.value
    # keep the Laplace Gaussian if the optimiser made the bound worse or not finite
    better = jnp.isfinite(after) & (after >= before)
    params = jnp.where(better, state.x, params0)
    mean, root, _ = unpack(params)
    refined = gaussian_from_cov(mean, root @ root.T)
    return refined, Refinement(before, jnp.where(better, after, before), state.num_iter, state.grad_norm)
