"""Laplace Bridge helpers: conditioning, LB-norm, Beta marginals, uncertainty-aware top-k."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.contrib.bridge import (bridge_spread_factor, condition_zero_sum, dirichlet_beta_marginals,
                                       laplace_bridge, uncertainty_aware_top_k)
from numpyro_lm.families.laplace_bridge import lb_norm, log_dirichlet_from_zero_sum_gaussian
from numpyro_lm.families import dirichlet_to_zero_sum_gaussian, get_family

pytestmark = pytest.mark.usefixtures("x64")


def _random_gaussian(k, seed=0):
    key1, key2 = jax.random.split(jax.random.PRNGKey(seed))
    a = jax.random.normal(key1, (k, k))
    return jax.random.normal(key2, (k,)), a @ a.T + 0.1 * jnp.eye(k)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_condition_zero_sum_is_gaussian_conditioning():
    """Against the generic formula mu + S A'(A S A')^-1 (0 - A mu) with A = 1' (thesis B.2)."""
    mean, cov = _random_gaussian(5)
    a = jnp.ones((1, 5))
    gain = cov @ a.T @ jnp.linalg.inv(a @ cov @ a.T)
    expected_mean = mean - (gain @ (a @ mean)).ravel()
    expected_cov = cov - gain @ a @ cov
    m, c = condition_zero_sum(mean, cov)
    np.testing.assert_allclose(m, expected_mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c, expected_cov, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(jnp.sum(m), 0.0, atol=1e-12)
    np.testing.assert_allclose(c @ jnp.ones(5), 0.0, atol=1e-10)


def test_bridge_inverts_the_dirichlet_laplace_map_with_and_without_correction():
    alpha = jnp.array([0.5, 1.0, 2.0, 0.7])
    mean, cov = dirichlet_to_zero_sum_gaussian(alpha)
    for correction in (None, "zero_sum"):
        np.testing.assert_allclose(laplace_bridge(mean, cov, correction), alpha, rtol=1e-10)
    # shifting all logits by a constant changes nothing after conditioning
    np.testing.assert_allclose(laplace_bridge(mean + 3.0, cov), alpha, rtol=1e-10)


def test_lb_norm_rescales_and_keeps_zero_sum():
    mean, cov = condition_zero_sum(*_random_gaussian(4, seed=1))
    for reduce, scale in (("mean", jnp.trace(cov) / 4 / jnp.sqrt(4 / 2)), ("sum", jnp.trace(cov) / jnp.sqrt(4 / 2))):
        m, c = lb_norm(mean, cov, reduce)
        np.testing.assert_allclose(m, mean / jnp.sqrt(scale), rtol=1e-12)
        np.testing.assert_allclose(c, cov / scale, rtol=1e-12)
    with pytest.raises(ValueError, match="scale must be one of"):
        lb_norm(mean, cov, "median")
    np.testing.assert_allclose(jnp.sum(m), 0.0, atol=1e-12)
    alpha = laplace_bridge(mean, cov, "lb_norm")
    assert bool(jnp.all(alpha > 0))
    with pytest.raises(ValueError, match="correction must be one of"):
        laplace_bridge(mean, cov, "probit")


def test_bridge_accepts_diagonal_variances_and_batches():
    mean = jnp.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    var = jnp.array([[0.5, 0.5, 0.5], [1.0, 2.0, 3.0]])
    full = jax.vmap(jnp.diag)(var)
    np.testing.assert_allclose(laplace_bridge(mean, var), laplace_bridge(mean, full), rtol=1e-12)
    assert laplace_bridge(mean, var).shape == (2, 3)


def test_bridge_mean_is_softmax_of_the_logit_mean_for_dirichlet_shaped_gaussians():
    """In the softmax basis the Dirichlet's mode sits at its mean: alpha / alpha_0 = softmax(mu)."""
    mean, cov = dirichlet_to_zero_sum_gaussian(jnp.array([4.0, 2.0, 1.0, 0.3]))
    alpha = laplace_bridge(mean + 0.7, cov)
    np.testing.assert_allclose(alpha / alpha.sum(), jax.nn.softmax(mean), rtol=1e-10)


def test_beta_marginals_match_dirichlet_moments():
    import numpyro.distributions as dist

    alpha = jnp.array([3.5, 1.0, 9.0, 1.7])
    beta = dirichlet_beta_marginals(alpha)
    d = dist.Dirichlet(alpha)
    np.testing.assert_allclose(beta.mean, d.mean, rtol=1e-12)
    np.testing.assert_allclose(beta.variance, d.variance, rtol=1e-12)


@pytest.mark.parametrize(
    "alpha,expected",
    [
        ([50.0, 49.0, 2.0, 1.0], [True, True, False, False]),  # two indistinguishable classes
        ([1.0, 100.0, 1.0, 1.0], [False, True, False, False]),  # one clear winner
        ([3.0, 3.0, 3.0, 3.0, 3.0], [True] * 5),  # nothing separates
    ],
)
def test_uncertainty_aware_top_k(alpha, expected):
    mask = uncertainty_aware_top_k(jnp.asarray(alpha))
    np.testing.assert_array_equal(mask, expected)


def test_top_k_batches_and_stops_at_first_gap():
    alpha = jnp.array([[60.0, 58.0, 5.0, 57.0], [10.0, 10.0, 10.0, 10.0]])
    mask = uncertainty_aware_top_k(alpha)
    # sorted: 60, 58, 57 all overlap; 5 does not
    np.testing.assert_array_equal(mask[0], [True, True, False, True])
    assert int(mask[1].sum()) == 4


def test_lb_norm_family_is_selectable():
    family = get_family("dirichlet_lb_norm", "softmax")
    mean, cov = get_family("dirichlet", "softmax").to_gaussian({"concentration": jnp.array([2.0, 3.0, 4.0])})
    assert bool(jnp.all(family.from_gaussian(mean, cov)["concentration"] > 0))


def test_spread_factor_is_one_for_a_dirichlets_own_laplace_image_and_large_far_from_it():
    # in family: the bridge inverts the Laplace map, so the round trip gives the variances back
    alpha = jnp.array([[0.5, 1.0, 2.0, 0.7], [30.0, 2.0, 5.0, 900.0]])
    mean, cov = dirichlet_to_zero_sum_gaussian(alpha)
    var = jnp.diagonal(cov, axis1=-2, axis2=-1)
    factor = bridge_spread_factor(log_dirichlet_from_zero_sum_gaussian(mean, var), var)
    np.testing.assert_allclose(factor, 1.0, atol=1e-10)
    # a confident network's logits: means 30 apart, variances 15 after conditioning. The
    # bottom class gets 1/alpha = 15 / (1 - 2/K + 1/K^2) = 26.7 and every other class a huge
    # alpha, so their Laplace variances are only the shared sum(1/alpha)/K^2 = 1.67 against 15:
    # the spread is off by sqrt(15 / 1.67) = 3
    mean, cov = condition_zero_sum(jnp.array([15.0, -15.0, 0.0, 2.0]), 20.0 * jnp.eye(4))
    var = jnp.diagonal(cov)
    log_alpha = log_dirichlet_from_zero_sum_gaussian(mean, var)
    back = (1 - 2 / 4) * jnp.exp(-log_alpha) + jnp.sum(jnp.exp(-log_alpha)) / 16
    want = jnp.exp(0.5 * jnp.max(jnp.abs(jnp.log(back / var))))
    np.testing.assert_allclose(bridge_spread_factor(log_alpha, var), want, rtol=1e-10)
    assert 2.9 < want < 3.1


@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0])
def test_spread_factor_depends_on_the_means_geometry_not_the_variances_scale(scale):
    # two logits: two variances, two concentrations; every Gaussian has a Dirichlet image
    mean, cov = condition_zero_sum(jnp.array([7.0, -3.0]), scale * jnp.eye(2))
    var = jnp.diagonal(cov)
    np.testing.assert_allclose(bridge_spread_factor(log_dirichlet_from_zero_sum_gaussian(mean, var), var), 1.0,
                               rtol=1e-10)
    # ten classes, one logit 5 above the rest, isotropic: 2.513 whatever the scale (the value
    # quoted in bridge_spread_factor's docstring)
    mean, cov = condition_zero_sum(jnp.zeros(10).at[0].set(5.0), scale * jnp.eye(10))
    var = jnp.diagonal(cov)
    np.testing.assert_allclose(bridge_spread_factor(log_dirichlet_from_zero_sum_gaussian(mean, var), var), 2.5135,
                               rtol=1e-4)


@pytest.mark.parametrize("mean, cov, message", [
    (jnp.zeros(3), -jnp.eye(3), "not positive semi-definite"),
    (jnp.zeros(3), jnp.diag(jnp.array([1.0, 1.0, -0.5])), "smallest eigenvalue is -0.5"),
    (jnp.zeros((2, 3)), jnp.stack([jnp.eye(3), -jnp.eye(3)]), r"batch index \[1\]"),
    (jnp.zeros(3), -jnp.ones(3), "variances must be positive"),
    (jnp.array([0.0, 1.0, jnp.nan]), jnp.eye(3), "NaN or inf in mean"),
    (jnp.zeros(3), jnp.eye(4), r"cov must have shape \(\.\.\., 3, 3\)"),
    (jnp.zeros(3), jnp.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), "symmetric"),
])
def test_bridge_refuses_a_gaussian_it_cannot_map(mean, cov, message):
    """No silent NaN: the bridge's variances come from the covariance's diagonal."""
    with pytest.raises(ValueError, match=message):
        laplace_bridge(mean, cov)


def test_bridge_accepts_a_singular_zero_sum_covariance_and_traced_inputs():
    """A zero-sum covariance is singular (1' S 1 = 0), not negative: accepted; jit skips value checks."""
    mean, cov = _random_gaussian(4)
    zero_mean, zero_cov = condition_zero_sum(mean, cov)
    np.testing.assert_allclose(laplace_bridge(zero_mean, zero_cov, correction=None),
                               laplace_bridge(mean, cov), rtol=1e-8)
    np.testing.assert_allclose(jax.jit(laplace_bridge)(mean, cov), laplace_bridge(mean, cov), rtol=1e-8)


@pytest.mark.parametrize("concentration", [[1.0, np.nan, 2.0], [1.0, 0.0, 2.0], [1.0, -1.0, 2.0]])
def test_top_k_refuses_concentrations_that_are_not_positive(concentration):
    with pytest.raises(ValueError, match=r"concentration\[1\]"):
        uncertainty_aware_top_k(jnp.array(concentration))
