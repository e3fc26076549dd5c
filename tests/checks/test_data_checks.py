"""Observed data the model cannot evaluate: the failed fit names the site, the values and the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching, ObservedDataError
from numpyro_lm.checks.data import observed_data_problem
from numpyro_lm.core.model import model_info


def normal(y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    s = numpyro.sample("s", dist.HalfNormal(1))
    with numpyro.plate("n", 20):
        numpyro.sample("y", dist.Normal(mu, s), obs=y)


def poisson(y=None):
    b = numpyro.sample("b", dist.Normal(0, 1))
    with numpyro.plate("n", 6):
        numpyro.sample("y", dist.Poisson(jnp.exp(b)), obs=y)


def masked(y, mask):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1), obs=y, obs_mask=mask)


Y = np.random.default_rng(0).normal(size=20)


@pytest.mark.parametrize("bad, kind, where", [(np.nan, "NaN", "y[12]"), (np.inf, "infinite", "y[12]")])
def test_non_finite_observations_are_named(bad, kind, where):
    y = Y.copy()
    y[12] = bad
    with pytest.raises(ObservedDataError, match=rf"observed site 'y': 1 of 20 values are {kind} \(at y\[12\]\).*obs_mask"):
        LaplaceMatching(normal, progress_bar=False).run(jax.random.PRNGKey(0), y=y)


def test_values_outside_the_support_are_named():
    y = np.array([1.0, 2.0, -1.0, 0.0, 3.0, 1.0])
    info = model_info(poisson, (), {"y": y})
    problem = observed_data_problem(info, (), {"y": y})
    assert isinstance(problem, ObservedDataError)
    assert "1 of 6 values lie outside the support of its Poisson likelihood" in str(problem)
    assert "y[2] = -1.0" in str(problem)


def test_good_data_and_masked_missing_values_are_no_problem():
    info = model_info(normal, (), {"y": Y})
    assert observed_data_problem(info, (), {"y": Y}) is None
    y, mask = Y.copy(), np.ones(20, bool)
    y[[3, 7]], mask[[3, 7]] = np.nan, False  # missing values as NaN, dropped by the mask
    info = model_info(masked, (y, mask), {})
    assert observed_data_problem(info, (y, mask), {}) is None


def test_a_failed_run_leaves_the_last_fit_as_it_was():
    lm = LaplaceMatching(normal, progress_bar=False).run(jax.random.PRNGKey(0), y=Y)
    before = {k: np.asarray(v) for k, v in lm.get_samples().items()}
    verdict = lm.diagnostics()["verdict"]
    y = Y.copy()
    y[0] = np.nan
    with pytest.raises(ObservedDataError):
        lm.run(jax.random.PRNGKey(1), y=y)
    after = lm.get_samples()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    assert lm.diagnostics()["verdict"] == verdict
    np.testing.assert_array_equal(lm.model_kwargs["y"], Y)
