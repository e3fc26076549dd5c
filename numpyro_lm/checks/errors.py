"""From a fit's flags to errors a user can act on: the site, the cause, the fix.

The pure core (:func:`numpyro_lm.mode.laplace_state.laplace`) reports problems as flags; these
functions turn one fit's flags, on the host, into the package's errors and warnings.
"""

from __future__ import annotations

import warnings
from typing import Optional

import jax
import numpy as np

from ..curvature import singular_floor
from ..curvature.base import PEAKED

__all__ = ["NotPositiveDefiniteError", "FitChecks", "fit_error", "convergence_warning", "check_fit", "clearly_negative",
           "not_positive_definite"]


class NotPositiveDefiniteError(ValueError):
    """The negative Hessian at the mode is not positive definite."""


class FitChecks:
    """One fit's flags, as host values: ``finite`` (the log density at the mode), ``positive``
    (the curvature), ``params`` (``{site: bool}``: its matched parameters are finite),
    ``converged``, ``num_iter``, ``decrement``, ``grad_norm``."""

    def __init__(self, finite, positive, params, converged, num_iter, decrement, grad_norm):
        self.finite, self.positive, self.params = bool(finite), bool(positive), params
        self.converged, self.num_iter = bool(converged), int(num_iter)
        self.decrement, self.grad_norm = float(decrement), float(grad_norm)


def _where(data_set: Optional[int]) -> str:
    return "" if data_set is None else f"data set {data_set}: "


def clearly_negative(eigval, eps: float) -> bool:
    """Whether the smallest of the ascending eigenvalues ``eigval`` is negative beyond round-off in
    a precision of machine epsilon ``eps`` (``sqrt(eps)`` of the largest): a saddle, which no
    precision resolves."""
    return bool(eigval[0] < -np.sqrt(eps) * max(abs(eigval[-1]), 1.0))


def not_positive_definite(layout, curvature, data_set: Optional[int] = None) -> NotPositiveDefiniteError:
    """The error for a curvature that is not positive definite, naming the coordinates of its
    flat directions (their share of the offending eigenvectors)."""
    if hasattr(curvature, "failing_blocks"):
        return _structured_not_positive_definite(layout, curvature, data_set)
    if hasattr(curvature, "failing_directions"):
        return _lowrank_not_positive_definite(layout, curvature, data_set)
    eigval, eigvec = jax.device_get(curvature.spectrum())
    dtype = np.asarray(eigval).dtype
    eigval, eigvec = np.asarray(eigval, np.float64), np.asarray(eigvec, np.float64)
    if not np.all(np.isfinite(eigval)):
        # no spectrum to read: the Hessian itself is not finite (an infinite density or a
        # mode at the edge of the support, e.g. a scale collapsing to zero in a funnel)
        return NotPositiveDefiniteError(
            f"{_where(data_set)}the negative Hessian at the mode is not finite: the mode search ran into an "
            "infinite density or the edge of a site's support (a hierarchical scale collapsing to zero: a "
            "funnel). Reparameterise (non-centred: numpyro.infer.reparam.LocScaleReparam), give the scale a "
            "prior that keeps it off zero, or use nested Laplace over the scale (hyper=[...]; the default "
            "strategy='auto' without refine= picks it by itself)."
        )
    floor = float(singular_floor(eigval))
    bad = np.flatnonzero(eigval <= floor) if np.any(eigval <= floor) else np.array([0])
    weights = np.sum(eigvec[:, bad] ** 2, axis=1)
    top = np.argsort(-weights)[:5]
    where = ", ".join(f"{layout.coordinate(int(i))} ({weights[i]:.2f})" for i in top if weights[i] > 1e-3)
    eps = float(np.finfo(dtype).eps)
    if clearly_negative(eigval, eps):
        # clearly negative, not round-off: the density curves downwards-up here
        hint = ("the search ended at a saddle point, not a mode (the density rises along these directions: a "
                "symmetric mixture, a double well, a start at a symmetric point); start elsewhere: init_params=, "
                "init_strategy=numpyro.infer.init_to_sample or num_starts=8")
    elif eigval[-1] > PEAKED:
        hint = (f"the density is all but infinitely peaked there (a curvature of {eigval[-1]:.1e}: posterior SDs "
                "of 1e-6 in the basis): the search ran towards the edge of the space, a scale collapsing to zero "
                "with the values it scales (a funnel: no joint mode). Use nested Laplace over that scale "
                "(hyper=[...]; the default strategy='auto' picks it where the structure shows it), or a "
                "non-centred parameterisation")
    elif dtype == np.float32:
        hint = ('float32 round-off (Hessians of models with many observations are often not positive definite in '
                'float32: enable float64 with jax.config.update("jax_enable_x64", True)), or a direction the data '
                "and priors do not identify (an improper prior, a parameter the likelihood does not see: give it a "
                "proper prior)")
    else:
        hint = "the model's density may be improper or unidentified along these directions: give them a proper prior"
    if eigval[0] > 0:
        what = (f"numerically singular (eigenvalues from {eigval[0]:.3g} to {eigval[-1]:.3g}: a "
                f"condition number beyond what {dtype} resolves)")
    else:
        what = f"not positive definite (smallest eigenvalue {eigval[0]:.3g})"
    return NotPositiveDefiniteError(
        f"{_where(data_set)}the negative Hessian at the mode is {what}; the flat directions involve {where}. "
        f"Likely cause: {hint}. As a last resort pass regularize=<ridge> to LaplaceMatching (this "
        "changes the posterior)."
    )


def _structured_not_positive_definite(layout, curvature, data_set) -> NotPositiveDefiniteError:
    """:func:`not_positive_definite` for a block-arrowhead curvature: which plate entries' blocks,
    or the global coordinates' Schur complement, failed (no dense spectrum of 10^5 coordinates)."""
    local, schur = jax.device_get(curvature.failing_blocks())
    bad = np.flatnonzero(np.asarray(local))
    index = np.asarray(jax.device_get(curvature.local_index))
    parts = []
    if bad.size:
        names = ", ".join(layout.coordinate(int(i)) for i in index[bad[:3]].ravel())
        parts.append(f"the local blocks of {bad.size} plate entries (the first: {names})")
    if bool(schur) or not bad.size:
        glob = np.asarray(jax.device_get(curvature.global_index))
        parts.append("the global coordinates once the local ones are eliminated (" +
                     ", ".join(layout.coordinate(int(i)) for i in glob[:5]) + (" ..." if glob.size > 5 else "") + ")")
    return NotPositiveDefiniteError(
        f"{_where(data_set)}the negative Hessian at the mode is not positive definite (or numerically singular) "
        f"in {' and '.join(parts)}. Likely cause: a direction the data and priors do not identify there; give "
        "it a proper prior, use float64, or as a last resort pass regularize=<ridge> (this changes the posterior)."
    )


def _lowrank_not_positive_definite(layout, curvature, data_set) -> NotPositiveDefiniteError:
    """:func:`not_positive_definite` for a low-rank-updated curvature: the coordinates of the
    update's directions that are not positive (no dense spectrum of ``D`` coordinates)."""
    if not bool(jax.device_get(curvature.base.positive())):
        return not_positive_definite(layout, curvature.base, data_set)
    weights = np.asarray(jax.device_get(curvature.failing_directions()), np.float64)
    top = np.argsort(-weights)[:5]
    where = ", ".join(f"{layout.coordinate(int(i))} ({weights[i]:.2f})" for i in top if weights[i] > 1e-3)
    return NotPositiveDefiniteError(
        f"{_where(data_set)}the negative Hessian at the mode is not positive definite along directions that "
        f"involve {where or 'many coordinates'}. Likely cause: the model has no joint mode there (with more "
        "coefficients than observations a regression can fit the data exactly and its noise scale collapses "
        "to zero: use nested Laplace over the scale, hyper=[...], or the default strategy), or a direction the "
        "data and priors do not identify (give it a proper prior, use float64)."
    )


def fit_error(layout, checks: FitChecks, curvature, data_set: Optional[int] = None) -> Optional[ValueError]:
    """The error a failed fit deserves (``None`` if it did not fail); ``curvature()`` gives its
    curvature, asked for only when it is not positive definite."""
    if not checks.finite:
        return ValueError(
            f"{_where(data_set)}the log density is not finite at the initial point or the mode. Check the "
            "model's supports and data, or pass init_params= / init_strategy=."
        )
    if not checks.positive:
        error = not_positive_definite(layout, curvature(), data_set)
        if not checks.converged:  # the budget ran out before a mode: that is the cause to name first
            return NotPositiveDefiniteError(
                f"{_where(data_set)}the mode search did not converge after {checks.num_iter} iterations (last "
                f"Newton step {checks.decrement:.2e} posterior SDs): increase max_iter, or start elsewhere "
                f"(init_params=, init_strategy=). Where it stopped, {str(error)[len(_where(data_set)):]}")
        return error
    for site in layout.sites:
        if not checks.params[site.name]:
            return ValueError(
                f"{_where(data_set)}site {site.name!r}: the matched {site.family!r} parameters are not "
                f"finite. Choose families={{{site.name!r}: 'gaussian'}} for this site or use float64."
            )
    return None


def convergence_warning(checks: FitChecks) -> Optional[str]:
    """The warning for a mode search that did not converge (``None`` if it did)."""
    if checks.converged:
        return None
    return (f"the mode search did not converge after {checks.num_iter} iterations (last Newton step "
            f"{checks.decrement:.2e} posterior SDs, max |gradient| {checks.grad_norm:.2e}). Increase max_iter, "
            "use float64, or check the model for an unbounded density.")


def check_fit(layout, checks: FitChecks, curvature, stacklevel: int = 4):
    """Raise :func:`fit_error`'s error, after warning where the search did not converge (a fit
    whose log density or curvature is unusable raises without the warning)."""
    error = fit_error(layout, checks, lambda: curvature)
    if error is not None and (not checks.finite or not checks.positive):
        raise error
    warning = convergence_warning(checks)
    if warning is not None:
        warnings.warn(warning, stacklevel=stacklevel)
    if error is not None:
        raise error
