"""ArviZ export: groups, dims and coords, and ArviZ's own functions on LM output (float32)."""

import warnings

import arviz as az
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching
from numpyro_lm.inference_data import model_dims, unobserved
from numpyro_lm.runtime.random import num_pseudo_chains

matplotlib.use("Agg")

GROUPS = ["north", "south", "east", "west"]


def regression(x, group, num_groups, slope=True, y=None):
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0)) if slope else 0.0
    with numpyro.plate("obs", x.shape[0]):
        mu = numpyro.deterministic("mu", a[group] + b * x)
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def data(n=60):
    rng = np.random.default_rng(0)
    group = rng.integers(0, len(GROUPS), n)
    x = rng.normal(size=n).astype(np.float32)
    y = (rng.normal(size=len(GROUPS))[group] + 0.8 * x + 0.3 * rng.normal(size=n)).astype(np.float32)
    return x, group, y


@pytest.fixture(scope="module")
def fitted():
    x, group, y = data()
    lm = LaplaceMatching(regression).run(jax.random.PRNGKey(0), x, group, len(GROUPS), y=y)
    idata = lm.to_inference_data(
        rng_key=jax.random.PRNGKey(1), posterior_predictive=True, prior=True, coords={"groups": GROUPS}
    )
    return lm, idata, (x, group, y)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_groups_dims_and_coords(fitted):
    lm, idata, (x, group, y) = fitted
    N = x.shape[0]
    c, n = num_pseudo_chains(lm.num_samples), lm.num_samples // num_pseudo_chains(lm.num_samples)
    assert c == 4  # 1000 independent draws as four pseudo-chains
    assert set(idata.groups()) == {
        "posterior", "sample_stats", "log_likelihood", "posterior_predictive", "prior",
        "prior_predictive", "observed_data", "constant_data",
    }
    assert idata.posterior["a"].dims == ("chain", "draw", "groups")
    assert list(idata.posterior["groups"].values) == GROUPS
    assert idata.posterior["mu"].dims == ("chain", "draw", "obs")
    assert idata.posterior["sigma"].shape == (c, n)
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "obs") and idata.log_likelihood["y"].shape == (c, n, N)
    assert set(idata.sample_stats.data_vars) == {"lp", "log_q", "log_weight"}
    np.testing.assert_array_equal(idata.observed_data["y"].values, y)
    assert set(idata.observed_data.data_vars) == {"y"}  # no LM-internal Jacobian factors
    np.testing.assert_array_equal(idata.constant_data["x"].values, x)
    np.testing.assert_array_equal(idata.constant_data["group"].values, group)
    assert idata.posterior_predictive["y"].shape == (c, n, N)
    assert idata.prior["a"].shape == (c, n, len(GROUPS)) and idata.prior_predictive["y"].shape == (c, n, N)


def test_log_likelihood_is_pointwise(fitted):
    lm, idata, (x, group, y) = fitted
    draw = idata.posterior.isel(chain=0, draw=7)
    expected = dist.Normal(draw["mu"].values, draw["sigma"].values).log_prob(y)
    np.testing.assert_allclose(idata.log_likelihood["y"].values[0, 7], expected, rtol=1e-5)


def test_predictive_and_prior_draws_follow_the_model(fitted):
    lm, idata, (x, group, y) = fitted
    y_rep = idata.posterior_predictive["y"].values.reshape(lm.num_samples, -1)
    assert not np.allclose(y_rep[0], y)  # replicates, not a copy of the data
    # E[y_rep] = E[mu]: per observation the MC error of the mean is about sigma/sqrt(n) = 0.01
    np.testing.assert_allclose(y_rep.mean(0), idata.posterior["mu"].values.reshape(lm.num_samples, -1).mean(0), atol=0.05)
    # prior sigma ~ HalfNormal(1): mean sqrt(2/pi) = 0.80, sd 0.60, MC error 0.02
    assert abs(idata.prior["sigma"].values.mean() - np.sqrt(2 / np.pi)) < 0.08


def test_from_numpyro_matches(fitted):
    lm, idata, _ = fitted
    other = az.from_numpyro(lm, coords={"groups": GROUPS})
    for name in ("a", "b", "sigma", "mu"):
        np.testing.assert_array_equal(other.posterior[name].values, idata.posterior[name].values)
        assert other.posterior[name].dims == idata.posterior[name].dims
    np.testing.assert_allclose(other.log_likelihood["y"].values, idata.log_likelihood["y"].values, rtol=1e-6)
    np.testing.assert_array_equal(other.sample_stats["log_q"].values, idata.sample_stats["log_q"].values)


@pytest.mark.slow
def test_arviz_functions_run_on_lm_output(fitted):
    lm, idata, (x, group, y) = fitted
    summary = az.summary(idata, var_names=["a", "b", "sigma"], kind="stats")
    assert list(summary.index) == [f"a[{g}]" for g in GROUPS] + ["b", "sigma"]
    loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo) and loo.n_data_points == x.shape[0]
    axes = az.plot_posterior(idata, var_names=["b", "sigma"])
    assert np.size(axes) == 2
    # y depends on x with slope 0.8 (0.3 noise): the model without the slope must rank last
    flat = LaplaceMatching(regression).run(jax.random.PRNGKey(0), x, group, len(GROUPS), slope=False, y=y)
    table = az.compare({"slope": idata, "no_slope": flat.to_inference_data()})
    assert list(table.index) == ["slope", "no_slope"]
    assert table.loc["no_slope", "elpd_diff"] > 4 * table.loc["no_slope", "dse"]


def test_az_summary_of_a_fit_has_no_warnings_and_defined_diagnostics(fitted, caplog):
    lm, _, _ = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning (ArviZ's FutureWarnings included) fails
        summary = az.summary(az.from_numpyro(lm), var_names=["b", "sigma"])
    assert "Shape validation failed" not in caplog.text  # ArviZ logs, not warns, about one chain
    # independent draws: r_hat is 1 up to its noise (about 1/sqrt(S) = 0.03) and ESS near S
    assert np.all(np.abs(summary["r_hat"] - 1.0) < 0.05)
    assert np.all(summary["ess_bulk"] > 0.5 * lm.num_samples)


def test_model_dims_follow_plates_and_event_dims():
    def model():
        with numpyro.plate("outer", 2, dim=-2), numpyro.plate("inner", 3):
            numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("v", dist.Dirichlet(jnp.ones(4)), infer={"event_dims": ["category"]})

    trace = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace()
    assert model_dims(trace) == {"z": ["outer", "inner"], "v": ["category"]}


def test_unobserved_samples_observed_sites():
    def model(y):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    trace = numpyro.handlers.trace(numpyro.handlers.seed(unobserved(model), 0)).get_trace(jnp.array(100.0))
    assert not trace["y"]["is_observed"] and abs(float(trace["y"]["value"])) < 10
