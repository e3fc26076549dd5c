"""Matched families: exact round trips and agreement with an autodiff Laplace approximation."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numpyro_lm.families.bases import get_basis
from numpyro_lm.families import family_names, get_family

pytestmark = pytest.mark.usefixtures("x64")

# (family, params (NumPy float64: converted inside the x64 tests), density on the core domain)
def _gamma(p):
    return dist.Gamma(p["concentration"], p["rate"])


def _inverse_gamma(p):
    return dist.InverseGamma(p["concentration"], p["rate"])


CASES = [
    (("gamma", "log"), {"concentration": np.array([0.3, 2.0, 50.0]), "rate": np.array([4.0, 1.0, 0.01])}, _gamma),
    (("gamma", "sqrt"), {"concentration": np.array([0.8, 2.0, 50.0]), "rate": np.array([4.0, 1.0, 0.01])}, _gamma),
    (("exponential", "log"), {"rate": np.array([0.1, 1.0, 30.0])}, lambda p: dist.Exponential(p["rate"])),
    (("exponential", "sqrt"), {"rate": np.array([0.1, 1.0, 30.0])}, lambda p: dist.Exponential(p["rate"])),
    (("chi2", "log"), {"df": np.array([0.5, 3.0, 40.0])}, lambda p: dist.Chi2(p["df"])),
    (("chi2", "sqrt"), {"df": np.array([1.5, 3.0, 40.0])}, lambda p: dist.Chi2(p["df"])),
    (("inverse_gamma", "log"), {"concentration": np.array([0.3, 2.0, 50.0]), "rate": np.array([4.0, 1.0, 0.01])},
     _inverse_gamma),
    (("inverse_gamma", "sqrt"), {"concentration": np.array([0.3, 2.0, 50.0]), "rate": np.array([4.0, 1.0, 0.01])},
     _inverse_gamma),
    (("beta", "logit"), {"concentration1": np.array([0.2, 3.0, 40.0]), "concentration0": np.array([0.5, 3.0, 2.0])},
     lambda p: dist.Beta(p["concentration1"], p["concentration0"])),
    (("dirichlet", "softmax"), {"concentration": np.array([[0.5, 1.0, 2.0, 0.7], [3.5, 1.0, 9.0, 1.7]])},
     lambda p: dist.Dirichlet(p["concentration"])),
]
IDS = [f"{name}-{basis}" for (name, basis), _, _ in CASES]


def _jnp(params):
    return {k: jnp.asarray(v) for k, v in params.items()}


@pytest.mark.parametrize("key,params,_", CASES, ids=IDS)
def test_round_trip(key, params, _):
    family, params = get_family(*key), _jnp(params)
    back = family.from_gaussian(*family.to_gaussian(params))
    for key in params:
        np.testing.assert_allclose(back[key], params[key], rtol=1e-10)


@pytest.mark.parametrize("key,params,density", CASES, ids=IDS)
def test_to_gaussian_is_the_laplace_approximation_in_the_basis(key, params, density):
    """At the family's ``mean``: gradient zero and inverse negative Hessian = ``cov``."""
    family, params = get_family(*key), _jnp(params)
    mean, cov = family.to_gaussian(params)
    t = get_basis(family.basis).transform(density(params).support)

    def log_density_in_basis(y, p):
        x = t(y)
        log_det = t.log_abs_det_jacobian(y, x)
        return density(p).log_prob(x) + log_det

    if family.event_dim == 0:
        flat = {k: v.reshape(-1) for k, v in params.items()}
        for i in range(mean.size):
            p_i = {k: v[i] for k, v in flat.items()}
            f = lambda y: log_density_in_basis(y, p_i)
            y = mean.reshape(-1)[i]
            assert abs(float(jax.grad(f)(y))) < 1e-8
            np.testing.assert_allclose(-1.0 / jax.grad(jax.grad(f))(y), cov.reshape(-1)[i], rtol=1e-8)
    else:
        for b in range(mean.shape[0]):
            p_b = {k: v[b] for k, v in params.items()}
            f = lambda y: log_density_in_basis(y, p_b)
            np.testing.assert_allclose(jax.grad(f)(mean[b]), 0.0, atol=1e-8)
            np.testing.assert_allclose(jnp.linalg.inv(-jax.hessian(f)(mean[b])), cov[b], rtol=1e-8, atol=1e-12)


def test_dirichlet_zero_sum_covariance_is_seeds_formula():
    """Sigma_kl = d_kl/a_k - (1/K)[1/a_k + 1/a_l - (1/K) sum_u 1/a_u] (LM paper B.4)."""
    from numpyro_lm.families import dirichlet_to_zero_sum_gaussian

    alpha = jnp.array([0.5, 1.0, 2.0, 0.7])
    k = alpha.size
    mean, cov = dirichlet_to_zero_sum_gaussian(alpha)
    inv = 1 / alpha
    expected = jnp.diag(inv) - (inv[:, None] + inv[None, :] - jnp.sum(inv) / k) / k
    np.testing.assert_allclose(cov, expected, rtol=1e-12)
    np.testing.assert_allclose(jnp.sum(mean), 0.0, atol=1e-12)
    np.testing.assert_allclose(cov @ jnp.ones(k), 0.0, atol=1e-12)


@pytest.mark.parametrize(
    "key", [("gamma", "log"), ("gamma", "sqrt"), ("inverse_gamma", "log"), ("inverse_gamma", "sqrt"), ("beta", "logit")]
)
def test_two_parameter_maps_are_bijections(key):
    family = get_family(*key)
    mean = jnp.array([0.3, 1.5, 4.0])
    var = jnp.array([0.05, 0.2, 0.01])
    back_mean, back_var = family.to_gaussian(family.from_gaussian(mean, var))
    np.testing.assert_allclose(back_mean, mean, rtol=1e-10)
    np.testing.assert_allclose(back_var, var, rtol=1e-10)


@pytest.mark.parametrize("key,params,_", CASES, ids=IDS)
def test_maps_run_under_jit_and_vmap(key, params, _):
    family, params = get_family(*key), _jnp(params)
    batched = jax.tree.map(lambda v: jnp.stack([v, v]), params)
    mean, cov = jax.jit(jax.vmap(family.to_gaussian))(batched)
    back = jax.jit(jax.vmap(family.from_gaussian))(mean, cov)
    for key in params:
        np.testing.assert_allclose(back[key][1], params[key], rtol=1e-10)


positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(a=positive, b=positive)
def test_gamma_and_beta_maps_stay_valid_across_scales(a, b):
    for key, params in [(("gamma", "log"), {"concentration": a, "rate": b}),
                        (("gamma", "sqrt"), {"concentration": a + 0.5, "rate": b}),
                        (("inverse_gamma", "log"), {"concentration": a, "rate": b}),
                        (("inverse_gamma", "sqrt"), {"concentration": a, "rate": b}),
                        (("beta", "logit"), {"concentration1": a, "concentration0": b})]:
        family = get_family(*key)
        params = {k: jnp.asarray(v) for k, v in params.items()}
        mean, var = family.to_gaussian(params)
        assert np.isfinite(mean) and var > 0
        back = family.from_gaussian(mean, var)
        for key in params:
            assert float(back[key]) > 0
            np.testing.assert_allclose(back[key], params[key], rtol=1e-8)


@settings(max_examples=50, deadline=None)
@given(alpha=st.lists(positive, min_size=2, max_size=6))
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_dirichlet_bridge_stays_valid_across_scales(alpha):
    family = get_family("dirichlet")
    params = {"concentration": jnp.asarray(alpha)}
    back = family.from_gaussian(*family.to_gaussian(params))["concentration"]
    assert bool(jnp.all(back > 0))
    np.testing.assert_allclose(back, params["concentration"], rtol=1e-8)


def test_inverse_gamma_sqrt_seeds_forward_is_the_large_alpha_limit():
    """LM paper Table 2: mu = sqrt(rate/alpha), s^2 = rate/(4 alpha^2); relative error O(1/alpha)."""
    from numpyro_lm.families.inverse_gamma import inverse_gamma_sqrt_seeds_forward

    for alpha in [2.0, 20.0, 200.0]:
        params = {"concentration": jnp.asarray(alpha), "rate": jnp.asarray(3.0)}
        exact = get_family("inverse_gamma", "sqrt").to_gaussian(params)
        seeds = inverse_gamma_sqrt_seeds_forward(params)
        rel = [abs(float(s / e) - 1) for s, e in zip(seeds, exact)]
        # exact: mu^2 = 2 rate/(2 alpha + 1), s^2 = rate/(2 alpha + 1)^2
        np.testing.assert_allclose(rel[0], abs(np.sqrt((2 * alpha + 1) / (2 * alpha)) - 1), rtol=1e-10)
        np.testing.assert_allclose(rel[1], abs((2 * alpha + 1) ** 2 / (4 * alpha**2) - 1), rtol=1e-10)
        assert rel[1] < 1.5 / alpha


def test_registry_lists_core_families():
    assert {"normal", "gaussian", "gamma", "exponential", "chi2", "inverse_gamma", "beta", "dirichlet"} <= set(
        family_names()
    )
    with pytest.raises(ValueError, match="unknown matched family"):
        get_family("nope")
    with pytest.raises(ValueError, match="family 'beta' has no map in the 'log' basis"):
        get_family("beta", "log")
    assert get_family("gaussian", "logm").in_basis
