r"""Elliptical slice sampling (Murray, Adams and MacKay 2010) as a NumPyro ``MCMCKernel``.

For a target :math:`p(f) \propto N(f; m, \Sigma)\, L(f)` one step from ``f`` draws an
auxiliary :math:`\nu \sim N(0, \Sigma)` and a slice level
:math:`\log y = \log L(f) + \log u`, then proposes points on the ellipse

.. math:: f'(\theta) = m + (f - m)\cos\theta + \nu\sin\theta

with :math:`\theta` drawn from a bracket that shrinks towards 0 after each rejection,
until :math:`\log L(f') > \log y`. No step size, no gradients; every step moves.

Two choices of the ellipse (``prior=``):

- ``"model"`` (latent Gaussian models): the model's own Gaussian prior over its latent
  sites (every latent site must have a Normal or MultivariateNormal prior whose
  parameters do not depend on other latent sites); ``L`` is the rest of the joint density.
- ``"laplace"`` (any model): the Laplace Gaussian :math:`N(y^*, H^{-1})` of a fitted
  :class:`~numpyro_lm.LaplaceMatching` over its basis coordinates ``y``, and
  :math:`\log L(y) = \log p(y) - \log N(y; y^*, H^{-1})`. The chain targets ``p`` exactly
  (the Gaussian factors cancel); it mixes fast where LM is good.

We implement the step ourselves (a ``lax.while_loop``, some thirty lines) rather than
depending on BlackJAX for it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpyro import handlers
from numpyro.distributions import ExpandedDistribution, Independent, MultivariateNormal, Normal, constraints
from numpyro.infer.initialization import init_to_value
from numpyro.infer.mcmc import MCMCKernel
from numpyro.infer.util import log_density
from numpyro.util import is_prng_key

from ..checks.validation import check_model

__all__ = ["ESSState", "elliptical_slice_step", "EllipticalSlice"]


class ESSState(NamedTuple):
    """State of one chain: position ``z`` (flat), its log likelihood, step statistics."""

    i: jnp.ndarray
    z: jnp.ndarray
    log_likelihood: jnp.ndarray
    num_evals: jnp.ndarray  # likelihood evaluations of the last step (1 = first proposal taken)
    mean: jnp.ndarray
    chol: jnp.ndarray  # a square root of the ellipse's covariance (Cholesky factor or the curvature's)
    rng_key: jnp.ndarray


def elliptical_slice_step(rng_key, z, log_likelihood, log_likelihood_fn: Callable, mean, chol):
    """One elliptical slice sampling step: ``(z', log L(z'), number of evaluations)``."""
    k_nu, k_u, k_theta, k_loop = jax.random.split(rng_key, 4)
    nu = chol @ jax.random.normal(k_nu, z.shape, z.dtype)
    level = log_likelihood + jnp.log(jax.random.uniform(k_u, (), z.dtype))
    theta = jax.random.uniform(k_theta, (), z.dtype, 0.0, 2.0 * jnp.pi)
    centred = z - mean

    def propose(theta):
        new = mean + centred * jnp.cos(theta) + nu * jnp.sin(theta)
        value = log_likelihood_fn(new)
        return new, jnp.where(jnp.isnan(value), -jnp.inf, value)

    new, value = propose(theta)

    def cond(carry):
        return ~(carry[3] > level)

    def body(carry):
        key, theta, new, value, lo, hi, n = carry
        lo = jnp.where(theta < 0.0, theta, lo)
        hi = jnp.where(theta < 0.0, hi, theta)
        key, sub = jax.random.split(key)
        theta = jax.random.uniform(sub, (), z.dtype, lo, hi)
        new, value = propose(theta)
        return key, theta, new, value, lo, hi, n + 1

    init = (k_loop, theta, new, value, theta - 2.0 * jnp.pi, theta, jnp.asarray(1))
    _, _, new, value, _, _, n = lax.while_loop(cond, body, init)
    return new, value, n


def _gaussian_prior(site):
    """``(mean, cov)`` of a latent site's Normal / MultivariateNormal prior, flattened."""
    shape = jnp.shape(site["value"])
    base = site["fn"]
    while isinstance(base, (Independent, ExpandedDistribution)):
        base = base.base_dist
    if isinstance(base, Normal):
        loc = jnp.broadcast_to(base.loc, shape).ravel()
        var = jnp.broadcast_to(jnp.square(base.scale), shape).ravel()
        return loc, jnp.diag(var)
    if isinstance(base, MultivariateNormal) and base.batch_shape == () and shape == base.event_shape:
        return base.loc, base.covariance_matrix
    raise ValueError(
        f"site {site['name']!r}: prior='model' needs a Normal or (unbatched) MultivariateNormal "
        f"prior on every latent site, not {type(base).__name__}. Use "
        "EllipticalSlice.from_laplace(lm) (the Laplace Gaussian as the ellipse) instead."
    )


def _joint_prior(trace, names):
    """``(mean, block-diagonal cov)`` of the sites' Gaussian priors, flattened in order."""
    means, covs = zip(*(_gaussian_prior(trace[n]) for n in names))
    return jnp.concatenate(means), jax.scipy.linalg.block_diag(*covs)


class _ModelEllipse(NamedTuple):
    names: tuple
    shapes: tuple

    def unravel(self, flat):
        out, offset = {}, 0
        for name, shape in zip(self.names, self.shapes):
            size = int(np.prod(shape))
            out[name] = flat[offset : offset + size].reshape(shape)
            offset += size
        return out


class EllipticalSlice(MCMCKernel):
    """Elliptical slice sampling for :class:`numpyro.infer.MCMC` (module docstring).

    :param model: a NumPyro model whose latent sites all have Gaussian priors with fixed
        parameters (``prior="model"``); for any other model use :meth:`from_laplace`.
    :param init_strategy: unused with ``prior="model"`` beyond the initial point: chains
        start at a draw from the prior unless ``init_params`` are given to ``MCMC.run``.

    Example::

        mcmc = MCMC(EllipticalSlice(gp_model), num_warmup=200, num_samples=2000)
        mcmc.run(key, x, y=y)
        mcmc = MCMC(EllipticalSlice.from_laplace(lm), num_warmup=200, num_samples=2000)
        mcmc.run(key, *args, **kwargs)     # the arguments of lm.run
    """

    sample_field = "z"

    def __init__(self, model: Callable, *, laplace=None):
        check_model(model)
        self._model = model
        self._laplace = laplace  # (ModelInfo, Gaussian) of the Laplace ellipse, or None
        self._vectorized = False

    @classmethod
    def from_laplace(cls, lm) -> "EllipticalSlice":
        """ESS over the LM basis with the fitted Laplace Gaussian of ``lm`` as the ellipse
        (its ``model_info`` and ``gaussian``)."""
        if lm.batch_size is not None:
            raise ValueError("from_laplace needs one fit: this LaplaceMatching holds run_many's batch of fits. "
                             "Fit the data set you want to sample with run().")
        return cls(lm.model, laplace=(lm.model_info, lm.gaussian))

    @property
    def model(self):
        return self._model

    @property
    def default_fields(self):
        return ("z",)

    # ------------------------------------------------------------------ set-up

    def _model_setup(self, rng_key, args, kwargs):
        """Gaussian prior of the latent sites and the log likelihood, from a trace."""
        tr = handlers.trace(handlers.seed(self._model, rng_key)).get_trace(*args, **kwargs)
        latent = [n for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]]
        if not latent:
            raise ValueError("the model has no latent sample sites: there is nothing to sample.")
        for name in latent:
            support = tr[name]["fn"].support
            if support not in (constraints.real, constraints.real_vector) and not (
                isinstance(support, constraints.independent) and support.base_constraint is constraints.real
            ):
                raise ValueError(f"site {name!r} is not real-valued: use EllipticalSlice.from_laplace(lm).")
        ellipse = _ModelEllipse(tuple(latent), tuple(jnp.shape(tr[n]["value"]) for n in latent))
        mean, cov = _joint_prior(tr, ellipse.names)
        self._check_fixed_prior(ellipse, mean, cov, args, kwargs)
        return ellipse, mean, jnp.linalg.cholesky(cov)

    def _check_fixed_prior(self, ellipse, mean, cov, args, kwargs):
        # the ellipse must not move with the latent values: trace again elsewhere
        shifted = ellipse.unravel(mean + 1.0)
        tr = handlers.trace(handlers.substitute(handlers.seed(self._model, 0), data=shifted)).get_trace(*args, **kwargs)
        m2, c2 = _joint_prior(tr, ellipse.names)
        if not (np.allclose(m2, mean) and np.allclose(c2, cov)):
            raise ValueError(
                "prior='model' needs a Gaussian prior whose mean and covariance do not depend on "
                "other latent sites (hyperparameters are latent here). Use "
                "EllipticalSlice.from_laplace(lm), whose ellipse is the Laplace Gaussian."
            )

    def _log_likelihood_fn(self, args, kwargs, mean, chol):
        if self._laplace is not None:
            info, gaussian = self._laplace

            def log_likelihood(y):
                return info.log_density(y, args, kwargs) - gaussian.log_prob(y)

            return log_likelihood
        ellipse = self._ellipse

        def log_likelihood(f):
            values = ellipse.unravel(f)
            log_joint, tr = log_density(self._model, args, kwargs, values)
            prior = sum(
                jnp.sum(tr[n]["fn"].log_prob(values[n])) for n in ellipse.names
            )
            return log_joint - prior

        return log_likelihood

    # -------------------------------------------------------------- MCMCKernel

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        if not is_prng_key(rng_key):  # several chains, vectorized
            self._vectorized = True
            return jax.vmap(lambda k, p: self._init_one(k, p, model_args, model_kwargs))(rng_key, init_params)
        return self._init_one(rng_key, init_params, model_args, model_kwargs)

    def _init_one(self, rng_key, init_params, args, kwargs):
        k_setup, k_init, rng_key = jax.random.split(rng_key, 3)
        if self._laplace is not None:
            info, gaussian = self._laplace
            mean = gaussian.mean
            chol = gaussian.curvature.inv_sqrt(jnp.eye(mean.shape[-1], dtype=mean.dtype)).T  # a root of the covariance
            if init_params is None:
                z = mean + chol @ jax.random.normal(k_init, mean.shape, mean.dtype)
            else:
                z = info.init(k_init, args, kwargs, init_to_value(values=init_params))
        else:
            self._ellipse, mean, chol = self._model_setup(k_setup, args, kwargs)
            if init_params is None:
                z = mean + chol @ jax.random.normal(k_init, mean.shape, mean.dtype)
            else:
                z = jnp.concatenate([jnp.ravel(jnp.asarray(init_params[n])) for n in self._ellipse.names])
        if not bool(jnp.all(jnp.isfinite(chol))):
            raise ValueError("the ellipse covariance is not positive definite (its square root is not finite)")
        log_likelihood = self._log_likelihood_fn(args, kwargs, mean, chol)(z)
        return ESSState(jnp.asarray(0), z, log_likelihood, jnp.asarray(0), mean, chol, rng_key)

    def sample(self, state, model_args, model_kwargs):
        def one(state):
            key, sub = jax.random.split(state.rng_key)
            fn = self._log_likelihood_fn(model_args, model_kwargs, state.mean, state.chol)
            z, value, n = elliptical_slice_step(sub, state.z, state.log_likelihood, fn, state.mean, state.chol)
            return ESSState(state.i + 1, z, value, n, state.mean, state.chol, key)

        return jax.vmap(one)(state) if self._vectorized else one(state)

    def postprocess_fn(self, model_args, model_kwargs):
        if self._laplace is not None:
            info = self._laplace[0]
            return lambda z: info.constrain(z, model_args, model_kwargs)
        ellipse, model = self._ellipse, self._model

        def to_sites(z):
            values = ellipse.unravel(z)
            tr = handlers.trace(handlers.substitute(handlers.seed(model, 0), data=values)).get_trace(
                *model_args, **model_kwargs
            )
            deterministic = {n: s["value"] for n, s in tr.items() if s["type"] == "deterministic"}
            return {**values, **deterministic}

        return to_sites

    def get_diagnostics_str(self, state):
        return f"{int(state.num_evals)} likelihood evaluations"
