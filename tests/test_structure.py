"""The model's dependency structure (numpyro_lm/structure.py): which hyperparameters set other sites' priors."""

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm.model import model_info
from numpyro_lm.structure import hierarchical_hypers, prior_parents

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


def test_prior_parents_are_the_latent_sites_each_prior_depends_on():
    parents = dict(prior_parents(centred, (SIGMA, Y), {}, ["mu", "tau", "theta"]))
    assert parents == {"mu": (), "tau": (), "theta": ("mu", "tau")}  # the observed site is left out
    parents = dict(prior_parents(noncentred, (SIGMA, Y)))
    assert parents["eta"] == () and parents["obs"] == ("eta", "mu", "tau")


@pytest.mark.parametrize("model, args, hyper, expected", [
    (centred, (SIGMA, Y), ["tau"], ["tau"]),
    (noncentred, (SIGMA, Y), ["tau"], []),  # tau enters the likelihood only
    (latent_gp, (jnp.linspace(0, 1, 5), jnp.array([0.0, 1, 1, 0, 1])), ["ls", "amp"], ["amp", "ls"]),
])
def test_hierarchical_hypers(model, args, hyper, expected):
    info = model_info(model, args)  # ModelInfo carries the parents of its latent sites
    assert hierarchical_hypers(info.parents, hyper) == expected


def test_unknown_structure_is_none_not_an_error():
    def concrete(x):  # needs its argument's value: cannot be traced abstractly
        n = int(x.sum())
        numpyro.sample("a", dist.Normal(0.0, 1.0).expand([n]).to_event(1))

    assert prior_parents(concrete, (jnp.array([1.0, 2.0]),)) is None
    assert hierarchical_hypers(None, ["a"]) == []
