"""numpyro_lm.marginal.laplace_marginal: the Laplace marginal of the hyperparameters and its implicit
gradient, against finite differences and between the dense and arrowhead curvatures."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from shared_models import Y, gaussian_hierarchy

from numpyro_lm.marginal.laplace_marginal import _newton_predicted, conditional_mode, inner_hessian, laplace_marginal, theta_layout
from numpyro_lm.mode.newton import newton, newton_init
from numpyro_lm.core.model import model_info


def poisson_hierarchy(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("group", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Poisson(jnp.exp(theta)), obs=y)


@pytest.mark.parametrize("model, y", [
    pytest.param(gaussian_hierarchy, Y, id="gaussian", marks=pytest.mark.slow),
    pytest.param(poisson_hierarchy, jnp.array([0.0, 3.0, 1.0, 7.0]), id="poisson", marks=pytest.mark.slow),
])
def test_the_implicit_gradient_matches_finite_differences(x64, model, y):
    # the Poisson conditional's Hessian moves with theta*: a stale one in the backward pass shows
    info = model_info(model, (y,))
    n = y.shape[0]

    def log_density(theta, phi):
        return info.log_density(jnp.concatenate([phi, theta]), (y,))

    def marginal(phi):
        return laplace_marginal(log_density, phi, jnp.zeros(n), 1e-10, 50)[0]

    phi = jnp.array([0.7])
    h = 1e-5
    numeric = (marginal(phi + h) - marginal(phi - h)) / (2 * h)
    np.testing.assert_allclose(jax.grad(marginal)(phi), numeric, rtol=1e-6)
    mode = lambda p: conditional_mode(log_density, p, jnp.zeros(n), 1e-10, 50)[0]
    numeric_mode = (mode(phi + h) - mode(phi - h)) / (2 * h)
    np.testing.assert_allclose(jax.jacrev(mode)(phi)[:, 0], numeric_mode, rtol=1e-6)
    if model is gaussian_hierarchy:  # theta* = (mu + y) / 2: d theta*/d mu = 1/2 exactly
        np.testing.assert_allclose(jax.jacrev(mode)(phi)[:, 0], 0.5, rtol=1e-8)


def logistic_groups(theta, phi):
    """20 logistic groups of 10 observations, intercept phi[0] and scale exp(phi[1])."""
    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.uniform(size=(20, 10)) < 0.4, jnp.float32)
    eta = phi[0] + jnp.exp(phi[1]) * theta[:, None]
    return jnp.sum(y * eta - jnp.logaddexp(0.0, eta)) - 0.5 * jnp.sum(theta**2)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_an_unverified_last_newton_step_saves_an_evaluation_and_lands_within_tol():
    """From the mode at nearby hyperparameters (a leapfrog step away) Newton needs three
    evaluations to certify the mode; predicted from the last two decrements, the third step
    lands within tol without its evaluation. laplace_marginal verifies it where it evaluates
    the model anyway: its value is the certified mode's, its gradient finite."""
    from numpyro_lm.mode.hessian import DenseHessian

    tol, phi0 = 1e-3, jnp.array([-0.4, 0.0])
    fn0 = lambda t: -logistic_groups(t, phi0)  # noqa: E731
    start = newton(fn0, newton_init(jnp.zeros(20)), tol, 50).x
    phi = phi0 + jnp.array([0.1, 0.1])
    fn = lambda t: -logistic_groups(t, phi)  # noqa: E731
    full = newton(fn, newton_init(start), tol, 50)
    early, stopped = _newton_predicted(fn, start, tol, 50, DenseHessian())
    assert bool(stopped) and int(early.num_iter) == int(full.num_iter) - 1 == 2
    theta = early.x + early.step
    grad = jax.grad(fn)(theta)
    decrement = float(jnp.sqrt(grad @ jnp.linalg.solve(jax.hessian(fn)(theta), grad)))
    assert decrement <= tol  # the prediction held: the unverified step is within tol posterior SDs
    verified = lambda p: laplace_marginal(logistic_groups, p, start, tol, 50)  # noqa: E731
    value, mode, _, ok = verified(phi)
    assert bool(ok) and np.abs(np.asarray(mode - full.x)).max() < 1e-4
    exact = -fn(full.x) + 10 * np.log(2 * np.pi) - 0.5 * jnp.linalg.slogdet(jax.hessian(fn)(full.x))[1]
    # float32 values of ~130 nats: the two differ by rounding and the decrement^2 / 2 < 5e-7
    assert abs(float(value) - float(exact)) < 1e-4
    assert bool(jnp.all(jnp.isfinite(jax.grad(lambda p: verified(p)[0])(phi))))



@pytest.mark.slow  # 11 s on one core: runs where CI=true (Makefile)
def test_the_arrowhead_inner_curvature_gives_the_dense_marginal_and_gradient():
    from numpyro_lm.mode.hessian import ArrowheadHessian, DenseHessian, plate_structure
    from numpyro_lm.samplers.tilted_nuts import joint_vector, split_coordinates

    info = model_info(gaussian_hierarchy, (Y,))
    layout = theta_layout(info.layout, {"theta"})
    assert layout.size == 6 and layout.sites[0].offset == 0
    assert isinstance(inner_hessian(layout), DenseHessian)  # 6 coordinates: below INNER_ARROWHEAD_MIN_DIM
    arrowhead = ArrowheadHessian(plate_structure(layout))
    assert isinstance(inner_hessian(layout, "arrowhead"), ArrowheadHessian)
    theta_index, phi_index = split_coordinates(info.layout, {"theta"})

    def log_density(theta, phi):
        return info.log_density(joint_vector(theta, phi, theta_index, phi_index, info.size), (Y,))

    values = {}
    for name, hessian in (("dense", DenseHessian()), ("arrowhead", arrowhead)):
        marginal = lambda p, h=hessian: laplace_marginal(log_density, p, jnp.zeros(6), 1e-4, 50, h)[0]
        values[name] = (marginal(jnp.array([0.7])), jax.grad(marginal)(jnp.array([0.7])))
    # the same numbers computed by two factorisations in float32
    np.testing.assert_allclose(values["arrowhead"][0], values["dense"][0], rtol=1e-5)
    np.testing.assert_allclose(values["arrowhead"][1], values["dense"][1], rtol=1e-4)
