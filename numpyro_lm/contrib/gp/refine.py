r"""Re-linearising LM + GP's pseudo-observations at the GP's posterior mean: Newton's method for
the latent GP's mode, started from Laplace Matching.

Each group's pseudo-observation is the Laplace approximation of its log-likelihood
:math:`\ell_g(f)` (in the family's basis) at that likelihood's own mode
(:mod:`~numpyro_lm.contrib.gp.pseudo`). Multiplied together under the GP prior, these expansions are
taken at different points from the posterior's mode, and their skew adds up: a Poisson count's
site sits at :math:`\log y`, which is biased low for small counts; a covariance's at the log of
its sample covariance, biased low by about :math:`\psi(n/2) - \log(n/2)` per eigenvalue. Pooled
over many groups by a long lengthscale, the bias stays while the posterior SD shrinks
(measured on the benchmark's 235 months: 68 % of the true entries within 2 SD).

Re-expanding every :math:`\ell_g` at the GP's current posterior mean :math:`\hat f_g`,

.. math:: S_g = (-\nabla^2 \ell_g(\hat f_g))^{-1}, \qquad
          \mu_g = \hat f_g + S_g \nabla \ell_g(\hat f_g),

and solving the GP regression again with these pseudo-observations is one Newton step on
:math:`\log p(f) + \sum_g \ell_g(f_g)` (Rasmussen & Williams 2006, Algorithm 3.1 and eq. 3.18:
:math:`f^{new} = (K^{-1} + W)^{-1}(W f + \nabla \log p(y \mid f))`, with blocks for vector
sites). Its fixed point is the posterior mode, where the GP's predictive on the sites is the
Laplace GP's (R & W eq. 3.21-3.24): the joint Laplace approximation of the full latent GP, at
one GP solve per step instead of a generic optimiser over all the latent values. Laplace
Matching's sites are the start; for binary labels, counts and categories :math:`\ell_g` is
concave in its basis (logit, log, softmax) and a handful of steps converge.

The log-likelihoods are the ones whose modes give :mod:`~numpyro_lm.contrib.gp.pseudo`'s sites (with the
prior's :math:`\epsilon` in the counts): :math:`a\log\sigma(f) + b\log\sigma(-f)` (binary, the
Beta's parameters), :math:`a f - r e^f` (counts, the Gamma's shape and rate),
:math:`\sum_k \alpha_k \log\mathrm{softmax}(V y)_k` (categories) and the inverse Wishart's
likelihood of :math:`\mathrm{expm}(S)` (covariances).
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve
from numpyro.distributions.transforms import ZeroSumTransform

from .blocks import observation_covariance, output_kernel_matrix
from .pseudo import PseudoObservations, covariance_log_likelihood
from .regression import KernelParams, rbf_kernel
from ...runtime.precision import precise_jit

__all__ = ["site_log_likelihood", "relinearised_sites", "posterior_mean_at_groups", "relinearise"]


def site_log_likelihood(kind: str, params: dict, f):
    r""":math:`\ell_g(f)` of one group (``params``: its entries of :attr:`PseudoObservations.params`)
    at the basis value ``f`` (a scalar, or a vector for the block kinds)."""
    if kind == "binary":
        return params["concentration1"] * jax.nn.log_sigmoid(f) + params["concentration0"] * jax.nn.log_sigmoid(-f)
    if kind == "counts":
        return params["concentration"] * f - params["rate"] * jnp.exp(f)
    if kind == "categorical":
        return jnp.sum(params["concentration"] * jax.nn.log_softmax(ZeroSumTransform()(f)))
    p = params["scale_matrix"].shape[-1]
    return covariance_log_likelihood(params["concentration"] + p + 1, params["scale_matrix"], f)


def relinearised_sites(kind: str, params: dict, f):
    """``(mean, noise)`` of every group's pseudo-observation expanded at ``f`` (``(m,)`` or
    ``(m, D)``): the module docstring's :math:`\\mu_g` and :math:`S_g`."""
    def one(group, value):
        flat = jnp.atleast_1d(value)
        loglik = lambda v: site_log_likelihood(kind, group, v.reshape(jnp.shape(value)))  # noqa: E731
        grad, hess = jax.grad(loglik)(flat), jax.hessian(loglik)(flat)
        noise = jnp.linalg.inv(-hess)
        noise = 0.5 * (noise + noise.T)
        return (flat + noise @ grad).reshape(jnp.shape(value)), noise.reshape(jnp.shape(value) * 2)

    return jax.vmap(one)(params, f)


def posterior_mean_at_groups(kernel_params: KernelParams, inputs, mean, noise, output_kernel, kernel: Callable):
    r""":math:`\hat f = m + (K \otimes \tilde B)\, \alpha` at the groups' own inputs,
    :math:`\alpha = A^{-1}(\mathbf{y} - 1 \otimes m)`; since :math:`A = K \otimes \tilde B +
    \mathrm{blockdiag}(S_g)`, that is :math:`\hat f_g = \mu_g - S_g \alpha_g`."""
    chol = jnp.linalg.cholesky(observation_covariance(kernel_params, inputs, noise, output_kernel, kernel))
    alpha = cho_solve((chol, True), (mean - kernel_params.mean).reshape(-1)).reshape(mean.shape)
    if mean.ndim == 1:
        return mean - noise * alpha
    return mean - jnp.einsum("gab,gb->ga", noise, alpha)


@partial(precise_jit, static_argnums=(0, 1, 2))
def _newton(kind, kernel, num_steps, params, kernel_params, inputs, mean, noise, output_kernel):
    def step(carry, _):
        mean, noise, f = carry
        f_new = posterior_mean_at_groups(kernel_params, inputs, mean, noise, output_kernel, kernel)
        mean, noise = relinearised_sites(kind, params, f_new)
        return (mean, noise, f_new), jnp.max(jnp.abs(f_new - f))

    f0 = posterior_mean_at_groups(kernel_params, inputs, mean, noise, output_kernel, kernel)
    mean, noise = relinearised_sites(kind, params, f0)
    (mean, noise, _), change = jax.lax.scan(step, (mean, noise, f0), None, length=num_steps)
    return mean, noise, change


def relinearise(pseudo: PseudoObservations, kernel_params: KernelParams, *, num_steps: int = 10,
                output_kernel: Optional[object] = None, kernel: Callable = rbf_kernel):
    """``(pseudo-observations re-expanded at the posterior mode, largest change of the posterior
    mean per step)``: ``num_steps`` Newton steps (module docstring) at fixed hyperparameters. The
    returned sites keep ``pseudo``'s inputs, groups and conjugate parameters; the GP on them
    predicts as the Laplace GP does once the change has died away."""
    dtype = jnp.result_type(float)
    block = pseudo.mean.ndim == 2
    b = output_kernel_matrix(pseudo, output_kernel, dtype) if block else jnp.zeros((), dtype)
    params = {k: jnp.asarray(v, dtype) for k, v in pseudo.params.items()}
    data = tuple(jnp.asarray(a, dtype) for a in (pseudo.inputs, pseudo.mean, pseudo.noise))
    mean, noise, change = _newton(pseudo.kind, kernel, int(num_steps), params, kernel_params, *data, b)
    return pseudo._replace(mean=np.asarray(mean, np.float64), noise=np.asarray(noise, np.float64)), change
