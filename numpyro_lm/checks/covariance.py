r"""A prior covariance that the fit's precision cannot factorise, named: the cause behind a fit that failed.

A latent Gaussian process written as ``MultivariateNormal(0, covariance_matrix=K + jitter I)``
needs the Cholesky factor of its covariance wherever the log density is evaluated (numpyro's
``log_prob``, and the ``whiten`` basis ``f = L z``). A Cholesky factorisation in precision
``eps`` (float32: 6e-8) breaks down, giving NaN, where the covariance's smallest eigenvalue is
below about :math:`n \, \varepsilon \, \lambda_{\max}` (Higham 2002, "Accuracy and Stability of
Numerical Algorithms", thm. 10.7): an RBF kernel on 300 close inputs has eigenvalues down to
the jitter, and a jitter of 1e-6 on a kernel of variance 1 is ten times below float32's
resolution there. Whether a given point's factorisation fails then depends on round-off, so the
fit fails somewhere along the way with a log density that is not finite.

:func:`prior_covariance_problem` reads the covariances of the model's multivariate-normal
latent sites at the fit's starting point and names the first whose condition number exceeds
what the precision factorises for certain, with the jitter that lifts its smallest
eigenvalues above their round-off. It runs on failure only,
after :func:`~numpyro_lm.checks.data.observed_data_problem` (:func:`failure_cause`, which
every fit's failure path asks). The library does not add jitter
itself: that would change the model in silence.
"""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np
from numpyro.distributions import MultivariateNormal
from numpyro.distributions.distribution import validation_enabled

from ..core.starts import origin_point
from .data import observed_data_problem

__all__ = ["PriorCovarianceError", "prior_covariance_problem", "failure_cause"]

SAFETY = 10.0
"""The jitter suggested: this many times ``eps lambda_max``, the eigenvalues' round-off (on the
300-point RBF kernel of ``tests/checks/test_covariance.py`` 1e-5 = 0.7 eps lambda_max let the
fit through where 1e-6 did not)."""


class PriorCovarianceError(ValueError):
    """A multivariate-normal prior's covariance is singular in the precision the fit runs in."""


def _covariance(fn) -> Optional[np.ndarray]:
    while hasattr(fn, "base_dist") and not isinstance(fn, MultivariateNormal):  # Independent, Expanded
        fn = fn.base_dist
    if not isinstance(fn, MultivariateNormal):
        return None
    cov = fn.__dict__.get("covariance_matrix")  # as the user gave it: the factor may be NaN already
    if cov is None:
        scale = np.asarray(fn.scale_tril, np.float64)
        cov = scale @ np.swapaxes(scale, -1, -2)
    return np.asarray(cov)


def prior_covariance_problem(info, args, kwargs) -> Optional[PriorCovarianceError]:
    """The :class:`PriorCovarianceError` for the first multivariate-normal latent site whose
    covariance at the starting point is beyond what the precision factorises, or ``None``."""
    try:
        flat = jax.numpy.asarray(origin_point(info.layout), jax.numpy.result_type(float))
        with validation_enabled(False):  # numpyro's own check refuses exactly such a covariance
            trace = info.trace(flat, args, kwargs)
        latent = {s.name for s in info.layout.sites}
        for name, site in trace.items():
            if name not in latent:
                continue
            cov = _covariance(site["fn"])
            if cov is None or not np.all(np.isfinite(cov)):
                continue
            eps = float(np.finfo(cov.dtype).eps)
            n = cov.shape[-1]
            eig = np.linalg.eigvalsh(np.asarray(cov, np.float64).reshape((-1, n, n)))
            lowest, highest = float(eig[:, 0].min()), float(eig[:, -1].max())
            bound = n * eps * highest
            if lowest >= bound:
                continue
            return PriorCovarianceError(
                f"site {name!r}: the covariance of its MultivariateNormal prior ({n} x {n}, at the fit's starting "
                f"point) has eigenvalues from {lowest:.2g} to {highest:.2g}. In {cov.dtype} a Cholesky factorisation "
                f"is certain to succeed only above about n * eps * max = {bound:.1g}, and below eps * max = "
                f"{eps * highest:.1g} the smallest eigenvalues are round-off: the factor, and with it the log density, "
                f"is NaN at some points. Add a jitter of at least {SAFETY * eps * highest:.0e} to the covariance's "
                "diagonal (or a noise term), or enable float64 (jax.config.update('jax_enable_x64', True)).")
    except Exception:  # noqa: BLE001 - a diagnosis that cannot run leaves the original error
        return None
    return None


def failure_cause(info, args, kwargs) -> Optional[ValueError]:
    """The named cause behind a fit that failed, where one is found: the observed data's
    (:func:`~numpyro_lm.checks.data.observed_data_problem`), else a prior covariance the
    precision cannot factorise (:func:`prior_covariance_problem`)."""
    return observed_data_problem(info, args, kwargs) or prior_covariance_problem(info, args, kwargs)
