"""The joint fit's driver (numpyro_lm/approximations/joint.py): a float32 fit whose dense curvature
float32 cannot resolve is finished again in float64 instead of refused."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching, NotPositiveDefiniteError
from numpyro_lm.approximations import joint as joint_module
from numpyro_lm.curvature import singular_floor

RHO = 1.0 - 2.0**-22  # float32 holds it exactly: the pair's correlation matrix has eigenvalues 2^-22 and 2 - 2^-22
D = 10
PRIOR_SD = 1e4


def _precision():
    p = np.eye(D)
    p[0, 1] = p[1, 0] = RHO
    return p.astype(np.float32)


def nearly_collinear(precision, mean):
    """A Gaussian likelihood term with a precision whose first two coordinates are all but
    collinear, under wide Normal priors: the posterior is Gaussian with precision
    ``P + I / PRIOR_SD^2`` and mean ``(P + I / PRIOR_SD^2)^-1 P m`` in closed form."""
    x = numpyro.sample("x", dist.Normal(0.0, PRIOR_SD).expand([D]).to_event(1))
    d = x - mean
    numpyro.factor("likelihood", -0.5 * d @ precision @ d)


@pytest.mark.slow
def test_a_curvature_float32_cannot_resolve_is_finished_in_float64(monkeypatch, x32):
    """The scaled precision's smallest eigenvalue, 2^-22 = 2.4e-7, lies below float32's singular
    floor (sqrt(10) eps32 x 2 = 7.5e-7) and far above float64's: the fit is finished in float64
    from its float32 mode, kept in float32, and its curvature and mode are the closed form's (the
    eigenvalues to float32's relative precision; the mode to 1e-3 posterior SD in every
    eigendirection), and the verdict trusts it. With the retry switched off the same call is refused as
    numerically singular."""
    precision, mean = _precision(), np.linspace(1.0, 2.0, D).astype(np.float32)
    exact_precision = precision.astype(np.float64) + np.eye(D) / PRIOR_SD**2
    exact_mean = np.linalg.solve(exact_precision, precision.astype(np.float64) @ mean)
    scale = 1 / np.sqrt(np.diag(exact_precision))
    exact_w = np.linalg.eigvalsh(scale[:, None] * exact_precision * scale[None, :])
    assert exact_w[0] < float(singular_floor(jnp.asarray(exact_w, jnp.float32)))  # float32 calls it singular
    assert exact_w[0] > np.sqrt(D) * np.finfo(np.float64).eps * exact_w[-1]  # float64 resolves it

    lm = LaplaceMatching(nearly_collinear, strategy="laplace", progress_bar=False)
    lm.run(jax.random.PRNGKey(0), precision, mean)
    state = lm.state
    assert state.mode.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(state.curvature.eigenvalues), exact_w, rtol=1e-3)
    w, v = np.linalg.eigh(exact_precision)
    error_in_sds = np.abs(v.T @ (np.asarray(state.mode, np.float64) - exact_mean)) * np.sqrt(w)
    assert np.max(error_in_sds) < 1e-3
    assert np.all(np.isfinite(np.asarray(lm.get_samples()["x"])))
    # the verdict judges the condition number (8e6) by the precision the curvature was decomposed in
    assert lm.diagnostics()["trusted"]

    monkeypatch.setattr(joint_module, "FLOAT64_RETRY_DIM", 0)
    with pytest.raises(NotPositiveDefiniteError, match="numerically singular|not positive definite"):
        LaplaceMatching(nearly_collinear, strategy="laplace", progress_bar=False).run(
            jax.random.PRNGKey(0), precision, mean)
