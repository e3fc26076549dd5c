r"""The GP of LM + GP: ordinary GP regression on the pseudo-observations, each with its own noise.

Given pseudo-observations :math:`(x_g, \mu_g, \sigma^2_g)` (:mod:`numpyro_lm.contrib.gp.pseudo`), the
latent function is :math:`f \sim \mathcal{GP}(m, k_\theta)` observed as
:math:`\mu_g = f(x_g) + \varepsilon_g`, :math:`\varepsilon_g \sim N(0, \sigma^2_g)`. Its
posterior at test inputs is the usual conditional Gaussian (Rasmussen & Williams 2006,
eq. 2.22-2.24 with :math:`K + \mathrm{diag}(\sigma^2)` in place of :math:`K + \sigma^2 I`),
computed by tinygp. The kernel's hyperparameters :math:`\theta` (and the constant mean
:math:`m`) maximise the log marginal likelihood
:math:`\log N(\mu;\ m, K_\theta + \mathrm{diag}(\sigma^2))`, by Adam (optax) on their logs in
one compiled ``lax.scan``.

Each test input's latent Gaussian :math:`N(\mu_*, \sigma^2_*)` maps back to the data kind's
matched family by Laplace Matching: a Beta over the success probability (binary), a Gamma
over the Poisson rate (counts).
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tinygp

from ...families import get_family
from ...runtime.precision import precise_jit
from .pseudo import DATA_KINDS, PseudoObservations

__all__ = ["KernelParams", "default_params", "start_lengthscales", "rbf_kernel", "gaussian_process", "log_marginal_likelihood",
           "fit_hyperparameters", "maximise_by_adam", "latent_predictive", "matched_predictive"]


class KernelParams(NamedTuple):
    """The GP's hyperparameters, on the log scale where positive.

    :param log_amplitude: log of the kernel's standard deviation.
    :param log_lengthscale: ``(d,)`` logs of the lengthscales (one per input dimension: ARD).
    :param mean: the constant prior mean of the latent function.
    """

    log_amplitude: jax.Array
    log_lengthscale: jax.Array
    mean: jax.Array


def rbf_kernel(params: KernelParams):
    r"""The squared-exponential kernel :math:`a^2 \exp(-\tfrac12 \sum_j (x_j - x'_j)^2 / \ell_j^2)`."""
    scale = jnp.exp(params.log_lengthscale)
    return jnp.exp(2.0 * params.log_amplitude) * tinygp.transforms.Linear(1.0 / scale, tinygp.kernels.ExpSquared())


def start_lengthscales(inputs: np.ndarray, ard: bool = True) -> np.ndarray:
    """Log lengthscales to start from: each input dimension's SD (``ard``) or their mean (one
    shared lengthscale). A dimension constant in the training inputs gets 10^3 times the largest
    SD: its lengthscale has no gradient, and a short one would make any test input that differs
    there uncorrelated with every training input (a prediction at the prior mean)."""
    sd = np.std(inputs, axis=0)
    if not np.any(sd > 0):
        return np.zeros(inputs.shape[1] if ard else 1)
    sd = np.where(sd > 0, sd, 1e3 * sd.max())
    return np.log(sd) if ard else np.log([np.mean(sd[sd < 1e3 * sd.min()])])


def default_params(pseudo: PseudoObservations, ard: bool = True) -> KernelParams:
    """A start: the pseudo-observations' precision-weighted mean and spread, lengthscales from
    :func:`start_lengthscales`."""
    w = 1.0 / pseudo.noise
    mean = float(np.sum(w * pseudo.mean) / np.sum(w))
    spread = float(np.sqrt(np.sum(w * (pseudo.mean - mean) ** 2) / np.sum(w))) + 1e-3
    dtype = jnp.result_type(float)
    return KernelParams(jnp.asarray(np.log(spread), dtype), jnp.asarray(start_lengthscales(pseudo.inputs, ard), dtype),
                        jnp.asarray(mean, dtype))


def gaussian_process(params: KernelParams, inputs, noise, kernel: Callable = rbf_kernel) -> tinygp.GaussianProcess:
    """The GP prior over the pseudo-observations' inputs, with their noise on the diagonal."""
    return tinygp.GaussianProcess(kernel(params), inputs, diag=noise, mean=params.mean)


def log_marginal_likelihood(params: KernelParams, inputs, mean, noise, kernel: Callable = rbf_kernel):
    r""":math:`\log N(\mu;\ m, K_\theta + \mathrm{diag}(\sigma^2))`."""
    return gaussian_process(params, inputs, noise, kernel).log_probability(mean)


def fit_hyperparameters(pseudo: PseudoObservations, init: KernelParams | None = None, *, kernel: Callable = rbf_kernel,
                        num_steps: int = 100, learning_rate: float = 0.1, ard: bool = True):
    """``(params, log marginal likelihood per step)``: Adam on the negative log marginal likelihood,
    from ``init`` or :func:`default_params` (one lengthscale per input dimension if ``ard``)."""
    init = default_params(pseudo, ard) if init is None else init
    dtype = jnp.result_type(float)
    data = tuple(jnp.asarray(a, dtype) for a in (pseudo.inputs, pseudo.mean, pseudo.noise))
    return maximise_by_adam(log_marginal_likelihood, init, data, kernel, num_steps, learning_rate)


@partial(precise_jit, static_argnums=(0, 3, 4, 5))
def maximise_by_adam(objective: Callable, init: KernelParams, data: tuple, kernel: Callable, num_steps: int,
                     learning_rate: float):
    """``(params, objective per step)``: ``num_steps`` Adam steps on ``-objective(params, *data, kernel)``
    from ``init``, in one compiled ``lax.scan``."""
    optimiser = optax.adam(learning_rate)

    def loss(params):
        return -objective(params, *data, kernel)

    def step(carry, _):
        params, state = carry
        value, grad = jax.value_and_grad(loss)(params)
        updates, state = optimiser.update(grad, state, params)
        return (optax.apply_updates(params, updates), state), -value

    (params, _), trace = jax.lax.scan(step, (init, optimiser.init(init)), None, length=num_steps)
    return params, trace


def latent_predictive(params: KernelParams, pseudo: PseudoObservations, test_inputs, kernel: Callable = rbf_kernel):
    """``(mean, variance)`` of the latent function at ``test_inputs`` given the pseudo-observations."""
    dtype = jnp.result_type(float)
    x = jnp.asarray(test_inputs, dtype)
    x = x[:, None] if x.ndim == 1 else x
    gp = gaussian_process(params, jnp.asarray(pseudo.inputs, dtype), jnp.asarray(pseudo.noise, dtype), kernel)
    conditioned = gp.condition(jnp.asarray(pseudo.mean, dtype), x).gp
    return conditioned.loc, conditioned.variance


def matched_predictive(kind: str, mean, variance):
    """The data kind's matched family at each test input (a numpyro Distribution with batch ``(n,)``):
    a Beta over the success probability (binary) or a Gamma over the Poisson rate (counts)."""
    family = get_family(*DATA_KINDS[kind])
    return family.distribution(family.from_gaussian(jnp.asarray(mean), jnp.asarray(variance)))
