r"""Class probabilities from a Gaussian over logits :math:`N(\mu, \Sigma)`: the Laplace Bridge and
the alternatives it is measured against.

- ``"bridge"``: the Laplace Bridge on the Gaussian as it is (thesis eq. 4.10;
  :func:`~numpyro_lm.contrib.bridge.laplace_bridge` with ``correction=None``), the Dirichlet's mean;
- ``"bridge_zero_sum"``: the bridge after conditioning on :math:`1^\top z = 0`, the softmax's own
  plane (thesis eq. 4.11);
- ``"lb_norm"``: then rescaled by LB-norm (thesis eqs. 4.12-4.14) with the scale ``c`` the
  *mean* of the conditioned variances over :math:`\sqrt{K/2}` (the thesis' text) or their
  *sum* (``"lb_norm_sum"``, the thesis' formula); the LB benchmark measures both;
- ``"probit"``: the extended probit approximation
  :math:`\mathrm{softmax}_k(\mu_k / \sqrt{1 + \tfrac\pi8 \Sigma_{kk}})` (Gibbs 1997; Lu et al.
  2020), one line, no Dirichlet;
- ``"mc"``: the average of ``softmax(z)`` over ``num_samples`` draws of ``z``, the reference.

:func:`class_probabilities` returns the probabilities and, for the bridges, the Dirichlet's
concentrations (whose Beta marginals and uncertainty-aware top-k live in
:mod:`numpyro_lm.contrib.bridge`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from ...families.laplace_bridge import as_covariance, lb_norm, log_dirichlet_from_zero_sum_gaussian
from ..bridge import bridge_spread_factor, condition_zero_sum

__all__ = ["PREDICTIVES", "ClassPredictive", "class_probabilities"]

PREDICTIVES = ("bridge", "bridge_zero_sum", "lb_norm", "lb_norm_sum", "probit", "mc")


class ClassPredictive(NamedTuple):
    """``probabilities (n, K)``; for the bridges ``concentration (n, K)`` and ``spread_factor
    (n,)`` (:func:`~numpyro_lm.contrib.bridge.bridge_spread_factor`: near 1 where the Dirichlet is true
    to the logit Gaussian, large where its Beta marginals and top-k are too narrow to trust),
    else ``None``."""

    probabilities: jax.Array
    concentration: Optional[jax.Array] = None
    spread_factor: Optional[jax.Array] = None


def class_probabilities(mean, cov, method: str = "bridge_zero_sum", *, num_samples: int = 1000,
                        rng_key=None) -> ClassPredictive:
    """Class probabilities of ``N(mean, cov)`` over logits by ``method`` (:data:`PREDICTIVES`;
    module docstring). ``cov`` is ``(..., K, K)`` or the variances ``(..., K)``; ``"mc"`` needs
    ``rng_key``."""
    if method not in PREDICTIVES:
        raise ValueError(f"method must be one of {PREDICTIVES}, not {method!r}")
    mean = jnp.asarray(mean)
    cov = as_covariance(mean, jnp.asarray(cov))
    if method == "mc":
        if rng_key is None:
            raise ValueError("method='mc' needs rng_key")
        chol = jnp.linalg.cholesky(cov + 1e-6 * jnp.eye(mean.shape[-1], dtype=mean.dtype))
        z = jax.random.normal(rng_key, (num_samples,) + mean.shape, mean.dtype)
        logits = mean + jnp.einsum("...kl,s...l->s...k", chol, z)
        return ClassPredictive(jnp.mean(jax.nn.softmax(logits, -1), 0))
    if method == "probit":
        variances = jnp.diagonal(cov, axis1=-2, axis2=-1)
        return ClassPredictive(jax.nn.softmax(mean / jnp.sqrt(1.0 + jnp.pi / 8.0 * variances), -1))
    if method != "bridge":
        mean, cov = condition_zero_sum(mean, cov)
    variances = jnp.diagonal(cov, axis1=-2, axis2=-1)  # the Gaussian the Dirichlet stands for
    if method in ("lb_norm", "lb_norm_sum"):
        mean, cov = lb_norm(mean, cov, "sum" if method == "lb_norm_sum" else "mean")
    log_alpha = log_dirichlet_from_zero_sum_gaussian(mean, jnp.diagonal(cov, axis1=-2, axis2=-1))
    # the probabilities from the logs: alpha overflows float32 where the logits are far apart
    return ClassPredictive(jax.nn.softmax(log_alpha, -1), jnp.exp(log_alpha), bridge_spread_factor(log_alpha, variances))
