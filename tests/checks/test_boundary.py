"""Hyperparameters at the boundary of their space: named, with the fix, in the error and the verdict;
and a latent GP with kernel hyperparameters never hangs (issue 24)."""

import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm.checks.boundary import PRIOR_SDS, boundary_hyperparameters, boundary_message, prior_spread
from numpyro_lm.core.model import model_info

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)


def hierarchical(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("groups", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


Y = jnp.array([1.0, -0.5, 2.0, 0.3, 0.8, -1.2])


def test_prior_spread_is_the_prior_in_the_basis():
    # tau ~ LogNormal(0, 1): in its log basis N(0, 1); 512 draws: median and IQR-sd within 0.15
    info = model_info(hierarchical, (Y,))
    median, sd = prior_spread(info, ["tau"], (Y,))
    assert abs(float(median["tau"][0])) < 0.15 and abs(float(sd["tau"][0]) - 1.0) < 0.15


def test_prior_spread_compiles_once_per_model_and_shapes():
    """A second run of a LaplaceMatching object on new data of the same shapes (the same traced
    model) reuses the compiled prior draws: the model is not traced again."""
    traced = []

    def counted(y):
        traced.append(1)
        hierarchical(y)

    info = model_info(counted, (Y,))
    prior_spread(info, ["tau"], (Y,))
    first = len(traced)
    median, _ = prior_spread(info, ["tau"], (Y + 1.0,))
    assert len(traced) == first and np.isfinite(median["tau"]).all()


@pytest.mark.parametrize("log_tau, flagged", [(0.5, False), (-3.0, False), (-6.0, True), (5.5, True)])
def test_boundary_hyperparameters_far_out_in_the_prior(log_tau, flagged):
    info = model_info(hierarchical, (Y,))
    flat = np.zeros(info.size, np.float32)
    flat[info.layout.site("tau").offset] = log_tau
    found = boundary_hyperparameters(info, flat, (Y,))
    assert bool(found) == flagged  # PRIOR_SDS = 4 robust SDs of N(0, 1)
    if flagged:
        (b,) = found
        assert b.site == "tau" and b.label == "tau" and abs(b.value - np.exp(log_tau)) < 1e-3 * np.exp(log_tau)
        assert abs(b.prior_sds) > PRIOR_SDS and np.sign(b.prior_sds) == np.sign(log_tau)
        message = boundary_message(found)
        assert "tau = " in message and 'hyper="auto"' in message and "LaplaceNUTS" in message


def test_boundary_is_named_where_the_model_itself_is_nan():
    """Where a failed search stopped, the model's own sites can be NaN (a kernel's Cholesky at an
    exploded amplitude): naming the boundary must not raise numpyro's validation error instead."""
    def breaks_far_out(y):
        tau = numpyro.sample("tau", dist.LogNormal(0.0, 1.0))
        with numpyro.plate("groups", y.shape[0]):
            theta = numpyro.sample("theta", dist.Normal(0.0, tau))
            numpyro.sample("y", dist.Bernoulli(logits=theta * jnp.sqrt(1.0 - tau)), obs=y)  # NaN for tau > 1

    y = jnp.array([1.0, 0.0, 1.0])
    info = model_info(breaks_far_out, (y,))
    flat = np.zeros(info.size, np.float32)
    flat[info.layout.site("tau").offset] = 6.0  # tau = e^6: six prior SDs out, logits NaN
    (found,) = boundary_hyperparameters(info, flat, (y,))
    assert found.site == "tau" and abs(found.value - np.exp(6.0)) < 1e-3 * np.exp(6.0)


def test_no_hyperparameters_nothing_flagged():
    def regression(x, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        numpyro.sample("y", dist.Normal(x @ w, 1.0), obs=y)

    x, y = jnp.ones((5, 2)), jnp.zeros(5)
    info = model_info(regression, (x, y))
    assert boundary_hyperparameters(info, np.full(info.size, 50.0, np.float32), (x, y)) == []


GP_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{here!r}, {tests!r}]
    import jax
    from numpyro_lm import LaplaceMatching
    from test_boundary import gp_data
    from shared_models import whitened_gp  # issue 24's model

    x, y = gp_data(200)
    start = time.perf_counter()
    nested = LaplaceMatching(whitened_gp, hyper=["amp", "ls"]).run(jax.random.PRNGKey(0), x, y)
    print("nested", time.perf_counter() - start, nested.diagnostics()["trusted"], flush=True)
    start = time.perf_counter()
    try:
        LaplaceMatching(whitened_gp, strategy="laplace").run(jax.random.PRNGKey(0), x, y)
        print("joint returned", time.perf_counter() - start, flush=True)
    except ValueError as error:
        print("joint refused", time.perf_counter() - start, "edge of their prior" in str(error), flush=True)
""")


def gp_data(n, seed=0, amp=1.5, ls=0.8):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-3, 3, n)).astype(np.float32)
    k = amp**2 * np.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * ls**2)) + 1e-3 * np.eye(n)
    f = np.linalg.cholesky(k) @ rng.normal(size=n)
    return x, (rng.uniform(size=n) < 1 / (1 + np.exp(-f))).astype(np.float32)


@pytest.mark.slow
def test_latent_gp_with_kernel_hyperparameters_returns_in_time():
    # issue 24: the nested fit once deadlocked and the joint search took minutes to fail; each
    # now takes about 10 s at n = 200 on 2 cores. A hard limit of 240 s for both makes a hang
    # fail CI instead of stalling it.
    run = subprocess.run([sys.executable, "-c", GP_SCRIPT.format(here=HERE, tests=TESTS)], capture_output=True, text=True,
                         timeout=240)
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines() if line.startswith(("nested", "joint")))
    assert run.returncode == 0, run.stderr[-3000:]
    assert lines["nested"].endswith("True")  # trusted
    # the joint search runs to amp ~ 75 (+4.5 prior SDs): refused, the boundary named
    assert lines["joint"].endswith("True") and "refused" in run.stdout
