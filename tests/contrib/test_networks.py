"""PIHAM (numpyro_lm.contrib.networks): the model's density, exact per-node and joint curvature, the
Dirichlet memberships, recovery of planted communities, the appendix C scores, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import log_density
from scipy import special, stats

from numpyro_lm.families import dirichlet_to_zero_sum_gaussian
from numpyro_lm.contrib.networks import (Network, edge_means, fit_piham, log_joint, logistic_normal_intervals, memberships,
                                 mtcov_network, piham_model, piham_network, prior_network)
from numpyro_lm.contrib.networks import metrics as M
from numpyro_lm.contrib.networks.model import as_arrays, default_masks, init_shapes, node_log_density


def _random_params(network, k, directed, seed=0):
    shapes = init_shapes(network, k, directed)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    return {site: jax.random.normal(key, shape) for key, (site, shape) in zip(keys, shapes.items())}


@pytest.fixture(scope="module")
def small():
    g = piham_network(12, 3, seed=1)
    folds = M.kfold_masks(3, 12, 3, seed=0)
    return g, as_arrays(g.network), *map(jnp.asarray, folds[0])


@pytest.fixture(scope="module")
def fitted():
    g = piham_network(45, 3, seed=0)
    em, am = M.kfold_masks(3, 45, 3, seed=1)[0]
    return g, em, am, fit_piham(g.network, 3, edge_mask=em, attribute_mask=am, num_restarts=3, num_steps=400)


@pytest.mark.parametrize("directed, site", [(True, "U"), (True, "V"), (False, "U")])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_nodes_local_density_has_the_joint_hessians_block(small, directed, site):
    g, net, em, am = small
    params = _random_params(g.network, 3, directed)
    full = jax.jit(jax.hessian(lambda x: log_joint({**params, site: x}, net, em, am, directed=directed)))(params[site])
    block_at = jax.jit(jax.hessian(lambda row, i: node_log_density(row, i, params, net, em, am, site=site,
                                                                   directed=directed)))
    for i in (0, 7, 11):
        block = block_at(params[site][i], i)
        # float32 sums of ~100 terms of size ~10: 1e-4 relative
        np.testing.assert_allclose(block, full[i, :, i, :], atol=1e-4 * float(jnp.max(jnp.abs(block))))


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_numpyro_model_is_the_log_joint(small):
    g, net, em, am = small
    params = _random_params(g.network, 3, True)
    value, _ = log_density(piham_model, (net, 3, em, am), {}, params)
    np.testing.assert_allclose(value, log_joint(params, net, em, am), rtol=1e-5)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_joint_covariances_are_blocks_of_the_inverse_dense_hessian_at_the_mode(fitted):
    g, em, am, fit = fitted
    net, em, am = as_arrays(g.network), jnp.asarray(em), jnp.asarray(am)
    flat, unravel = jax.flatten_util.ravel_pytree(fit.params)
    dense = np.asarray(jax.jit(jax.hessian(lambda x: -log_joint(unravel(x), net, em, am)))(flat), np.float64)
    assert np.linalg.eigvalsh(dense)[0] > 0  # a mode: the fit checked it, this confirms it
    cov = np.linalg.inv(dense)
    for site, got in (("U", fit.U.latent_cov), ("V", fit.V.latent_cov)):
        index = np.asarray(unravel(jnp.arange(flat.shape[0], dtype=jnp.float32))[site]).round().astype(int)
        want = cov[index[:, :, None], index[:, None, :]]
        # float32 Hessian-vector products and Cholesky against a float64 inverse
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3 * np.abs(want).max())


def test_memberships_of_a_dirichlets_laplace_image_give_the_dirichlet_and_its_beta_quantiles():
    alpha = jnp.array([[2.0, 5.0, 1.5], [30.0, 3.0, 8.0]])
    mean, cov = dirichlet_to_zero_sum_gaussian(alpha)
    # a membership Gaussian need not be zero-sum: a shift along 1 leaves softmax unchanged
    m = memberships(mean + jnp.array([[1.0], [-2.0]]), cov, credibility=0.9, interval="dirichlet")
    np.testing.assert_allclose(m.concentration, alpha, rtol=1e-4)
    a0 = np.asarray(alpha).sum(-1, keepdims=True)
    np.testing.assert_allclose(m.lower, stats.beta.ppf(0.05, alpha, a0 - alpha), rtol=1e-3)
    np.testing.assert_allclose(m.upper, stats.beta.ppf(0.95, alpha, a0 - alpha), rtol=1e-3)
    np.testing.assert_allclose(m.mean, alpha / a0, rtol=1e-5)


def test_logistic_normal_intervals_are_exact_for_two_communities():
    # softmax(x)_0 = sigmoid(x_0 - x_1), and x_0 - x_1 is Gaussian: the delta method is exact
    mean = jnp.array([[1.5, -0.5], [0.2, 0.1]])
    cov = jnp.array([[[0.5, 0.2], [0.2, 0.3]], [[2.0, -0.5], [-0.5, 1.0]]])
    lower, upper = logistic_normal_intervals(mean, cov, credibility=0.8)
    m, s = np.asarray(mean[:, 0] - mean[:, 1]), np.sqrt(np.asarray(cov[:, 0, 0] + cov[:, 1, 1] - 2 * cov[:, 0, 1]))
    for q, got in ((0.1, lower), (0.9, upper)):
        want = special.expit(stats.norm.ppf(q, m, s))
        np.testing.assert_allclose(got[:, 0], want, rtol=1e-5)
        np.testing.assert_allclose(got[:, 1], 1 - special.expit(stats.norm.ppf(1 - q, m, s)), rtol=1e-5)


@pytest.mark.parametrize("sd", [0.1, 0.3])
def test_logistic_normal_intervals_hold_their_share_of_softmax_draws(sd):
    rng = np.random.default_rng(1)
    mean = np.array([[2.0, -1.0, -1.5], [0.3, 0.0, -0.2], [4.0, 0.0, 1.0]])
    a = rng.normal(size=(3, 3, 3))
    cov = sd**2 * (a @ a.transpose(0, 2, 1) / 3 + 0.3 * np.eye(3))
    lower, upper = logistic_normal_intervals(jnp.asarray(mean, jnp.float32), jnp.asarray(cov, jnp.float32))
    x = mean + np.einsum("nij,snj->sni", np.linalg.cholesky(cov), rng.normal(size=(20000, 3, 3)))
    p = special.softmax(x, -1)
    inside = np.mean((p >= np.asarray(lower)) & (p <= np.asarray(upper)), 0)
    # 20000 draws: binomial SE 0.002; the linearisation's own error, measured up to 0.007 at
    # SD 0.3 (0.016 at SD 0.6, where it starts to matter)
    np.testing.assert_allclose(inside, 0.9, atol=0.015)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_fit_recovers_planted_communities_and_scores_held_out_entries(fitted):
    g, em, am, fit = fitted
    assert fit.covariance == "joint"  # 45 nodes: far below JOINT_LIMIT
    assert fit.log_joint == pytest.approx(float(np.max(fit.restart_log_joints)))
    perm = M.align(fit.U.mean, g.u)
    # the planted groups are well separated (latent 2 vs -1): measured 0.99+; a wrong fit ~0.6
    assert M.cosine_similarity(fit.U.mean, g.u, perm) > 0.95
    assert M.cosine_similarity(fit.V.mean, g.v, perm) > 0.95
    assert np.all((fit.U.lower < fit.U.median) & (fit.U.median < fit.U.upper))
    auc = M.edge_scores(g.network.layers, g.network.layer_kinds, edge_means(fit.params, g.network), 1 - em)[0]["auc"]
    assert auc > 0.65  # Bernoulli layer, measured ~0.75 here and ~0.8 at N = 500; chance is 0.5


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_an_undirected_fit_ties_v_to_u():
    g = mtcov_network(30, 3, 10, seed=2)
    fit = fit_piham(g.network, 3, directed=False, num_restarts=2, num_steps=400, covariance="node")
    assert "V" not in fit.params and fit.V is fit.U and fit.covariance == "node"


def test_kfold_masks_partition_every_entry_and_align_undoes_a_relabelling():
    folds = M.kfold_masks(2, 10, 1, num_folds=5, seed=0)
    held_out = sum(1 - e for e, _ in folds)
    np.testing.assert_array_equal(held_out, 1)  # each entry is held out exactly once
    truth = np.random.default_rng(0).dirichlet(np.ones(4), 30)
    assert M.align(truth[:, [2, 0, 3, 1]], truth) == [1, 3, 0, 2]
    assert M.cosine_similarity(truth[:, [2, 0, 3, 1]], truth) == pytest.approx(1.0)


@pytest.mark.parametrize("change, message", [
    (dict(layer_kinds=("binary",)), "layer 0: kind 'binary'"),
    (dict(layers=(np.full((5, 5), 2.0),)), "layer 0: a Bernoulli layer"),
    (dict(layers=(np.zeros((5, 4)),)), r"layer 0: shape \(5, 4\)"),
    (dict(attributes=(np.array([0, 1, 2, 3, 1]),)), "attribute 0: categorical values"),
    (dict(attribute_kinds=("ordinal",)), "attribute 0: kind 'ordinal'"),
])
def test_malformed_networks_are_refused_by_name(change, message):
    base = Network(layers=(np.eye(5)[::-1].copy(),), layer_kinds=("bernoulli",), attributes=(np.array([0, 1, 2, 0, 1]),),
                   attribute_kinds=("categorical",), num_categories=(3,))
    with pytest.raises(ValueError, match=message):
        fit_piham(base._replace(**change), 2, num_restarts=1, num_steps=1)


def test_bad_arguments_are_refused_by_name():
    g = mtcov_network(20, 2, 5, seed=0)
    with pytest.raises(ValueError, match="num_communities"):
        fit_piham(g.network, 1)
    with pytest.raises(ValueError, match="covariance"):
        fit_piham(g.network, 2, covariance="dense")
    with pytest.raises(ValueError, match="interval"):
        fit_piham(g.network, 2, interval="beta")
    with pytest.raises(ValueError, match="edge_mask"):
        fit_piham(g.network, 2, edge_mask=np.ones((1, 20, 20)))


def test_prior_network_draws_its_data_from_piham_at_the_returned_latents():
    g, latents = prior_network(80, 3, layer_kinds=("bernoulli", "poisson", "gaussian"),
                               attribute_kinds=("categorical", "poisson"), num_categories=(4, 0), seed=3)
    assert set(latents) == {"U", "V", "W", "H0", "H1"} and latents["H0"].shape == (3, 4)
    np.testing.assert_allclose(g.u.sum(1), 1.0, rtol=1e-5)
    means = np.asarray(edge_means(latents, g.network), np.float64)
    off = ~np.eye(80, dtype=bool)
    for layer, mean, kind in zip(g.network.layers, means, g.network.layer_kinds):
        resid = (layer - mean)[off]
        var = {"bernoulli": mean * (1 - mean), "poisson": mean, "gaussian": np.ones_like(mean)}[kind][off]
        # the standardised sum of 6320 independent residuals is N(0, 1) if the draw is right
        assert abs(resid.sum() / np.sqrt(var.sum())) < 4.0
    assert np.all(np.diagonal(np.stack(g.network.layers), axis1=1, axis2=2) == 0)
