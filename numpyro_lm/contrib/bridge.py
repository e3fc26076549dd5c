r"""The Laplace Bridge for Gaussians over logits, and what a Dirichlet offers downstream.

Bayesian classifiers often end in a Gaussian ``N(mu, Sigma)`` over ``K`` logits whose
softmax is the class probability. The Laplace Bridge (Hennig et al. 2012; Hobbhahn,
Kristiadi and Hennig 2022; thesis chapter 4) maps it in closed form to a Dirichlet over
the probabilities, so no softmax samples are needed:

1. (``correction="zero_sum"``, default) condition the Gaussian on :math:`1^\top z = 0`,
   the plane of the softmax basis (thesis eq. 4.11 / B.6):

   .. math:: \bar\mu = \mu - \frac{\Sigma 1 1^\top \mu}{1^\top \Sigma 1}, \qquad
             \bar\Sigma = \Sigma - \frac{\Sigma 1 1^\top \Sigma}{1^\top \Sigma 1};

2. (``correction="lb_norm"``, after step 1) rescale by
   :math:`c = \frac1K\sum_i \bar\Sigma_{ii} / \sqrt{K/2}`: :math:`\mu' = \bar\mu/\sqrt c`,
   :math:`\Sigma' = \bar\Sigma / c` (thesis eqs. 4.12-4.14; an empirical correction for
   high-variance logits, "LB-norm". The thesis' text says the mean of the variances, its
   formula sums them; :func:`lb_norm` measures both and uses the mean);

3. the bridge :math:`\alpha_k = \frac{1}{\Sigma_{kk}}(1 - \frac2K + \frac{e^{\mu_k}}{K^2}\sum_l e^{-\mu_l})`.

Downstream, each class probability's marginal is ``Beta(alpha_i, alpha_0 - alpha_i)``,
which gives the uncertainty-aware top-k rule of the thesis (Algorithm 4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from ..families.laplace_bridge import (as_covariance, dirichlet_from_zero_sum_gaussian, lb_norm,
                                       log_dirichlet_from_zero_sum_gaussian)
from ..families.quantiles import beta_logit_quantile

__all__ = [
    "dirichlet_from_zero_sum_gaussian",
    "log_dirichlet_from_zero_sum_gaussian",
    "condition_zero_sum",
    "bridge_spread_factor",
    "lb_norm",
    "laplace_bridge",
    "dirichlet_beta_marginals",
    "uncertainty_aware_top_k",
]

CORRECTIONS = (None, "zero_sum", "lb_norm")
# a covariance's eigenvalues may dip this far below 0 (relative to the largest) from round-off
# alone: a zero-sum covariance is singular, and a float32 one built as A A' lands near 0
PSD_SLACK = 100.0


def _concrete(x) -> bool:
    """Values can be checked (not traced inside jit / vmap / grad)."""
    return not isinstance(x, jax.core.Tracer)


def _checked_gaussian(mean, cov):
    """``mean (..., K)`` and ``cov (..., K, K)`` or ``(..., K)``, finite and positive semi-definite.

    Shapes are checked always; values only where they are concrete (under ``jit`` the inputs
    are traced and pass unchecked, as numpyro's ``validate_args`` does).
    """
    mean, cov = jnp.asarray(mean), jnp.asarray(cov)
    if mean.ndim < 1 or mean.shape[-1] < 2:
        raise ValueError(f"laplace_bridge: mean must have shape (..., K) with K >= 2 logits, got {mean.shape}")
    k = mean.shape[-1]
    full = cov.ndim == mean.ndim + 1
    if not (full and cov.shape[-2:] == (k, k)) and not (cov.ndim == mean.ndim and cov.shape[-1] == k):
        raise ValueError(f"laplace_bridge: cov must have shape (..., {k}, {k}) (a covariance) or (..., {k}) "
                         f"(variances) to match mean's {mean.shape}, got {cov.shape}")
    if not (_concrete(mean) and _concrete(cov)):
        return mean, cov
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(cov))):
        raise ValueError("laplace_bridge: mean and cov must be finite; found NaN or inf "
                         f"in {'mean' if not np.all(np.isfinite(mean)) else 'cov'}")
    c = np.asarray(cov, np.float64)
    if not full:
        bad = np.argwhere(c <= 0)
        if bad.size:
            raise ValueError(f"laplace_bridge: the variances must be positive; cov{[int(i) for i in bad[0]]} = "
                             f"{c[tuple(bad[0])]:.3g}")
        return mean, cov
    scale = np.max(np.abs(c), axis=(-2, -1), keepdims=True)
    eps = PSD_SLACK * np.finfo(cov.dtype).eps * k
    if np.any(np.abs(c - np.swapaxes(c, -1, -2)) > eps * scale):
        raise ValueError("laplace_bridge: cov must be symmetric (a covariance matrix); "
                         "pass (cov + cov.T) / 2 if the asymmetry is round-off")
    lowest = np.atleast_1d(np.linalg.eigvalsh(c)[..., 0])
    bad = np.argwhere((lowest < -eps * np.atleast_1d(scale[..., 0, 0]))
                      | (np.atleast_1d(np.diagonal(c, 0, -2, -1).min(-1)) <= 0))
    if bad.size:
        where = f" (batch index {[int(i) for i in bad[0]]})" if c.ndim > 2 else ""
        raise ValueError(f"laplace_bridge: cov is not positive semi-definite{where}: its smallest eigenvalue is "
                         f"{lowest[tuple(bad[0])]:.3g} and the bridge's variances would be negative or zero. "
                         "Pass the Gaussian's covariance (for a last-layer Laplace: J H^-1 J' with a "
                         "positive-definite H)")
    return mean, cov


def bridge_spread_factor(log_alpha, var):
    r"""How far the bridge's Dirichlet is from the Gaussian it came from, per input: the factor
    ``>= 1`` by which the Dirichlet's own Laplace standard deviations (softmax basis) miss the
    Gaussian's, :math:`\exp \max_k |\tfrac12 \log(\Sigma'_{kk} / \Sigma_{kk})|` with

    .. math:: \Sigma'_{kk} = \frac{1 - 2/K}{\alpha_k} + \frac{1}{K^2}\sum_u \frac{1}{\alpha_u}

    (thesis eq. A.38 on the diagonal). The bridge inverts the Dirichlet's Laplace map, so a
    Gaussian that *is* such an image gives exactly 1, and so does every Gaussian over two
    logits. But a Dirichlet's Laplace variances fall as ``1/alpha_k`` while its
    log-concentrations spread as far as the means: a logit Gaussian with means far apart and
    similar variances (a confident network; the factor does not depend on the variances'
    scale) has no Dirichlet image. The bridge then gives the top classes concentrations whose
    Beta marginals are too narrow by this factor (ten classes, one logit 5 above the rest:
    2.5; on the digits MLP of ``benchmarks/bnn_bridge.py`` every test image is above 2 and the
    marginals' KL from the truth is hundreds of times Monte Carlo's). Trust the Beta marginals
    and the uncertainty-aware top-k where the factor is near 1 (say below 2).

    :param log_alpha: ``(..., K)`` from :func:`log_dirichlet_from_zero_sum_gaussian`.
    :param var: ``(..., K)`` the variances of the zero-sum Gaussian it was computed from.
    """
    k = log_alpha.shape[-1]
    floor = jnp.log(jnp.maximum(1.0 - 2.0 / k, 0.0))
    log_var_back = jnp.logaddexp(floor - log_alpha,
                                 jax.scipy.special.logsumexp(-log_alpha, -1, keepdims=True) - 2.0 * jnp.log(k))
    return jnp.exp(0.5 * jnp.max(jnp.abs(log_var_back - jnp.log(var)), -1))


def condition_zero_sum(mean, cov):
    """Condition ``N(mean, cov)`` over logits on ``sum(z) = 0`` (unchanged if it already holds)."""
    cov = as_covariance(mean, cov)
    s1 = jnp.sum(cov, axis=-1)  # Sigma 1
    denom = jnp.sum(s1, axis=-1, keepdims=True)  # 1' Sigma 1
    scale = jnp.max(jnp.abs(cov), axis=(-2, -1))[..., None]
    degenerate = denom <= jnp.finfo(cov.dtype).eps * mean.shape[-1] * scale
    safe = jnp.where(degenerate, 1.0, denom)
    new_mean = mean - s1 * jnp.sum(mean, axis=-1, keepdims=True) / safe
    new_cov = cov - s1[..., :, None] * s1[..., None, :] / safe[..., None]
    # a zero-sum Gaussian has 1' Sigma 1 = 0: only its mean can still be shifted
    centred = mean - jnp.mean(mean, axis=-1, keepdims=True)
    return jnp.where(degenerate, centred, new_mean), jnp.where(degenerate[..., None], cov, new_cov)


def laplace_bridge(mean, cov, correction: str | None = "zero_sum"):
    """Dirichlet concentrations ``alpha (..., K)`` for a Gaussian over ``K`` logits.

    :param mean: ``(..., K)`` logit means.
    :param cov: ``(..., K, K)`` covariance, or ``(..., K)`` variances.
    :param correction: ``"zero_sum"`` (condition on the softmax plane first; default),
        ``"lb_norm"`` (then rescale, thesis eq. 4.12) or ``None`` (the Gaussian is already
        zero-sum).
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, not {correction!r}")
    mean, cov = _checked_gaussian(mean, cov)
    cov = as_covariance(mean, cov)
    if correction is not None:
        mean, cov = condition_zero_sum(mean, cov)
    if correction == "lb_norm":
        mean, cov = lb_norm(mean, cov)
    return dirichlet_from_zero_sum_gaussian(mean, jnp.diagonal(cov, axis1=-2, axis2=-1))


def dirichlet_beta_marginals(concentration) -> dist.Beta:
    """``Beta(alpha_i, alpha_0 - alpha_i)``: the marginal of each component of a Dirichlet."""
    total = jnp.sum(concentration, axis=-1, keepdims=True)
    return dist.Beta(concentration, total - concentration)


def uncertainty_aware_top_k(concentration, threshold: float = 0.05):
    """Classes whose Beta marginal overlaps the most probable one's (thesis Algorithm 4).

    Sort classes by ``alpha``; keep the top class; keep the next ones while the upper
    ``threshold/2`` quantile of their marginal exceeds the lower ``threshold/2`` quantile
    of the top class's marginal, and stop at the first that does not.

    :return: a boolean mask ``(..., K)`` in the original class order (``mask.sum(-1)`` is
        the adaptive ``k``, at least 1).
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"uncertainty_aware_top_k: threshold must be in (0, 1), got {threshold}")
    concentration = jnp.asarray(concentration)
    if concentration.ndim < 1 or concentration.shape[-1] < 1:
        raise ValueError("uncertainty_aware_top_k: concentration must have shape (..., K) with K >= 1, "
                         f"got {concentration.shape}")
    if _concrete(concentration):
        c = np.asarray(concentration)
        bad = np.argwhere(~(np.isfinite(c) & (c > 0)))
        if bad.size:
            raise ValueError(f"uncertainty_aware_top_k: Dirichlet concentrations must be finite and positive; "
                             f"concentration{[int(i) for i in bad[0]]} = {c[tuple(bad[0])]}")
    order = jnp.argsort(-concentration, axis=-1)
    alpha = jnp.take_along_axis(concentration, order, axis=-1)
    rest = jnp.sum(alpha, axis=-1, keepdims=True) - alpha
    lower_top = beta_logit_quantile(alpha[..., :1], rest[..., :1], threshold / 2)
    upper = beta_logit_quantile(alpha, rest, 1.0 - threshold / 2)
    keep_sorted = jnp.cumprod(upper > lower_top, axis=-1).astype(bool)
    keep_sorted = keep_sorted.at[..., 0].set(True)
    inverse = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(keep_sorted, inverse, axis=-1)
