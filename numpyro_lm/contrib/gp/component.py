r"""LM + GP inside a NumPyro model: the pseudo-observations as a likelihood.

Laplace Matching turns each group's data into a Gaussian pseudo-observation of the latent
function (:mod:`~numpyro_lm.contrib.gp.pseudo`), so inside any NumPyro model the data's likelihood of
the latent values ``f`` at the groups' inputs becomes

.. math:: \prod_g N(\mu_g;\ f_g, S_g),

:func:`pseudo_likelihood` (a ``Normal`` per group, or a ``MultivariateNormal`` over each
group's block). Everything else in the model is the user's: priors on the kernel's
hyperparameters, other data, other latent sites. Because the likelihood is Gaussian, a
Gaussian-process prior on ``f`` can be integrated out in closed form; :func:`lm_gp_model` is
that collapsed model, with the hyperparameters as its only latent sites, ready for
``MCMC(NUTS(...))`` or ``LaplaceMatching`` (:func:`predict_with_draws` then averages the
GP's predictions over their draws):

.. math:: \mathrm{vec}(\mu) \sim N(1 \otimes m,\ K_\theta \otimes \mathrm{diag}(a) B\, \mathrm{diag}(a)
          + \mathrm{blockdiag}(S_g)).
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from .blocks import joint_covariance, output_kernel_matrix, predictive
from .pseudo import PseudoObservations
from .regression import KernelParams, gaussian_process, rbf_kernel, start_lengthscales

__all__ = ["pseudo_likelihood", "lm_gp_model", "predict_with_draws"]


def pseudo_likelihood(name: str, pseudo: PseudoObservations, f):
    """Observe the pseudo-observations given the latent values ``f`` at the groups' inputs
    (``(m,)``, or ``(m, D)`` for the block kinds): the site ``name``, one entry per group."""
    mean, noise = jnp.asarray(pseudo.mean), jnp.asarray(pseudo.noise)
    if jnp.shape(f)[-mean.ndim:] != mean.shape:
        raise ValueError(f"f must end in the pseudo-observations' shape {mean.shape}, not {jnp.shape(f)}")
    with numpyro.plate(f"{name}_groups", mean.shape[0]):
        if mean.ndim == 1:
            return numpyro.sample(name, dist.Normal(f, jnp.sqrt(noise)), obs=mean)
        return numpyro.sample(name, dist.MultivariateNormal(f, covariance_matrix=noise), obs=mean)


def lm_gp_model(pseudo: PseudoObservations, kernel: Callable = rbf_kernel, output_kernel=None,
                amplitude_prior: Optional[dist.Distribution] = None,
                lengthscale_prior: Optional[dist.Distribution] = None,
                mean_prior: Optional[dist.Distribution] = None):
    """The collapsed LM + GP model (module docstring): latent sites ``amplitude`` (one per output
    for covariances, one for the other kinds), ``lengthscale`` (one per input dimension) and ``mean``; default priors
    LogNormal(0, 1), LogNormal(the start of :func:`~numpyro_lm.contrib.gp.regression.start_lengthscales`, 1)
    and Normal(0, 3)."""
    inputs = jnp.asarray(pseudo.inputs)
    d = inputs.shape[-1]
    block = pseudo.mean.ndim == 2
    outputs = pseudo.mean.shape[-1] if block else None
    start = jnp.asarray(start_lengthscales(pseudo.inputs), inputs.dtype)
    with numpyro.plate("input_dims", d):
        lengthscale = numpyro.sample("lengthscale", lengthscale_prior or dist.LogNormal(start, 1.0))
    if block:
        with numpyro.plate("outputs", outputs):
            mean = numpyro.sample("mean", mean_prior or dist.Normal(0.0, 3.0))
        with numpyro.plate("amplitudes", outputs if pseudo.kind == "covariance" else 1):
            amplitude = numpyro.sample("amplitude", amplitude_prior or dist.LogNormal(0.0, 1.0))
    else:
        amplitude = numpyro.sample("amplitude", amplitude_prior or dist.LogNormal(0.0, 1.0))
        mean = numpyro.sample("mean", mean_prior or dist.Normal(0.0, 3.0))
    params = KernelParams(jnp.log(amplitude), jnp.log(lengthscale), mean)
    if not block:
        gp = gaussian_process(params, inputs, jnp.asarray(pseudo.noise), kernel)
        return numpyro.sample("pseudo", gp.numpyro_dist(), obs=jnp.asarray(pseudo.mean))
    b = output_kernel_matrix(pseudo, output_kernel, inputs.dtype)
    cov = joint_covariance(params, inputs, jnp.asarray(pseudo.noise), b, kernel)
    loc = jnp.broadcast_to(mean, pseudo.mean.shape).reshape(-1)
    return numpyro.sample("pseudo", dist.MultivariateNormal(loc, covariance_matrix=cov),
                          obs=jnp.asarray(pseudo.mean).reshape(-1))


def predict_with_draws(samples: dict, pseudo: PseudoObservations, test_inputs, kernel: Callable = rbf_kernel,
                       output_kernel=None):
    """The latent Gaussian at ``test_inputs`` averaged over draws of the hyperparameters
    (``samples`` from ``MCMC.get_samples()`` or ``LaplaceMatching.get_samples()`` of
    :func:`lm_gp_model`): the mixture's mean and covariance, by the laws of total expectation
    and variance."""
    draws = KernelParams(jnp.log(jnp.asarray(samples["amplitude"])), jnp.log(jnp.asarray(samples["lengthscale"])),
                         jnp.asarray(samples["mean"]))
    # one draw at a time (lax.map): a batch of draws would hold a Cholesky factor per draw
    means, covs = jax.lax.map(
        lambda params: predictive(params, pseudo, test_inputs, output_kernel=output_kernel, kernel=kernel), draws)
    mean = means.mean(0)
    spread = means - mean
    outer = spread[..., :, None] * spread[..., None, :] if means.ndim == 3 else spread**2
    return mean, covs.mean(0) + outer.mean(0)
