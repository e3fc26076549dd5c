"""The auto-pilot (numpyro_lm/approximations/autopilot.py): the cheapest trusted candidate, and its trail."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import stats

from numpyro_lm import LaplaceMatching, NotPositiveDefiniteError, NotTrustedWarning
from numpyro_lm.approximations import autopilot

KEY = jax.random.PRNGKey(0)


def poisson_rate(y):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    numpyro.sample("y", dist.Poisson(rate), obs=y)


@pytest.mark.slow
def test_a_trusted_joint_fit_stops_the_search(x32):
    y = jnp.array([3.0, 5.0, 2.0, 4.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotTrustedWarning)
        lm = LaplaceMatching(poisson_rate).run(KEY, y)
    trail = lm.diagnostics()["trail"]
    assert [a["candidate"] for a in trail] == ["laplace"] and trail[0]["trusted"]
    # conjugate: Gamma(2 + sum y, 1 + n), exactly
    assert float(lm.posterior["rate"].concentration) == pytest.approx(16.0, rel=1e-4)


Y = np.array([2.9, -1.2, 0.4, 3.8, 1.1, -0.3, 2.2, 0.9], np.float32)


def normal_unknown_scale(y):  # no plate
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(10.0))
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def exact_sigma_cdf(grid):
    """The exact posterior CDF of sigma, by quadrature over (mu, sigma)."""
    mu = np.linspace(-6.0, 8.0, 1401)
    logp = (stats.norm(0, 10).logpdf(mu)[:, None] + stats.halfnorm(scale=10).logpdf(grid)[None, :]
            + stats.norm(mu[:, None, None], grid[None, :, None]).logpdf(Y.astype(np.float64)).sum(-1))
    density = np.exp(logp - logp.max()).sum(0)
    return np.cumsum(density) / density.sum()


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_noise_scale_offset_is_fixed_by_nested_laplace(x32):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotTrustedWarning)  # the final answer is trusted: no warning
        lm = LaplaceMatching(normal_unknown_scale, num_samples=4000).run(KEY, jnp.asarray(Y))
    d = lm.diagnostics()
    trail = [(a["candidate"], a["trusted"]) for a in d["trail"]]
    assert trail == [("nested", True)] and d["trusted"]  # sigma enters the likelihood with mu
    assert d["hyper"] == ["sigma"]
    # against the truth: W1 between the draws and the exact marginal of sigma, in SDs
    grid = np.linspace(0.05, 12.0, 4000)
    exact = exact_sigma_cdf(grid)
    mean = np.sum(np.diff(exact) * grid[1:])
    sd = np.sqrt(np.sum(np.diff(exact) * grid[1:] ** 2) - mean**2)
    draws = np.sort(np.asarray(lm.get_samples()["sigma"], np.float64))
    empirical = np.searchsorted(draws, grid, side="right") / draws.size
    w1 = np.sum(np.abs(empirical - exact)[1:] * np.diff(grid)) / sd
    assert w1 < 0.1  # Monte Carlo W1 of 4000 draws ~ 0.02 SD; the joint fit was off by 0.5


def funnel(sigma, y):  # centred eight schools: the joint mode sits in the funnel's neck
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
YS = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_hierarchical_scale_goes_to_nested_laplace_first(x32):
    # tau sets theta's prior: the joint mode is the wrong summary (here it does not even
    # exist: the search runs into the funnel's neck), so the structure sends it to nested
    with pytest.raises(NotPositiveDefiniteError, match="not finite"):
        LaplaceMatching(funnel, strategy="laplace").run(KEY, SIGMA, YS)
    lm = LaplaceMatching(funnel).run(KEY, SIGMA, YS)
    d = lm.diagnostics()
    assert [(a["candidate"], a["trusted"]) for a in d["trail"]] == [("nested", True)]
    assert d["hyper"] == ["tau"]


@pytest.mark.slow
def test_a_candidate_that_fails_is_recorded_and_the_next_is_tried(x32, monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError("no nested fit here")

    monkeypatch.setattr(autopilot, "run_nested", refuse)
    with pytest.warns(NotTrustedWarning):  # the joint fit and PSIS miss sigma's marginal here
        lm = LaplaceMatching(normal_unknown_scale).run(KEY, jnp.asarray(Y))
    trail = lm.diagnostics()["trail"]
    assert trail[0]["candidate"] == "nested" and list(trail[0]["reasons"]) == ["no nested fit here"]
    assert trail[1]["candidate"] == "laplace"


@pytest.mark.slow
def test_strategy_is_checked_and_explicit_options_win():
    with pytest.raises(ValueError, match="strategy"):
        LaplaceMatching(poisson_rate, strategy="fast")
    lm = LaplaceMatching(poisson_rate, strategy="laplace").run(KEY, jnp.array([1.0, 2.0]))
    assert lm.diagnostics()["trail"] is None


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def four_coordinates_two_bumps():
    """Two bumps along ``x[0]`` (N(-1.5, 1) and N(2, 1)), three standard normals beside them."""
    x = numpyro.sample("x", dist.Normal(0.0, 10.0).expand([4]).to_event(1))
    numpyro.factor("mix", jnp.logaddexp(dist.Normal(-1.5, 1.0).log_prob(x[0]), dist.Normal(2.0, 1.0).log_prob(x[0]))
                   + jnp.sum(dist.Normal(0.0, 1.0).log_prob(x[1:])))


def test_fallback_runs_warm_started_nuts_where_nothing_is_trusted(x32):
    # a bimodal target: no Gaussian candidate is trusted; NUTS from the fit finds both modes
    # (four coordinates: a lattice over every site, the last rung for three or fewer, would answer it)
    two_bumps = four_coordinates_two_bumps

    with pytest.raises(ValueError, match="fallback"):
        LaplaceMatching(two_bumps, fallback="mcmc")
    lm = LaplaceMatching(two_bumps, fallback="nuts", num_samples=2000, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotTrustedWarning)
        lm.run(KEY)
    d = lm.diagnostics()
    assert d["trail"][-1]["candidate"] == "nuts" and "nuts" in d
    x = np.asarray(lm.get_samples()["x"])
    assert x.shape == (2000, 4)
    x = x[:, 0]
    # the mixture (N(0, 10) prior aside): mean 0.25, sd sqrt(1 + 1.75^2) = 2.02; NUTS's MC
    # error with an ESS above 100 is below 0.2
    assert abs(x.mean() - 0.25) < 0.4 and x.std() == pytest.approx(2.02, abs=0.25)
    with pytest.raises(ValueError, match="NUTS"):
        lm.get_samples(resample="psis")
    # ArviZ reads NUTS's one chain of 2000 draws, not LM's pseudo-chains
    assert (lm.num_chains, lm.thinning) == (1, 1)
    assert lm.get_samples(group_by_chain=True)["x"].shape == (1, 2000, 4)


SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
SCHOOLS = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])


def _eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + tau * z, sigma), obs=y)


@pytest.mark.slow
def test_laplace_nuts_fallback_integrates_the_field_out_where_the_joint_fit_is_not_trusted(x32, capsys):
    # the joint fit alone is not trusted on tau (k-hat above 1); NUTS over (mu, tau) on the
    # Laplace marginal of the eight effects is exact here, and trusted by NUTS's own checks
    lm = LaplaceMatching(_eight_schools, strategy="laplace", fallback="laplace_nuts", num_samples=2000,
                         progress_bar=False)
    lm.run(KEY, SIGMA, y=SCHOOLS)
    d = lm.diagnostics()
    assert [a["candidate"] for a in d["trail"]] == ["laplace_nuts"] and d["trusted"], d["reasons"]
    assert d["verdict"].startswith("trusted: the draws are Laplace-marginal NUTS's (NUTS over ['mu', 'tau'], "
                                   "Laplace over ['z']; warm-started")
    assert d["nuts"]["sampled"] == ["mu", "tau"] and d["nuts"]["marginalized"] == ["z"]
    lm.print_summary()
    assert "Laplace over ['z']" in capsys.readouterr().out
    tau = np.asarray(lm.get_samples()["tau"])
    # long NUTS (benchmarks/references/eight_schools_noncentered.npz): tau mean 3.6, sd 3.2;
    # 2000 draws with ESS > 400: MC error of the mean < 0.16
    assert tau.shape == (2000,) and abs(tau.mean() - 3.6) < 0.6


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_laplace_nuts_fallback_without_a_field_goes_on_to_nuts_and_says_so(x32):
    lm = LaplaceMatching(four_coordinates_two_bumps, fallback="laplace_nuts", num_samples=1000, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotTrustedWarning)
        lm.run(KEY)
    trail = lm.diagnostics()["trail"]
    assert [a["candidate"] for a in trail[-2:]] == ["laplace_nuts", "nuts"]
    assert not trail[-2]["trusted"] and "no latent site to integrate out" in trail[-2]["reasons"][0]
