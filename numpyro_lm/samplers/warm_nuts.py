r"""NUTS warm-started from a Laplace Matching fit: initial point and mass matrix.

NUTS works in NumPyro's unconstrained space ``u`` (``biject_to(support).inv(x)`` per
site: stick-breaking for simplices, the Cholesky factor's log-diagonal for
positive-definite matrices), LM in its own basis ``y`` (zero-sum softmax, matrix log).
The LM Gaussian :math:`N(y^*, \Sigma)` is carried over by the change of coordinates
``u(y)``, linearised at the mode:

.. math:: u^* = u(y^*), \qquad \Sigma_u = J \Sigma J^\top, \quad J = \partial u/\partial y\,(y^*).

NUTS adapts its step size in any case; its *inverse mass matrix* should approximate the
posterior covariance in ``u``, which :math:`\Sigma_u` does wherever LM is good. NumPyro
flattens the sites in *sorted* order of their names (``tuple(sorted(z))`` in
``HMC.init``), so :math:`\Sigma_u` is built in that order and passed keyed by that tuple.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from numpyro.distributions.transforms import biject_to
from numpyro.infer import NUTS
from numpyro.infer.initialization import init_to_value

from ..mode.derivatives import diagonal_slope, jacobian
from ..runtime.programs import program, resolve_compiler_options

__all__ = ["WarmStart", "Fitted", "fitted", "unconstrained_gaussian", "warm_nuts", "DENSE_MAX_DIM"]

DENSE_MAX_DIM = 500
"""Largest dimension for which :func:`warm_nuts` passes a dense mass matrix."""


class WarmStart(NamedTuple):
    """A NUTS kernel set up from an LM fit, and where to start it.

    ``init_params`` are NumPyro's unconstrained values at the LM mode, for
    ``MCMC.run(..., init_params=...)`` (the kernel's ``init_strategy`` starts there too).
    """

    kernel: NUTS
    init_params: dict
    inverse_mass_matrix: dict


def numpyro_coordinates(info, flat, args, kwargs):
    """``({site: numpyro unconstrained value}, {site: constrained value})`` at basis coordinates ``flat``."""
    tr = info.trace(flat, args, kwargs)
    sites = [s.name for s in info.layout.sites]
    unconstrained = {n: biject_to(tr[n]["fn"].support).inv(tr[n]["value"]) for n in sites}
    return unconstrained, {n: tr[n]["value"] for n in sites}


def _moments(info, names, gaussian, args, kwargs):
    """Mode (unconstrained and constrained) and ``J Sigma J'`` in NumPyro's coordinates."""

    def flat_u(y):
        u, _ = numpyro_coordinates(info, y, args, kwargs)
        return jnp.concatenate([jnp.ravel(u[n]) for n in names])

    mode, constrained = numpyro_coordinates(info, gaussian.mean, args, kwargs)
    jac = jacobian(flat_u, gaussian.mean)
    if jac.shape[0] != jac.shape[1]:
        raise ValueError(
            f"the LM basis has {jac.shape[1]} coordinates but NumPyro's unconstrained space "
            f"{jac.shape[0]}: the LM covariance cannot be carried over (a site whose basis "
            "is not a bijection onto NumPyro's unconstrained space)."
        )
    cov_u = gaussian.curvature.solve(jac) @ jac.T  # J H^-1 J'
    return mode, constrained, 0.5 * (cov_u + cov_u.T)


SITE_JACOBIAN_MAX = 500
"""Largest site whose Jacobian :func:`_variances` forms (larger ones must be elementwise)."""


def _variances(info, names, gaussian, args, kwargs):
    """Mode (unconstrained and constrained) and ``diag(J Sigma J')`` without a ``D x D`` array.

    A site's unconstrained value depends on its own basis coordinates only, so ``J`` is block
    diagonal by site: ``diag(J_s Sigma_ss J_s')`` per site, with ``Sigma_ss`` the curvature's
    block; a site larger than :data:`SITE_JACOBIAN_MAX` must map elementwise (``J_s``
    diagonal: one forward product with ones), as random effects in any basis do.
    """
    mode, constrained = numpyro_coordinates(info, gaussian.mean, args, kwargs)
    variance = gaussian.curvature.variance()
    out = {}
    for site in info.layout.sites:
        index = np.arange(site.offset, site.offset + site.size)

        def u_of(y_site, site=site):
            y = gaussian.mean.at[index].set(y_site)
            return jnp.ravel(numpyro_coordinates(info, y, args, kwargs)[0][site.name])

        y_site = gaussian.mean[index]
        if site.size <= SITE_JACOBIAN_MAX:
            jac = jacobian(u_of, y_site)
            if jac.shape[0] != jac.shape[1]:
                raise ValueError(f"site {site.name!r}: its LM basis has {jac.shape[1]} coordinates but NumPyro's "
                                 f"unconstrained space {jac.shape[0]}: the LM covariance cannot be carried over.")
            out[site.name] = jnp.sum((jac @ gaussian.curvature.block(index)) * jac, axis=1)
        elif site.basis_event_dim == 0:
            slope = diagonal_slope(u_of, y_site)
            out[site.name] = slope**2 * variance[index]
        else:
            raise ValueError(f"site {site.name!r}: a warm start of a model this large carries a diagonal mass matrix, "
                             f"which needs an elementwise basis for a site of {site.size} coordinates; its "
                             f"{site.basis!r} basis is not. Start NUTS with init_params only.")
    return mode, constrained, jnp.concatenate([out[n] for n in names])


class Fitted(NamedTuple):
    """What a warm start reads of one fit: the model, its traced form, the Gaussian in the LM basis,
    the arguments it was fitted to and the compiler options of its programs."""

    model: object
    info: object
    gaussian: object
    args: tuple
    kwargs: dict
    compiler_options: object = None


def fitted(lm) -> Fitted:
    """The :class:`Fitted` of a fitted :class:`~numpyro_lm.LaplaceMatching` (one data set)."""
    if lm.batch_size is not None:
        raise ValueError("a warm start needs one fit: this LaplaceMatching holds run_many's batch of fits. Fit the "
                         "data set you want to sample with run().")
    return Fitted(lm.model, lm.model_info, lm.gaussian, lm.model_args, lm.model_kwargs,
                  resolve_compiler_options(lm.compiler_options, lm.layout))


def _moments_of(fit: Fitted, dense: bool = True):
    """``(names, (mode, constrained, cov or its diagonal))`` of a fit."""
    names = tuple(sorted(s.name for s in fit.info.layout.sites))
    compiled = program(_moments if dense else _variances, fit.info, names, compiler_options=fit.compiler_options)
    return names, compiled((fit.gaussian,), fit.args, fit.kwargs)


def unconstrained_gaussian(lm):
    """``(names, mode, cov)``: the LM Gaussian in NumPyro's unconstrained space.

    ``names`` are the latent sites in NumPyro's (sorted) order, ``mode`` is
    ``{site: unconstrained value}`` and ``cov`` the covariance of the sites' flattened
    values concatenated in that order.
    """
    names, (mode, _, cov) = _moments_of(fitted(lm))
    return names, mode, cov


def warm_nuts(lm, *, dense_max_dim: int = DENSE_MAX_DIM, adapt_mass_matrix: bool = False, **nuts_kwargs) -> WarmStart:
    """A :class:`~numpyro.infer.NUTS` kernel that starts from a fitted LM posterior.

    The initial point is the LM mode and the inverse mass matrix the LM covariance, both
    in NumPyro's unconstrained space (module docstring): dense up to ``dense_max_dim``
    coordinates, its diagonal beyond. Use with a short warmup::

        warm = warm_nuts(lm)
        mcmc = MCMC(warm.kernel, num_warmup=150, num_samples=1000)
        mcmc.run(key, *args, init_params=warm.init_params, **kwargs)

    :param lm: a fitted :class:`~numpyro_lm.LaplaceMatching` (its ``model_info``,
        ``gaussian`` and ``model_args`` / ``model_kwargs`` are used), or a :class:`Fitted`.
    :param int dense_max_dim: largest dimension with a dense mass matrix.
    :param bool adapt_mass_matrix: re-estimate the mass matrix during warmup. Off by
        default: a short warmup's windows hold too few draws to improve on the LM
        covariance (NumPyro's last window of a 150-step warmup has 50); turn it on with a
        longer warmup where LM is far off (``diagnostics()["pareto_k"] > 0.7``).
    :param nuts_kwargs: any other :class:`~numpyro.infer.NUTS` argument (``step_size``,
        ``target_accept_prob``, ``max_tree_depth``...). The step size is adapted during
        warmup unless ``adapt_step_size=False``.
    """
    fit = lm if isinstance(lm, Fitted) else fitted(lm)
    dense = fit.info.layout.size <= dense_max_dim
    names, (mode, constrained, cov) = _moments_of(fit, dense)  # beyond dense_max_dim: only the diagonal
    if not bool(jnp.all(jnp.isfinite(cov))):
        raise ValueError("the LM covariance in NumPyro's unconstrained space is not finite")
    inverse_mass_matrix = {names: cov}
    nuts_kwargs.setdefault("init_strategy", init_to_value(values=constrained))
    kernel = NUTS(
        fit.model,
        inverse_mass_matrix=dict(inverse_mass_matrix),  # NumPyro fills the dict it is given
        dense_mass=dense,
        adapt_mass_matrix=adapt_mass_matrix,
        **nuts_kwargs,
    )
    return WarmStart(kernel, {k: np.asarray(v) for k, v in mode.items()}, inverse_mass_matrix)
