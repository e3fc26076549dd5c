"""numpyro_lm.checks.covariance: a GP prior whose covariance float32 cannot factorise is named."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching
from numpyro_lm.checks.covariance import PriorCovarianceError, prior_covariance_problem
from numpyro_lm.core.model import model_info


def latent_gp(x, y, jitter=1e-6):
    var = numpyro.sample("kernel_var", dist.LogNormal(0.0, 1.0))
    length = numpyro.sample("kernel_length", dist.LogNormal(0.0, 1.0))
    noise = numpyro.sample("noise", dist.HalfNormal(1.0))
    k = var * jnp.exp(-0.5 * ((x[:, None] - x) / length) ** 2) + jitter * jnp.eye(x.shape[0])
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=k))
    numpyro.sample("y", dist.Normal(f, noise), obs=y)


def _data(n):
    rng = np.random.default_rng(10)
    x = np.linspace(-1, 1, n).astype(np.float32)
    return x, (np.sin(3 * x) + 0.2 * rng.normal(size=n)).astype(np.float32)


@pytest.mark.parametrize("n, jitter, named", [
    pytest.param(300, 1e-6, True, marks=pytest.mark.slow),  # eigenvalues down to round-off: below eps * lambda_max = 3e-5
    (300, 1e-1, False),  # above n * eps * lambda_max = 8e-3: the factorisation cannot break down
    (20, 1e-2, False),   # 20 points: n * eps * lambda_max = 2e-5, far below the jitter
])
def test_a_covariance_below_float32s_resolution_is_named_with_the_jitter_that_lifts_it(x32, n, jitter, named):
    x, y = _data(n)
    model = lambda x, y: latent_gp(x, y, jitter)  # noqa: E731
    problem = prior_covariance_problem(model_info(model, (x, y), {}), (x, y), {})
    if not named:
        assert problem is None
        return
    assert isinstance(problem, PriorCovarianceError)
    assert "site 'f'" in str(problem) and "300 x 300" in str(problem) and "jitter of at least 3e-04" in str(problem)


@pytest.mark.slow  # a 300-point latent GP fit that fails part way: CI=true and make test-all
def test_the_failed_fit_raises_the_named_cause(x32):
    x, y = _data(300)
    with pytest.raises(PriorCovarianceError, match=r"site 'f'.*Add a jitter of at least"):
        LaplaceMatching(latent_gp, progress_bar=False).run(jax.random.PRNGKey(0), x, y)
