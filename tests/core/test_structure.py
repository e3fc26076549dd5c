"""The model's dependency structure (numpyro_lm/core/structure.py): which hyperparameters set other sites' priors."""

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm.core.model import model_info
from numpyro_lm.core.structure import hyper_sites
from numpyro_lm.core.structure import hyperparameters, prior_parents

SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0])
Y = jnp.array([28.0, 8.0, -3.0, 7.0])


def centred(sigma, y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def noncentred(sigma, y):  # written without a plate, as posteriordb's eight schools
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    eta = numpyro.sample("eta", dist.Normal(0.0, 1.0).expand([sigma.shape[0]]).to_event(1))
    theta = numpyro.deterministic("theta", mu + tau * eta)
    numpyro.sample("obs", dist.Normal(theta, sigma).to_event(1), obs=y)


def latent_gp(x, y):  # the kernel's parameters set the latent function's prior
    ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
    amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
    k = amp**2 * jnp.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / ls**2) + 1e-4 * jnp.eye(x.shape[0])
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(x.shape[0]), k))
    numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def rate_and_share(n, k):  # each global site is the only parameter of its likelihood
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    share = numpyro.sample("share", dist.Beta(1.0, 1.0))
    numpyro.sample("n", dist.Poisson(rate), obs=n)
    numpyro.sample("k", dist.Binomial(10, share), obs=k)


def test_prior_parents_are_the_latent_sites_each_distribution_depends_on():
    parents = dict(prior_parents(centred, (SIGMA, Y), {}))
    assert parents == {"mu": (), "tau": (), "theta": ("mu", "tau"), "obs": ("theta",)}
    parents = dict(prior_parents(noncentred, (SIGMA, Y)))
    assert parents["eta"] == () and parents["obs"] == ("eta", "mu", "tau")  # through the deterministic


@pytest.mark.parametrize("model, args, expected", [
    (centred, (SIGMA, Y), ["tau"]),  # sets theta's prior
    (noncentred, (SIGMA, Y), ["tau"]),  # enters the likelihood with eta
    (latent_gp, (jnp.linspace(0, 1, 5), jnp.array([0.0, 1, 1, 0, 1])), ["ls", "amp"]),
    (rate_and_share, (jnp.array(3.0), jnp.array(4.0)), []),  # conjugate parameters, no hyperparameter
])
def test_hyperparameters(model, args, expected):
    info = model_info(model, args)  # ModelInfo carries the parents of its sites
    names = [s.name for s in info.layout.sites]
    candidates = [s.name for s in info.layout.sites if s.basis != "identity" and s.size <= 2]
    assert hyperparameters(info.parents, names, candidates) == expected
    if expected:
        assert hyper_sites(info.layout, "auto", info.parents) == expected
    else:
        with pytest.raises(ValueError, match="candidates"):
            hyper_sites(info.layout, "auto", info.parents)


def test_unknown_structure_is_none_not_an_error():
    def concrete(x):  # needs its argument's value: cannot be traced abstractly
        n = int(x.sum())
        numpyro.sample("a", dist.Normal(0.0, 1.0).expand([n]).to_event(1))

    assert prior_parents(concrete, (jnp.array([1.0, 2.0]),)) is None
    assert hyperparameters(None, ["a", "b"], ["a"]) == ["a"]  # unknown: the candidates as they are
