"""Every approximation of the package on the same model, against its closed-form posterior.

The Gaussian hierarchy ``mu ~ N(0, 5)``, ``theta_j ~ N(mu, 1)``, ``y_j ~ N(theta_j, 1)``
(``tests/shared_models.py``) has a Gaussian posterior: ``mu | y`` and ``theta_j | y`` are known
in closed form, every Laplace approximation of it is exact, and the sampled ones are right to
their Monte Carlo error. Each approximation is reached the way a user reaches it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC

from numpyro_lm import LaplaceMatching, LaplaceNUTS
from shared_models import Y, exact_posterior, gaussian_hierarchy

KEY = jax.random.PRNGKey(0)


def _joint(_):
    return LaplaceMatching(gaussian_hierarchy, strategy="laplace").run(KEY, Y).posterior


def _auto(_):
    lm = LaplaceMatching(gaussian_hierarchy).run(KEY, Y)
    assert lm.diagnostics()["trail"][-1]["trusted"]  # the auto-pilot stopped at a trusted candidate
    return lm.posterior


def _nested(_):
    lm = LaplaceMatching(gaussian_hierarchy, hyper=["mu"]).run(KEY, Y)
    assert lm.design is not None
    return lm.posterior


def _refined(_):
    return LaplaceMatching(gaussian_hierarchy, refine="dadvi").run(KEY, Y).posterior


def _batch(_):
    lm = LaplaceMatching(gaussian_hierarchy).run_many(KEY, jnp.stack([Y, Y, Y]))
    assert lm.posterior["mu"].batch_shape == (3,)
    return lm.posterior  # each data set's: checked against the same closed form


def _laplace_nuts(_):
    mcmc = MCMC(LaplaceNUTS(gaussian_hierarchy), num_warmup=200, num_samples=1000, progress_bar=False)
    mcmc.run(KEY, Y)
    return mcmc.get_samples()


EXACT = {"joint": _joint, "auto": _auto, "nested": _nested, "batch": _batch}


@pytest.mark.parametrize("name", list(EXACT))
def test_every_laplace_approximation_is_exact_on_a_gaussian_posterior(name):
    mean, sd, theta_mean, theta_sd = exact_posterior(Y)
    posterior = EXACT[name](name)
    # float32: the mode to the Newton tolerance (1e-3 SD), the curvature to rounding; the nested
    # fit integrates the marginal on a lattice (its moments exact for a Gaussian marginal)
    np.testing.assert_allclose(posterior["mu"].mean, mean, atol=2e-3 * sd)
    np.testing.assert_allclose(jnp.sqrt(posterior["mu"].variance), sd, rtol=2e-3)
    theta = posterior["theta"]  # (6,), or (3, 6) for the batch
    np.testing.assert_allclose(theta.mean, np.broadcast_to(theta_mean, np.shape(theta.mean)), atol=2e-3 * theta_sd)
    np.testing.assert_allclose(jnp.sqrt(theta.variance), np.broadcast_to(theta_sd, np.shape(theta.mean)), rtol=2e-3)


@pytest.mark.filterwarnings("ignore::numpyro_lm.NotTrustedWarning")  # the verdict sees the draws' error
def test_refinement_keeps_the_exact_gaussian_to_its_monte_carlo_error():
    """DADVI maximises a 300-draw estimate of the bound: on a Gaussian target its optimum moves
    off the exact Gaussian by the draws' error, about 1/sqrt(300) = 0.06 of an SD in the mean
    and 6% in the SD (the bounds: about three of that)."""
    mean, sd, theta_mean, theta_sd = exact_posterior(Y)
    posterior = _refined(None)
    assert abs(float(posterior["mu"].mean) - mean) < 0.2 * sd
    assert float(jnp.sqrt(posterior["mu"].variance)) == pytest.approx(sd, rel=0.2)
    np.testing.assert_allclose(jnp.sqrt(posterior["theta"].variance), theta_sd, rtol=0.2)


@pytest.mark.slow  # 8 s of NUTS: CI=true and make test-all (test_laplace_nuts.py keeps LaplaceNUTS fast)
def test_laplace_marginal_nuts_samples_the_exact_marginal():
    """1000 draws, about 500 effective: the mean's MC error is 0.045 SD, the SD's about 3%; the
    bounds are four of those."""
    mean, sd, theta_mean, theta_sd = exact_posterior(Y)
    samples = _laplace_nuts(None)
    assert abs(float(samples["mu"].mean()) - mean) < 0.18 * sd
    assert float(samples["mu"].std()) == pytest.approx(sd, rel=0.12)
    np.testing.assert_allclose(samples["theta"].mean(0), theta_mean, atol=0.2 * theta_sd)
