r"""Dirichlet(alpha) matched in the softmax basis: the Laplace Bridge.

With ``x = softmax(z)`` over zero-sum logits ``z`` (``1'z = 0``) the density of ``z`` is
proportional to :math:`\prod_k x_k^{\alpha_k}`. Its mode and curvature on the zero-sum
plane give (Hennig et al. 2012; Hobbhahn, Kristiadi and Hennig 2022, "Fast predictive
uncertainty for classification with Bayesian deep networks", Appendix; LM paper B.4)

.. math:: \mu_k = \log\alpha_k - \frac1K\sum_l \log\alpha_l, \qquad
          \Sigma = P\,\mathrm{diag}(1/\alpha)\,P, \quad P = I - \tfrac1K 11^\top,

i.e. :math:`\Sigma_{kl} = \delta_{kl}/\alpha_k - \frac1K[1/\alpha_k + 1/\alpha_l -
\frac1K\sum_u 1/\alpha_u]`. ``Sigma`` is the exact pseudo-inverse of the negative Hessian
on the zero-sum plane. The inverse map (the Laplace Bridge) uses the diagonal only:

.. math:: \alpha_k = \frac{1}{\Sigma_{kk}}\Big(1 - \frac2K + \frac{e^{\mu_k}}{K^2}
          \sum_l e^{-\mu_l}\Big),

exact on the image of the forward map; for other Gaussians it is the moment-free
"bridge" of the thesis (section 4.4). The family itself works in the ``K - 1`` basis
coordinates ``y`` with ``z = V y`` (numpyro's orthonormal ``ZeroSumTransform``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import gammaln
from numpyro.distributions.transforms import ZeroSumTransform

from ..runtime.random import log_gamma
from .laplace_bridge import dirichlet_from_zero_sum_gaussian, lb_norm

from .registry import MatchedFamily, register_family, register_prior_family

__all__ = [
    "dirichlet_softmax",
    "dirichlet_to_zero_sum_gaussian",
    "dirichlet_from_zero_sum_gaussian",
    "lift_zero_sum",
    "project_zero_sum",
]


def lift_zero_sum(mean, cov):
    """Basis Gaussian over ``y in R^(K-1)`` -> Gaussian over zero-sum ``z = V y in R^K``."""
    lift = ZeroSumTransform()
    cov_z = lift(jnp.swapaxes(lift(cov), -1, -2))
    return lift(mean), cov_z


def project_zero_sum(mean, cov):
    """Gaussian over zero-sum ``z`` -> basis Gaussian over ``y = V' z``."""
    drop = ZeroSumTransform().inv
    return drop(mean), drop(jnp.swapaxes(drop(cov), -1, -2))


def dirichlet_to_zero_sum_gaussian(concentration):
    """``alpha -> (mu, Sigma)`` over zero-sum logits (formula in the module docstring)."""
    log_alpha = jnp.log(concentration)
    mean = log_alpha - jnp.mean(log_alpha, axis=-1, keepdims=True)
    k = concentration.shape[-1]
    inv = 1.0 / concentration
    cov = (
        inv[..., :, None] * jnp.eye(k)
        - (inv[..., :, None] + inv[..., None, :]) / k
        + jnp.sum(inv, axis=-1)[..., None, None] / k**2
    )
    return mean, cov


def _from_gaussian(mean, cov):
    mean_z, cov_z = lift_zero_sum(mean, cov)
    var_z = jnp.diagonal(cov_z, axis1=-2, axis2=-1)
    return {"concentration": dirichlet_from_zero_sum_gaussian(mean_z, var_z)}


def _to_gaussian(params):
    return project_zero_sum(*dirichlet_to_zero_sum_gaussian(params["concentration"]))


def _distribution(params):
    return dist.Dirichlet(params["concentration"])


def _sample_basis(rng_key, params, num_samples):
    # Independent log-Gamma(alpha_k) draws; the zero-sum projection removes the
    # normaliser of the Dirichlet. ``rng_key`` is already specific to the site.
    alpha = params["concentration"]
    log_x = log_gamma(rng_key, alpha, num_samples)
    z = log_x - jnp.mean(log_x, axis=-1, keepdims=True)
    return ZeroSumTransform().inv(z)


def _log_prob(params, y):
    # Dirichlet density times the softmax basis Jacobian sum(log x) + log(K)/2, with
    # log x = log_softmax(V y): no log of an underflowed probability
    alpha = params["concentration"]
    log_x = jax.nn.log_softmax(ZeroSumTransform()(y), axis=-1)
    log_beta = jnp.sum(gammaln(alpha), axis=-1) - gammaln(jnp.sum(alpha, axis=-1))
    return jnp.sum(alpha * log_x, axis=-1) - log_beta + 0.5 * jnp.log(alpha.shape[-1])


def _lb_norm_from_gaussian(mean, cov):
    mean_z, cov_z = lb_norm(*lift_zero_sum(mean, cov))
    return {"concentration": dirichlet_from_zero_sum_gaussian(mean_z, jnp.diagonal(cov_z, axis1=-2, axis2=-1))}


dirichlet_softmax = register_family(
    MatchedFamily(
        name="dirichlet",
        basis="softmax",
        event_dim=1,
        from_gaussian=_from_gaussian,
        to_gaussian=_to_gaussian,
        distribution=_distribution,
        copula="independent",
        sample_basis=_sample_basis,
        log_prob=_log_prob,
    )
)

# The thesis' "LB-norm" variant (eq. 4.12): rescales the zero-sum Gaussian before the
# bridge. Not a Laplace map (no round trip); offered for classifier-logit posteriors.
dirichlet_lb_norm_softmax = register_family(
    dirichlet_softmax._replace(name="dirichlet_lb_norm", from_gaussian=_lb_norm_from_gaussian)
)

register_prior_family("Dirichlet", "dirichlet")
