"""run_many: many data sets in one compiled program, sharded over devices; exact where conjugate."""

import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching
from numpyro_lm.runtime.batch import batch_of

pytestmark = pytest.mark.usefixtures("x64")
KEY = jax.random.PRNGKey(0)


def gamma_poisson(y):
    lam = numpyro.sample("lam", dist.Gamma(2.0, 3.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Poisson(lam), obs=y)


def counts(num_datasets, n=6, seed=1):
    return jax.random.poisson(jax.random.PRNGKey(seed), 2.5, (num_datasets, n)).astype(jnp.float64)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_run_many_is_exact_on_every_data_set():
    y = counts(200)
    lm = LaplaceMatching(gamma_poisson, num_samples=50).run_many(KEY, y)
    post = lm.posterior["lam"]
    assert lm.batch_size == 200 and post.batch_shape == (200,)
    # the Gamma-Poisson posterior Gamma(2 + sum y, 3 + n), data set by data set
    np.testing.assert_allclose(post.concentration, 2.0 + y.sum(1), rtol=1e-6)
    np.testing.assert_allclose(post.rate, 3.0 + y.shape[1], rtol=1e-6)
    assert lm.get_samples()["lam"].shape == (200, 50)
    assert lm.get_samples(group_by_chain=True)["lam"].shape == (200, 2, 25)  # two pseudo-chains
    d = lm.diagnostics()
    assert d["pareto_k"].shape == (200,) and bool(np.all(d["converged"])) and len(d["verdict"]) == 200
    assert np.all(np.asarray(d["pareto_k"]) == -np.inf)  # exact: constant weights on every data set


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_run_many_equals_run_one_by_one():
    y = counts(5, seed=2)
    many = LaplaceMatching(gamma_poisson, num_samples=20).run_many(KEY, y)
    keys = jax.random.split(KEY, 5)
    for i in (0, 3):
        one = LaplaceMatching(gamma_poisson, num_samples=20).run(keys[i], y[i])
        np.testing.assert_allclose(many.posterior["lam"].concentration[i], one.posterior["lam"].concentration,
                                   rtol=1e-10)
        # the same key gives the same draws, batched or not
        np.testing.assert_allclose(many.get_samples()["lam"][i], one.get_samples()["lam"], rtol=1e-10)


SHARDED = """
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from test_batch import KEY, counts, gamma_poisson
from numpyro_lm import LaplaceMatching
assert len(jax.devices()) == 2
y = counts(7, seed=3)  # not a multiple of the devices: padded, and the padding dropped
out = {}
for name, devices in (("sharded", None), ("single", jax.devices()[:1])):
    lm = LaplaceMatching(gamma_poisson, num_samples=30).run_many(KEY, y, devices=devices)
    out[name] = (np.asarray(lm.posterior["lam"].concentration), np.asarray(lm.get_samples()["lam"]),
                 np.asarray(lm.diagnostics()["pareto_k"]))
assert out["sharded"][0].shape == (7,) and out["sharded"][1].shape == (7, 30)
for a, b in zip(out["sharded"], out["single"]):
    np.testing.assert_allclose(a, b, rtol=1e-12)
# many large host-callback draws (quantiles) from a sharded batch: these deadlocked jaxlib
# when both devices called back at once
big = LaplaceMatching(gamma_poisson, num_samples=1000).run_many(KEY, counts(1000, seed=4))
assert np.all(np.isfinite(big.get_samples()["lam"]))
print("same numbers")
"""


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_sharded_over_two_devices_gives_the_single_device_numbers():
    # a fresh process: XLA's device count is fixed when JAX starts
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", SHARDED], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "same numbers" in done.stdout, done.stderr[-3000:]


def regression(x, y, scale=1.0):
    beta = numpyro.sample("beta", dist.Normal(0.0, 2.0).expand([x.shape[1]]).to_event(1))
    numpyro.sample("y", dist.Normal(x @ beta, scale), obs=y)


@pytest.mark.slow
def test_shared_arguments_and_float32(x32):
    x = jax.random.normal(KEY, (20, 2))
    ys = x @ jnp.array([1.0, -1.0]) + jax.random.normal(jax.random.PRNGKey(1), (4, 20))
    # x is shared (not batched), scale a static Python number
    lm = LaplaceMatching(regression, num_samples=10).run_many(KEY, x, ys, scale=0.5, batch_axes=(False, True))
    cov = jnp.linalg.inv(x.T @ x / 0.25 + jnp.eye(2) / 4.0)
    means = (cov @ (x.T @ ys.T / 0.25)).T
    assert lm.gaussian.mean.dtype == jnp.float32
    np.testing.assert_allclose(lm.posterior["beta"].loc, means, rtol=1e-3, atol=1e-4)  # float32 rounding


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_bad_batches_are_refused_and_failures_name_the_data_set():
    with pytest.raises(ValueError, match="same leading batch axis"):
        batch_of((jnp.ones((3, 2)), jnp.ones((4, 2))), {})
    with pytest.raises(ValueError, match="nested fits"):
        LaplaceMatching(gamma_poisson, hyper=["lam"]).run_many(KEY, counts(2))

    def flat(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.ImproperUniform(dist.constraints.real, (), ()))
        numpyro.sample("y", dist.Normal(a + b * y[0], 1.0), obs=y[1])

    ys = jnp.array([[1.0, 2.0], [0.0, 1.0], [3.0, 1.0]])  # data set 1 (x = 0) leaves b unidentified
    lm = LaplaceMatching(flat)
    with pytest.raises(ValueError, match="data set 1: the negative Hessian"):
        lm.run_many(KEY, ys)
    with pytest.raises(RuntimeError, match="call run"):
        lm.get_samples()  # the failed call left the object as it was
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm.run_many(KEY, ys, on_failure="warn")
    assert any("1 of 3 data sets failed" in str(w.message) for w in caught)
    ok = np.asarray(lm.diagnostics()["positive_definite"])
    np.testing.assert_array_equal(ok, [True, False, True])


def poisson_rate(y):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    with numpyro.plate("n", y.shape[-1]):
        numpyro.sample("y", dist.Poisson(rate), obs=y)


@pytest.mark.slow
def test_a_failed_data_set_is_named_as_run_names_it_and_the_rest_stay_usable():
    y = np.array(counts(3, n=8, seed=3))
    y[2, 3] = np.nan
    with pytest.raises(ValueError, match=r"data set 2: observed site 'y': 1 of 8 values are NaN \(at y\[3\]\)"):
        LaplaceMatching(poisson_rate, num_samples=20).run_many(KEY, y)
    lm = LaplaceMatching(poisson_rate, num_samples=20)
    with pytest.warns(UserWarning, match=r"1 of 3 data sets failed .*data set 2: observed site 'y'"):
        lm.run_many(KEY, y, on_failure="warn")
    post = lm.posterior["rate"]  # numpyro's argument validation would refuse the NaN row
    concentration = np.asarray(post.concentration)
    assert np.isnan(concentration[2]) and np.all(np.isfinite(concentration[:2]))
    # the Gamma-Poisson posterior Gamma(2 + sum y, 1 + n) on the data sets that fitted
    np.testing.assert_allclose(concentration[:2], 2.0 + y[:2].sum(1), rtol=1e-6)


@pytest.mark.parametrize("y, message", [
    (np.zeros((0, 8)), "the batch is empty"),
    (np.ones(8), r"batched shapes \[\(8,\)\], so 8 data sets.*IndexError.*leading axis of one entry per data set"),
])
def test_an_empty_batch_and_a_forgotten_batch_axis_are_explained(y, message):
    with pytest.raises((ValueError, IndexError), match=message):
        LaplaceMatching(poisson_rate).run_many(KEY, y)


@pytest.mark.slow
def test_a_zero_size_site_is_batched():
    """Draws of a zero-size site next to a Gamma-matched one (a host quantile call) in one vmapped program."""
    def model(y):
        rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([0]).to_event(1))
        with numpyro.plate("n", y.shape[-1]):
            numpyro.sample("y", dist.Poisson(rate + z.sum()), obs=y)

    y = counts(2, n=8, seed=4)
    samples = LaplaceMatching(model, num_samples=20).run_many(KEY, y).get_samples()
    assert samples["z"].shape == (2, 20, 0) and samples["rate"].shape == (2, 20)
    assert np.all(np.isfinite(samples["rate"]))
