"""The traced model: flat LM-basis log density, constrain and init, as pure hashable functions."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.initialization import init_to_value

from numpyro_lm import laplace, model_info
from numpyro_lm.core.model import TracedModels

pytestmark = pytest.mark.usefixtures("x64")


def rate_and_shares(counts, events):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    shares = numpyro.sample("shares", dist.Dirichlet(jnp.ones(3)))
    numpyro.deterministic("double", 2.0 * rate)
    numpyro.sample("c", dist.Multinomial(counts.sum(), shares), obs=counts)
    with numpyro.plate("n", events.shape[0]):
        numpyro.sample("e", dist.Poisson(rate), obs=events)


COUNTS, EVENTS = np.array([3.0, 0.0, 5.0]), np.array([1.0, 4.0, 2.0])


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_layout_log_density_constrain_and_init():
    info = model_info(rate_and_shares, (COUNTS, EVENTS))
    assert [s.name for s in info.layout.sites] == ["rate", "shares"] and info.size == 3
    assert hash(info) == hash(model_info(rate_and_shares, (COUNTS, EVENTS)))  # keys compiled programs
    # init and constrain are inverse maps through the LM bases (log, zero-sum softmax)
    values = {"rate": 1.7, "shares": np.array([0.2, 0.5, 0.3])}
    y = info.init(jax.random.PRNGKey(0), (COUNTS, EVENTS), None, init_to_value(values=values))
    out = info.constrain(y, (COUNTS, EVENTS))
    np.testing.assert_allclose(out["rate"], 1.7, rtol=1e-12)
    np.testing.assert_allclose(out["shares"], values["shares"], rtol=1e-12)
    np.testing.assert_allclose(out["double"], 3.4, rtol=1e-12)
    # the log density is the joint in the basis: log p(x) + log|dx/dy| (log: + log rate;
    # zero-sum softmax: + sum log shares + log(3)/2)
    x = values["shares"]
    expected = (dist.Gamma(2.0, 1.0).log_prob(1.7) + np.log(1.7)
                + dist.Dirichlet(jnp.ones(3)).log_prob(x) + np.sum(np.log(x)) + 0.5 * np.log(3.0)
                + dist.Multinomial(COUNTS.sum(), x).log_prob(COUNTS) + np.sum(dist.Poisson(1.7).log_prob(EVENTS)))
    np.testing.assert_allclose(info.log_density(y, (COUNTS, EVENTS)), expected, rtol=1e-10)


def test_shapes_alone_trace_a_model():
    spec = (jax.ShapeDtypeStruct((3,), jnp.float64), jax.ShapeDtypeStruct((5,), jnp.float64))
    assert model_info(rate_and_shares, spec).size == 3


def gamma_poisson(y):
    lam = numpyro.sample("lam", dist.Gamma(2.0, 3.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Poisson(lam), obs=y)


@pytest.mark.slow
def test_the_pure_core_vmaps_over_data_sets():
    ys = jax.random.poisson(jax.random.PRNGKey(0), 3.0, (50, 4)).astype(jnp.float64)
    info = model_info(gamma_poisson, (ys[0],))

    def fit(y):
        return laplace(lambda z: info.log_density(z, (y,)), jnp.zeros(info.size))

    states = jax.jit(jax.vmap(fit))(ys)
    assert bool(jnp.all(states.info.converged)) and states.mode.shape == (50, 1)
    # in the log basis the Gamma(2 + sum y, 3 + n) posterior's Laplace mean is log(a / rate)
    a, rate = 2.0 + ys.sum(1), 3.0 + ys.shape[1]
    np.testing.assert_allclose(states.mode[:, 0], np.log(a / rate), rtol=1e-9)
    np.testing.assert_allclose(jax.vmap(lambda c: c.variance())(states.curvature)[:, 0], 1 / a, rtol=1e-9)


def masked_gamma(y, mask):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Exponential(rate), obs=y, obs_mask=mask)


def test_obs_mask_entries_the_mask_drops_get_a_standard_normal_density():
    y, mask = np.array([0.5, 1.0, 2.0, 0.3]), np.array([True, False, True, True])
    info = model_info(masked_gamma, (y, mask), {})
    assert info.layout.missing_data == ("y_unobserved",)
    site = info.layout.site("y_unobserved")
    assert site.basis == "log"
    rate, missing = 1.5, np.array([0.4, 0.7, 1.1, 2.5])  # constrained values; y_unobserved[1] is missing
    flat = np.zeros(info.size)
    flat[info.layout.site("rate").offset] = np.log(rate)
    flat[site.offset : site.offset + site.size] = np.log(missing)
    # closed form: Gamma(2, 1) prior on rate, Exponential likelihood of the three observed values and of
    # the missing one, log-Jacobians of the log bases (rate and the missing entry), and N(0, 1) on the log
    # basis coordinates of the three entries the mask drops
    expected = (dist.Gamma(2.0, 1.0).log_prob(rate) + np.log(rate)
                + np.sum(dist.Exponential(rate).log_prob(y[mask]))
                + dist.Exponential(rate).log_prob(missing[1]) + np.log(missing[1])
                + np.sum(dist.Normal(0, 1).log_prob(np.log(missing[mask]))))
    np.testing.assert_allclose(info.log_density(flat, (y, mask), {}), expected, rtol=1e-12)


@pytest.mark.parametrize("prior", [dist.HalfNormal(1.0), pytest.param(dist.Beta(2.0, 3.0), marks=pytest.mark.slow), dist.Normal(0.0, 2.0)])
def test_a_site_inside_scan_has_the_log_density_of_the_same_site_outside(prior):
    """A latent site sampled at each step of numpyro's ``scan`` (log, logit and identity bases):
    its basis log-Jacobian counts once per step, so the density equals that of the vectorised
    model (it counted the whole series' Jacobian at every step: n times too much), and its value
    costs no (n, n) array of factors."""
    from numpyro.contrib.control_flow import scan

    def stepped(y):
        def step(carry, yt):
            s = numpyro.sample("s", prior)
            numpyro.sample("y", dist.Normal(0.0, 1.0 + s), obs=yt)
            return carry, None

        scan(step, 0.0, y)

    def vectorised(y):
        s = numpyro.sample("s", prior.expand([y.shape[0]]))
        numpyro.sample("y", dist.Normal(0.0, 1.0 + s), obs=y)

    y = jnp.array([0.5, -1.0, 2.0, 0.3])
    z = jnp.array([0.1, -0.3, 0.4, 1.2])
    a, b = (model_info(m, (y,)) for m in (stepped, vectorised))
    assert a.layout.sites[0].basis == b.layout.sites[0].basis
    np.testing.assert_allclose(a.log_density(z, (y,)), b.log_density(z, (y,)), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(a.log_density)(z, (y,)), jax.grad(b.log_density)(z, (y,)), rtol=1e-12)


def test_a_model_is_traced_once_for_every_object_that_fits_it():
    # a new LaplaceMatching(model) runs warm, as jax.jit does for a function it has seen: the
    # trace is shared while the model lives; other overrides or shapes trace again
    calls = []

    def model(y):
        calls.append(1)
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = jnp.zeros(3)
    first = TracedModels(model).inputs((y,), {})[2]
    traced = len(calls)
    assert traced > 0
    assert TracedModels(model).inputs((y,), {})[2] == first
    assert len(calls) == traced
    TracedModels(model, bases={"mu": "identity"}).inputs((y,), {})
    assert len(calls) > traced
    traced = len(calls)
    TracedModels(model).inputs((jnp.zeros(4),), {})
    assert len(calls) > traced


def test_the_shared_traces_are_bounded():
    # a trace holds its model and what the model closes over: the oldest are let go, and a model
    # fitted again after TRACED_MODELS_KEPT others is traced again
    from numpyro_lm.core.model import TRACED_MODELS_KEPT

    calls = []

    def make(counted=False):
        def model():
            if counted:
                calls.append(1)
            numpyro.sample("mu", dist.Normal(0.0, 1.0))
        return model

    first = make(counted=True)
    TracedModels(first).inputs((), {})
    traced = len(calls)
    TracedModels(first).inputs((), {})
    assert len(calls) == traced
    for _ in range(TRACED_MODELS_KEPT):
        TracedModels(make()).inputs((), {})
    TracedModels(first).inputs((), {})
    assert len(calls) > traced
