"""numpyro_lm.posterior.matched: matched posteriors print their parameters and stay the distributions
they were (isinstance, methods, pytrees)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching
from numpyro_lm.posterior.matched import describe, readable


@pytest.mark.parametrize("make, text", [
    (lambda: dist.Gamma(14.0, 4.0), "Gamma(concentration=14, rate=4)"),
    (lambda: dist.Dirichlet(jnp.array([1.5, 2.0, 3.0])), "Dirichlet(concentration=[1.5, 2. , 3. ])"),
    (lambda: dist.Normal(jnp.zeros(2), 1.0).to_event(1), "Independent(Normal(loc=[0., 0.], scale=[1.]), "
                                                         "reinterpreted_batch_ndims=1)"),
    (lambda: dist.MultivariateNormal(jnp.zeros(20), jnp.eye(20)), "MultivariateNormal(loc=<array (20,)>, "
                                                                  "covariance_matrix=<array (20, 20)>)"),
])  # built in the test: at collection each worker would compile their constructors' operations
def test_readable_prints_the_parameters_and_keeps_the_class(make, text):
    d = make()
    cls = type(d)
    d = readable(d)
    assert repr(d) == text == describe(d)
    assert isinstance(d, cls) and type(d).__name__ == cls.__name__
    # still a pytree: jit takes it and gives the same mean
    np.testing.assert_allclose(jax.jit(lambda x: x.mean)(d), d.mean)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_fits_matched_posteriors_print_their_parameters():
    def model(y):
        rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
        scale = numpyro.sample("scale", dist.Uniform(1.0, 3.0))
        numpyro.sample("y", dist.Poisson(rate), obs=y)
        numpyro.sample("z", dist.Normal(scale, 0.3), obs=jnp.array([1.8, 2.2, 2.0]))

    lm = LaplaceMatching(model, progress_bar=False).run(jax.random.PRNGKey(0), jnp.arange(20.0) % 7)
    rate = lm.posterior["rate"]
    assert isinstance(rate, dist.Gamma)
    c, r = float(rate.concentration), float(rate.rate)
    assert repr(rate) == f"Gamma(concentration={c:.5g}, rate={r:.5g})"
    # a bounded site: its family scaled and shifted onto (1, 3)
    assert repr(lm.posterior["scale"]).startswith("Beta(concentration1=") and repr(lm.posterior["scale"]).endswith(
        " * 2 + 1")
    assert str(lm.posterior).splitlines()[1] == f"  rate: {rate!r}"


def _with_empty_sites(y):
    # effects for zero groups (a data-frame filter that leaves none), real and positive
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.sample("z", dist.Normal(0.0, 1.0).expand([0]).to_event(1))
    numpyro.sample("s", dist.HalfNormal(1.0).expand([0]).to_event(1))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.slow
def test_zero_size_sites_have_a_posterior_and_a_summary(capsys):
    y = jnp.array([0.5, 1.0])
    lm = LaplaceMatching(_with_empty_sites, num_samples=20).run(jax.random.PRNGKey(0), y)
    for name in ("z", "s"):
        # numpyro's argument checks refused a 0 x 0 covariance (an IndexError), and its summary
        # could not reshape an empty site (a ValueError)
        d = lm.posterior[name]
        assert d.sample(jax.random.PRNGKey(1)).shape == (0,)
    # mu's posterior is N(y.sum() / 3, 1/3) exactly (conjugate): the empty sites change nothing
    assert float(lm.posterior["mu"].loc) == pytest.approx(0.5, abs=1e-5)
    lm.print_summary()
    out = capsys.readouterr().out
    assert "mu" in out and "No entries (zero-size sites, left out above): s, z." in out


def _scale_model(y):
    s = numpyro.sample("s", dist.LogNormal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(0.0, s), obs=y)


@pytest.mark.slow
def test_a_gaussian_in_the_log_basis_is_a_lognormal_with_its_moments():
    # numpyro's TransformedDistribution(Normal, exp) has no mean (NotImplementedError): the same
    # distribution as a LogNormal has them in closed form
    lm = LaplaceMatching(_scale_model, families={"s": "gaussian"}).run(jax.random.PRNGKey(0), jnp.array([0.5, -1.2, 2.0]))
    d = lm.posterior["s"]
    assert isinstance(d, dist.LogNormal)
    loc, scale = float(d.loc), float(d.scale)
    assert float(d.mean) == pytest.approx(np.exp(loc + scale**2 / 2), rel=1e-5)
    draws = np.asarray(d.sample(jax.random.PRNGKey(1), (200_000,)))
    # Monte Carlo: the mean's standard error is sd / sqrt(2e5) < 0.3 % of it here (scale < 1)
    assert draws.mean() == pytest.approx(float(d.mean), rel=0.01)
    assert np.log(draws).mean() == pytest.approx(loc, abs=0.01)


def _constrained_vectors(y=None):
    cut = numpyro.sample("cut", dist.TransformedDistribution(dist.Normal(0.0, 1.0).expand([3]),
                                                             dist.transforms.OrderedTransform()))
    effect = numpyro.sample("effect", dist.ZeroSumNormal(1.0, event_shape=(3,)))
    numpyro.sample("y", dist.Normal(cut + effect, 1.0).to_event(1), obs=y)


@pytest.mark.parametrize("site", [pytest.param("cut", marks=pytest.mark.slow), "effect"])
def test_moments_without_a_closed_form_are_refused_by_name(site):
    """An ordered or zero-sum site's matched Gaussian, mapped through its basis transform, has
    exact draws and density but no closed-form mean: asking names the site and the way to it
    (numpyro's TransformedDistribution raised a bare NotImplementedError)."""
    lm = LaplaceMatching(_constrained_vectors, strategy="laplace", progress_bar=False)
    lm.run(jax.random.PRNGKey(0), y=jnp.array([-0.5, 0.3, 1.1]))
    d = lm.posterior[site]
    for moment in ("mean", "variance"):
        with pytest.raises(NotImplementedError, match=rf"site '{site}'.*no closed form.*get_samples\(\)\['{site}'\]"):
            getattr(d, moment)
    draws = d.sample(jax.random.PRNGKey(1), (4,))
    assert draws.shape == (4, 3) and bool(jnp.all(jnp.isfinite(d.log_prob(draws))))
    assert "TransformedDistribution(" in describe(d)


@pytest.mark.parametrize("longest", [pytest.param(100, marks=pytest.mark.slow), 10])  # slow: CI=true
def test_a_long_real_event_is_matched_per_coordinate(monkeypatch, longest):
    """A random walk's path (one event of 40 steps) under Gaussian noise: its posterior is
    Gaussian with precision P = (walk's) + I / 0.5^2, in closed form. Up to JOINT_EVENT_MAX
    coordinates the matched family is that joint Gaussian; beyond, Normal(mean, sqrt(diag P^-1))
    per coordinate, as an event of the same shape (core.trace.JOINT_EVENT_MAX)."""
    import numpyro_lm.core.trace as trace

    monkeypatch.setattr(trace, "JOINT_EVENT_MAX", longest)

    def walk(y=None):  # a new model per case: the library's programs are cached per model
        f = numpyro.sample("f", dist.GaussianRandomWalk(0.3, num_steps=y.shape[0]))
        numpyro.sample("y", dist.Normal(f, 0.5), obs=y)

    y = np.sin(np.linspace(0, 3, 40)).astype(np.float32)
    # the walk's precision: increments f_0, f_1 - f_0, ... independent N(0, 0.3^2)
    diff = np.eye(40) - np.eye(40, k=-1)
    precision = diff.T @ diff / 0.3**2 + np.eye(40) / 0.5**2
    cov = np.linalg.inv(precision)
    mean = cov @ (y / 0.5**2)
    lm = LaplaceMatching(walk, strategy="laplace", progress_bar=False).run(jax.random.PRNGKey(0), y=y)
    d = lm.posterior["f"]
    assert d.event_shape == (40,) and d.batch_shape == ()
    # float32: the mode and curvature to a few ulps of values of order 1 and 30
    np.testing.assert_allclose(d.mean, mean, atol=1e-4)
    np.testing.assert_allclose(d.variance, np.diag(cov), rtol=1e-4)
    if longest == 100:
        assert isinstance(d, dist.MultivariateNormal)
        np.testing.assert_allclose(d.covariance_matrix, cov, atol=1e-5)
    else:
        assert isinstance(d, dist.Independent) and isinstance(d.base_dist, dist.Normal)
