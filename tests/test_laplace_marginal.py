"""numpyro_lm.laplace_marginal: the Laplace marginal of the hyperparameters and its implicit
gradient, against finite differences and between the dense and arrowhead curvatures."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from test_laplace_nuts import Y, gaussian_hierarchy

from numpyro_lm.laplace_marginal import conditional_mode, inner_hessian, laplace_marginal, theta_layout
from numpyro_lm.model import model_info


def poisson_hierarchy(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("group", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Poisson(jnp.exp(theta)), obs=y)


@pytest.mark.parametrize("model, y", [
    pytest.param(gaussian_hierarchy, Y, id="gaussian"),
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



@pytest.mark.slow  # 11 s on one core: runs where CI=true (Makefile)
def test_the_arrowhead_inner_curvature_gives_the_dense_marginal_and_gradient():
    from numpyro_lm.hessian import ArrowheadHessian, DenseHessian, plate_structure
    from numpyro_lm.laplace_nuts import _joint, _split

    info = model_info(gaussian_hierarchy, (Y,))
    layout = theta_layout(info.layout, {"theta"})
    assert layout.size == 6 and layout.sites[0].offset == 0
    assert isinstance(inner_hessian(layout), DenseHessian)  # 6 coordinates: below INNER_ARROWHEAD_MIN_DIM
    arrowhead = ArrowheadHessian(plate_structure(layout))
    assert isinstance(inner_hessian(layout, "arrowhead"), ArrowheadHessian)
    theta_index, phi_index = _split(info.layout, {"theta"})

    def log_density(theta, phi):
        return info.log_density(_joint(theta, phi, theta_index, phi_index, info.size), (Y,))

    values = {}
    for name, hessian in (("dense", DenseHessian()), ("arrowhead", arrowhead)):
        marginal = lambda p, h=hessian: laplace_marginal(log_density, p, jnp.zeros(6), 1e-4, 50, h)[0]
        values[name] = (marginal(jnp.array([0.7])), jax.grad(marginal)(jnp.array([0.7])))
    # the same numbers computed by two factorisations in float32
    np.testing.assert_allclose(values["arrowhead"][0], values["dense"][0], rtol=1e-5)
    np.testing.assert_allclose(values["arrowhead"][1], values["dense"][1], rtol=1e-4)
