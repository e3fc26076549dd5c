"""LM + GP (numpyro_lm/contrib/gp/): pseudo-observations, the heteroskedastic GP, the matched predictive."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from numpyro_lm.families import get_family
from numpyro_lm.families.dirichlet import lift_zero_sum
from numpyro_lm.contrib.gp import (DATA_KINDS, LMGP, KernelParams, group_labels, latent_predictive, log_marginal_likelihood,
                           matched_predictive, pseudo_observations)
from numpyro_lm.contrib.gp.component import lm_gp_model, predict_with_draws, pseudo_likelihood
from numpyro_lm.contrib.gp.pseudo import BLOCK_KINDS
from numpyro_lm.contrib.gp.blocks import (block_log_marginal_likelihood, block_predictive, diagonal_log_marginal_likelihood,
                                  predictive)
from numpyro_lm.contrib.gp.model import default_choices
from numpyro_lm.contrib.gp.loo import group_statistics, leave_one_out, log_compound, loo_log_predictive
from numpyro_lm.contrib.gp.refine import posterior_mean_at_groups, relinearise, relinearised_sites, site_log_likelihood
from numpyro_lm.contrib.gp.regression import rbf_kernel

X64 = pytest.mark.usefixtures("x64")  # closed forms compared to 1e-8; the end-to-end tests run in float32


@X64
def test_a_binary_point_is_the_thesis_beta_pseudo_likelihood():
    # one point per group: Beta(y + eps, 1 - y + eps); logit basis mu = log(a / b), var = (a + b) / (a b) (eq. 3.15)
    pseudo = pseudo_observations(np.arange(4.0), np.array([1.0, 0.0, 1.0, 1.0]), "binary", eps=0.1)
    a, b = np.array([1.1, 0.1, 1.1, 1.1]), np.array([0.1, 1.1, 0.1, 0.1])
    np.testing.assert_allclose(pseudo.mean, np.log(a / b), rtol=1e-12)
    np.testing.assert_allclose(pseudo.noise, (a + b) / (a * b), rtol=1e-12)
    np.testing.assert_array_equal(pseudo.size, np.ones(4))


@X64
def test_grouping_adds_the_sufficient_statistics_to_one_prior():
    x = np.array([0.0, 1.0, 0.0, 1.0, 0.0])
    y = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    pseudo = pseudo_observations(x, y, "binary", eps=0.5)
    # groups in order of first appearance: x = 0 (three points, two successes), x = 1 (two points, one)
    np.testing.assert_array_equal(pseudo.inputs[:, 0], [0.0, 1.0])
    np.testing.assert_allclose(pseudo.params["concentration1"], [2.5, 1.5])
    np.testing.assert_allclose(pseudo.params["concentration0"], [1.5, 1.5])
    counts = pseudo_observations(x, np.array([3.0, 0.0, 1.0, 2.0, 5.0]), "counts", eps=0.5)
    # Poisson counts: Gamma(eps + sum y, n); log basis mu = log(alpha / beta), var = 1 / alpha
    np.testing.assert_allclose(counts.params["concentration"], [9.5, 2.5])
    np.testing.assert_allclose(counts.params["rate"], [3.0, 2.0])
    np.testing.assert_allclose(counts.mean, np.log([9.5 / 3.0, 2.5 / 2.0]), rtol=1e-12)
    np.testing.assert_allclose(counts.noise, [1 / 9.5, 1 / 2.5], rtol=1e-12)


def test_labels_group_points_and_inputs_are_averaged():
    x = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    pseudo = pseudo_observations(x, np.array([1.0, 1.0, 0.0]), "binary", labels=np.array([7, 7, 2]))
    np.testing.assert_allclose(pseudo.inputs, [[4.0, 5.0], [1.0, 2.0]])  # labels sorted: 2, then 7
    np.testing.assert_array_equal(group_labels(np.array([3.0, 1.0, 3.0, 2.0])), [0, 1, 0, 2])


@pytest.mark.parametrize("kind, y, match", [
    ("binary", [0.0, 2.0], "binary labels must be 0 or 1"),
    ("counts", [1.0, -1.0], "counts must be non-negative integers"),
    ("counts", [1.0, 0.5], "counts must be non-negative integers"),
    ("binary", [0.0, np.nan], "not finite"),
    ("ordinal", [0.0, 1.0], "kind must be one of"),
])
def test_bad_data_is_refused_by_name(kind, y, match):
    with pytest.raises(ValueError, match=match):
        pseudo_observations(np.arange(2.0), np.array(y), kind)


def _dense_gp(params, x, mean, noise, test):
    """Rasmussen & Williams eqs. 2.22-2.24 with a diagonal noise, in NumPy."""
    amp, ell = np.exp(params.log_amplitude), np.exp(params.log_lengthscale)

    def k(a, b):
        d = (a[:, None, :] - b[None, :, :]) / ell
        return amp**2 * np.exp(-0.5 * np.sum(d**2, -1))

    ky = k(x, x) + np.diag(noise)
    ks = k(test, x)
    mu = params.mean + ks @ np.linalg.solve(ky, mean - params.mean)
    var = amp**2 - np.einsum("ij,ji->i", ks, np.linalg.solve(ky, ks.T))
    return mu, var, stats.multivariate_normal(np.full(len(mean), params.mean), ky).logpdf(mean)


@X64
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_gp_is_the_closed_form_heteroskedastic_regression():
    rng = np.random.default_rng(0)
    pseudo = pseudo_observations(rng.uniform(-2, 2, (15, 2)), rng.poisson(3.0, 15).astype(float), "counts",
                                 labels=np.arange(15))
    params = KernelParams(jnp.asarray(0.3), jnp.asarray([0.2, -0.1]), jnp.asarray(1.0))
    test = rng.uniform(-2, 2, (6, 2))
    mu, var, lml = _dense_gp(params, pseudo.inputs, pseudo.mean, pseudo.noise, test)
    got_mu, got_var = latent_predictive(params, pseudo, test)
    np.testing.assert_allclose(got_mu, mu, rtol=1e-8)
    # tinygp adds its default jitter, sqrt(eps) of the dtype (1.49e-8 here), to the conditional's diagonal
    np.testing.assert_allclose(got_var, var, rtol=1e-8, atol=2e-8)
    got = log_marginal_likelihood(params, jnp.asarray(pseudo.inputs), jnp.asarray(pseudo.mean),
                                  jnp.asarray(pseudo.noise))
    np.testing.assert_allclose(got, lml, rtol=1e-10)


@X64
@pytest.mark.parametrize("kind", ["binary", "counts"])
def test_the_matched_predictive_round_trips_the_latent_gaussian(kind):
    mean, var = jnp.array([-1.0, 0.0, 2.0]), jnp.array([0.5, 1.0, 0.1])
    d = matched_predictive(kind, mean, var)
    family = get_family(*DATA_KINDS[kind])
    params = ({"concentration1": d.concentration1, "concentration0": d.concentration0} if kind == "binary"
              else {"concentration": d.concentration, "rate": d.rate})
    back_mean, back_var = family.to_gaussian(params)
    np.testing.assert_allclose(back_mean, mean, rtol=1e-10)
    np.testing.assert_allclose(back_var, var, rtol=1e-10)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_many_points_per_input_recover_the_true_probability():
    # 25 inputs, 400 Bernoulli draws each: each group's Beta is sharp (sd of p about 0.02),
    # so the prediction at the inputs must follow the true curve within a few of those SDs
    rng = np.random.default_rng(1)
    grid = np.linspace(-2, 2, 25)
    p = 1 / (1 + np.exp(-2.0 * np.sin(1.5 * grid)))
    x = np.repeat(grid, 400)
    y = (rng.uniform(size=x.size) < np.repeat(p, 400)).astype(float)
    lm = LMGP("binary").fit(x, y)
    assert lm.pseudo.mean.shape == (25,)
    assert lm.trace[-1] > lm.trace[0]  # the marginal likelihood went up
    pred = lm.predict(grid)
    assert np.max(np.abs(pred.expected - p)) < 0.08  # 4 SDs of the worst group's binomial error (0.025 at p=0.5)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_failed_fit_leaves_the_object_as_it_was():
    lm = LMGP("counts", num_steps=50).fit(np.arange(5.0), np.array([1.0, 2.0, 3.0, 2.0, 1.0]))
    before = lm.predict(np.array([2.5])).expected
    with pytest.raises(ValueError, match="counts must be non-negative integers"):
        lm.fit(np.arange(3.0), np.array([1.0, -2.0, 0.0]))
    np.testing.assert_array_equal(lm.predict(np.array([2.5])).expected, before)
    with pytest.raises(ValueError, match="test_inputs have 2 dimensions"):
        lm.predict(np.zeros((1, 2)))
    with pytest.raises(RuntimeError, match="call fit"):
        LMGP("binary").predict(np.zeros(1))


# ------------------------------------------------------------ categories and covariances


@X64
def test_categories_are_the_thesis_dirichlet_on_the_zero_sum_plane():
    # two groups: category counts (2, 0, 1) and (0, 1, 0); Dirichlet(eps + counts), eq. 3.17a-b
    x = np.array([0.0, 0.0, 0.0, 1.0])
    pseudo = pseudo_observations(x, np.array([0, 0, 2, 1]), "categorical", eps=0.5)
    alpha = np.array([[2.5, 0.5, 1.5], [0.5, 1.5, 0.5]])
    np.testing.assert_allclose(pseudo.params["concentration"], alpha)
    by_counts = pseudo_observations(x, np.eye(3)[[0, 0, 2, 1]], "categorical", eps=0.5)
    np.testing.assert_allclose(by_counts.mean, pseudo.mean, rtol=1e-12)
    mean_z, cov_z = lift_zero_sum(jnp.asarray(pseudo.mean), jnp.asarray(pseudo.noise))
    np.testing.assert_allclose(mean_z, np.log(alpha) - np.log(alpha).mean(1, keepdims=True), rtol=1e-12)
    project = np.eye(3) - 1 / 3
    np.testing.assert_allclose(cov_z, project @ (np.eye(3) / alpha[:, None, :]) @ project, atol=1e-12)
    assert pseudo.noise.shape == (2, 2, 2)  # K - 1 orthonormal coordinates


@X64
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_covariance_groups_are_the_likelihood_as_an_inverse_wishart():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(20, 3))
    pseudo = pseudo_observations(np.repeat([0.0, 1.0], 10), r, "covariance", eps=0.5)
    pooled = r.T @ r / 20
    for g in range(2):
        block = r[10 * g:10 * (g + 1)]
        np.testing.assert_allclose(pseudo.params["scale_matrix"][g], block.T @ block + 0.5 * pooled, rtol=1e-12)
    np.testing.assert_allclose(pseudo.params["concentration"], 10 + 0.5 - 3 - 1)  # n + eps - p - 1
    assert pseudo.mean.shape == (2, 6) and pseudo.noise.shape == (2, 6, 6)  # vech of the 3 x 3 log
    # the mean is the log of the maximum-likelihood covariance Psi / (n + eps)
    w, v = np.linalg.eigh(pseudo.params["scale_matrix"][0] / 10.5)
    log_ml = (v * np.log(w)) @ v.T
    np.testing.assert_allclose(pseudo.mean[0], log_ml[np.tril_indices(3)], rtol=1e-6, atol=1e-8)


@X64
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_an_isotropic_covariance_likelihood_has_the_closed_form_noise():
    # Psi = c I: S = log(c / n) I, and -d2 l = (n / 2) (1 on diagonal entries, 2 off it) in vech(S)
    from numpyro_lm.contrib.gp.pseudo import _covariance_likelihood_gaussian

    mean, noise = _covariance_likelihood_gaussian(jnp.array([12.0]), jnp.array([3.0 * np.eye(3)]))
    rows, cols = np.tril_indices(3)
    np.testing.assert_allclose(mean[0], np.where(rows == cols, np.log(3.0 / 12.0), 0.0), atol=1e-10)
    np.testing.assert_allclose(noise[0], np.diag(np.where(rows == cols, 2.0, 1.0) / 12.0), atol=1e-8)


def _kernel(params, a, b):
    ell = np.exp(np.asarray(params.log_lengthscale))
    d = (a[:, None, :] - b[None, :, :]) / ell
    return np.exp(-0.5 * np.sum(d**2, -1))


@X64
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_block_gp_is_the_closed_form_kronecker_regression():
    rng = np.random.default_rng(2)
    x = rng.uniform(-2, 2, (40, 1))
    pseudo = pseudo_observations(x, rng.integers(0, 3, 40), "categorical", labels=np.arange(40) // 4)
    m, d = pseudo.mean.shape
    params = KernelParams(jnp.asarray([0.3, -0.2]), jnp.asarray([0.1]), jnp.asarray([0.5, -0.5]))
    corr = np.array([[1.0, 0.3], [0.3, 1.0]])
    scaled = np.exp(np.asarray(params.log_amplitude))[:, None] * corr * np.exp(np.asarray(params.log_amplitude))
    a = np.kron(_kernel(params, pseudo.inputs, pseudo.inputs), scaled)
    for g in range(m):
        a[g * d:(g + 1) * d, g * d:(g + 1) * d] += pseudo.noise[g]
    r = (pseudo.mean - np.asarray(params.mean)).ravel()
    test = np.array([[-1.0], [0.3], [2.5]])
    cross = np.kron(_kernel(params, test, pseudo.inputs), scaled)  # (3 d, m d)
    loc = np.asarray(params.mean) + (cross @ np.linalg.solve(a, r)).reshape(3, d)
    full = np.kron(np.eye(3), scaled) - cross @ np.linalg.solve(a, cross.T)
    got_loc, got_cov = block_predictive(params, pseudo, test, output_kernel=corr)
    np.testing.assert_allclose(got_loc, loc, rtol=1e-8)
    np.testing.assert_allclose(got_cov, [full[i * d:(i + 1) * d, i * d:(i + 1) * d] for i in range(3)], atol=1e-10)
    data = [jnp.asarray(v) for v in (pseudo.inputs, pseudo.mean, pseudo.noise)]
    exact = block_log_marginal_likelihood(params, *data, jnp.asarray(corr))
    np.testing.assert_allclose(exact, stats.multivariate_normal(np.zeros(m * d), a).logpdf(r), rtol=1e-10)
    # the diagonal search's objective: independent outputs with the blocks' diagonal noise
    diagonal = sum(stats.multivariate_normal(np.zeros(m), scaled[k, k] * _kernel(params, pseudo.inputs, pseudo.inputs)
                                             + np.diag(pseudo.noise[:, k, k])).logpdf(pseudo.mean[:, k] - params.mean[k])
                   for k in range(d))
    np.testing.assert_allclose(diagonal_log_marginal_likelihood(params, *data, jnp.asarray(corr)), diagonal, rtol=1e-8)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_many_draws_per_input_recover_the_true_class_probabilities():
    # 12 inputs, 300 draws of 3 categories each: each group's Dirichlet is sharp (sd of a
    # probability about 0.03), so the predicted class probabilities follow the truth
    rng = np.random.default_rng(3)
    grid = np.linspace(-2, 2, 12)
    logits = np.stack([np.sin(grid), np.cos(grid), 0 * grid], 1)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = np.concatenate([rng.choice(3, 300, p=row) for row in p])
    lm = LMGP("categorical").fit(np.repeat(grid, 300), y)
    pred = lm.predict(grid)
    assert pred.distribution.concentration.shape == (12, 3)
    assert np.max(np.abs(pred.expected - p)) < 0.1  # about 3.5 SDs of the worst group's multinomial error


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_many_vectors_per_group_recover_the_true_covariance():
    # 15 inputs, 200 vectors each of a 2 x 2 covariance whose correlation drifts: the predicted
    # inverse Wishart's mean follows it (the entries' sampling sd with 200 vectors is about 0.1 x scale)
    rng = np.random.default_rng(4)
    grid = np.linspace(0, 3, 15)
    rho = 0.7 * np.sin(grid)
    cov = np.stack([np.array([[1.0, r], [r, 1.0]]) for r in rho])
    r = np.concatenate([rng.multivariate_normal(np.zeros(2), c, 200) for c in cov])
    lm = LMGP("covariance").fit(np.repeat(grid, 200), r)
    pred = lm.predict(grid)
    assert pred.expected.shape == (15, 2, 2)
    assert np.max(np.abs(pred.expected - cov)) < 0.2  # 2 sampling SDs of one group; the GP pools groups


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="binary", output_kernel=np.eye(1)), "output_kernel is for the kinds"),
    (dict(kind="categorical", output_kernel=np.ones((2, 2))), "symmetric positive definite"),
    (dict(kind="categorical", search="grid"), "search must be one of"),
])
def test_bad_block_options_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LMGP(**kwargs).fit(np.arange(6.0), np.array([0, 1, 2, 0, 1, 2]))


# ------------------------------------------------------------ the NumPyro component


@X64
@pytest.mark.parametrize("kind, y", [("counts", np.array([3, 0, 2, 5, 1, 4])), ("categorical", np.array([0, 1, 2, 0, 1, 2]))])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_collapsed_model_is_the_marginal_likelihood(kind, y):
    from numpyro.infer.util import log_density

    pseudo = pseudo_observations(np.linspace(0, 2, 6), y.astype(float) if kind == "counts" else y, kind)
    block = kind in BLOCK_KINDS
    d = pseudo.mean.shape[-1] if block else None
    amplitude = np.array([1.3, 0.7]) if block else np.array(1.3)
    mean = np.array([0.2, -0.1]) if block else np.array(0.4)
    values = {"amplitude": amplitude, "lengthscale": np.array([0.8]), "mean": mean}
    params = KernelParams(jnp.log(amplitude), jnp.log(jnp.array([0.8])), jnp.asarray(mean))
    data = [jnp.asarray(v) for v in (pseudo.inputs, pseudo.mean, pseudo.noise)]
    expected = (block_log_marginal_likelihood(params, *data, jnp.eye(d)) if block
                else log_marginal_likelihood(params, *data))
    _, trace = log_density(lm_gp_model, (pseudo,), {}, values)
    np.testing.assert_allclose(trace["pseudo"]["fn"].log_prob(trace["pseudo"]["value"]), expected, rtol=1e-8)


@X64
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_pseudo_likelihood_site_is_the_groups_gaussians():
    import numpyro
    from numpyro.infer.util import log_density

    pseudo = pseudo_observations(np.arange(3.0), np.array([0, 2, 1]), "categorical", num_classes=3)
    f = np.zeros((3, 2))

    def model():
        pseudo_likelihood("y", pseudo, f)

    _, trace = log_density(model, (), {}, {})
    expected = sum(stats.multivariate_normal(f[g], pseudo.noise[g]).logpdf(pseudo.mean[g]) for g in range(3))
    np.testing.assert_allclose(np.sum(trace["y"]["fn"].log_prob(trace["y"]["value"])), expected, rtol=1e-10)
    with pytest.raises(ValueError, match="f must end in the pseudo-observations' shape"):
        numpyro.handlers.seed(lambda: pseudo_likelihood("y", pseudo, np.zeros(3)), 0)()


@pytest.mark.slow
def test_hyperparameter_draws_average_into_one_prediction():
    # two identical draws predict what one does; the mixture of two different draws has at least
    # the variance of its components' mean (law of total variance)
    pseudo = pseudo_observations(np.linspace(0, 3, 8), np.array([0, 1, 1, 3, 2, 5, 4, 6.0]), "counts")
    one = {"amplitude": np.array([1.0]), "lengthscale": np.array([[1.0]]), "mean": np.array([1.0])}
    twice = {k: np.concatenate([v, v]) for k, v in one.items()}
    test = np.array([0.5, 2.0])
    np.testing.assert_allclose(predict_with_draws(twice, pseudo, test)[1], predict_with_draws(one, pseudo, test)[1],
                               rtol=1e-5)
    mixed = {"amplitude": np.array([1.0, 2.0]), "lengthscale": np.array([[1.0], [0.3]]), "mean": np.array([1.0, 0.0])}
    mean, var = predict_with_draws(mixed, pseudo, test)
    parts = [predict_with_draws({k: v[i:i + 1] for k, v in mixed.items()}, pseudo, test) for i in range(2)]
    np.testing.assert_allclose(mean, (parts[0][0] + parts[1][0]) / 2, rtol=1e-5)
    assert np.all(var >= (parts[0][1] + parts[1][1]) / 2 - 1e-6)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_relabelling_the_classes_permutes_the_predicted_probabilities():
    # the prior over the zero-sum logits is exchangeable across classes (one amplitude for the
    # arbitrary orthonormal coordinates), so a permutation of the labels permutes the prediction
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (60, 2))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int) + (x[:, 0] > 1).astype(int)
    perm = np.array([2, 0, 3, 1])
    test = rng.uniform(-2, 2, (10, 2))
    p = LMGP("categorical", num_steps=100).fit(x, y).predict(test).expected
    q = LMGP("categorical", num_steps=100).fit(x, perm[y]).predict(test).expected
    np.testing.assert_allclose(q[:, perm], p, atol=0.02)  # float32 Adam paths differ slightly


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_constant_input_dimension_is_ignored_not_fatal():
    # a pixel that is 0 in every training image must not make a test image with ink there
    # uncorrelated with everything (a lengthscale of 1e-6 did: every prediction at the prior mean)
    x = np.stack([np.linspace(-2, 2, 30), np.zeros(30)], 1)
    y = (x[:, 0] > 0).astype(float)
    lm = LMGP("binary").fit(x, y)
    shifted = lm.predict(np.array([[1.5, 1.0], [-1.5, 1.0]])).expected
    np.testing.assert_allclose(shifted, lm.predict(np.array([[1.5, 0.0], [-1.5, 0.0]])).expected, atol=0.01)
    assert shifted[0] > 0.8 and shifted[1] < 0.2


# ------------------------------------------------------------ the leave-one-out search


@X64
def test_leave_one_out_is_conditioning_on_the_other_groups():
    # the block identity against the Gaussian conditional of each group given all the others
    rng = np.random.default_rng(5)
    m, d = 6, 2
    root = rng.normal(size=(m * d, m * d))
    noise = np.stack([np.eye(d) * 0.3 + 0.1 for _ in range(m)])
    a = root @ root.T / (m * d) + np.eye(m * d)
    for g in range(m):
        a[g * d:(g + 1) * d, g * d:(g + 1) * d] += noise[g]
    r = rng.normal(size=(m, d))
    offset, cov = leave_one_out(jnp.asarray(a), jnp.asarray(r), jnp.asarray(noise))
    for g in range(m):
        mine = np.arange(g * d, (g + 1) * d)
        rest = np.setdiff1d(np.arange(m * d), mine)
        gain = np.linalg.solve(a[np.ix_(rest, rest)], a[np.ix_(rest, mine)]).T
        np.testing.assert_allclose(r[g] + offset[g], gain @ r.ravel()[rest], rtol=1e-8)
        conditional = a[np.ix_(mine, mine)] - gain @ a[np.ix_(rest, mine)]
        np.testing.assert_allclose(cov[g], conditional - noise[g], rtol=1e-8, atol=1e-12)


@X64
def test_the_compound_predictives_are_the_closed_forms():
    # one label: the matched family's mean probability of it; one count: the negative binomial
    # (less log y!); a sequence of categories: the chain of Polya-urn predictives
    a, b = jnp.asarray([2.0, 0.5]), jnp.asarray([1.0, 3.0])
    got = log_compound("binary", {"concentration1": a, "concentration0": b}, jnp.asarray([[1.0, 0.0], [0.0, 1.0]]))
    np.testing.assert_allclose(got, np.log([2.0 / 3.0, 3.0 / 3.5]), rtol=1e-12)
    y = np.array([4.0, 0.0])
    got = log_compound("counts", {"concentration": a, "rate": b}, jnp.stack([jnp.asarray(y), jnp.ones(2)], -1))
    want = stats.nbinom.logpmf(y, np.asarray(a), np.asarray(b) / (np.asarray(b) + 1)) + np.log([24.0, 1.0])
    np.testing.assert_allclose(got, want, rtol=1e-10)
    alpha, sequence = np.array([0.5, 1.5, 2.0]), [0, 2, 2, 1, 0]
    chain, seen = 0.0, np.zeros(3)
    for t, k in enumerate(sequence):
        chain += np.log((alpha[k] + seen[k]) / (alpha.sum() + t))
        seen[k] += 1
    got = log_compound("categorical", {"concentration": jnp.asarray(alpha)[None]}, jnp.asarray(seen)[None])
    np.testing.assert_allclose(got, [chain], rtol=1e-12)


@X64
@pytest.mark.parametrize("kind, y, labels", [
    ("binary", np.array([0, 1, 1, 0, 1, 1, 0, 0, 1, 0]), np.arange(10)),
    ("counts", np.array([3, 0, 2, 5, 1, 4, 2, 2, 7, 1]), np.arange(10) // 2),
    ("categorical", np.array([0, 1, 2, 0, 1, 2, 2, 2, 1, 0]), np.arange(10)),
])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_loo_objective_sums_fits_without_each_group(kind, y, labels):
    # brute force: drop each group, predict it with the GP at the same hyperparameters, map to
    # the matched family and score the group's data
    x = np.linspace(-2, 2, 10)
    pseudo = pseudo_observations(x, y, kind, labels)
    d = pseudo.mean.shape[1] if pseudo.mean.ndim == 2 else None
    params = KernelParams(jnp.asarray([0.4] if d else 0.4), jnp.asarray([0.2]),
                          jnp.asarray(np.full(d, 0.1) if d else -0.3))
    family = get_family(*DATA_KINDS[kind])
    stats_ = group_statistics(pseudo)
    total = 0.0
    for g in range(len(pseudo.size)):
        keep = np.arange(len(pseudo.size)) != g
        rest = pseudo._replace(inputs=pseudo.inputs[keep], mean=pseudo.mean[keep], noise=pseudo.noise[keep])
        mean, var = predictive(params, rest, pseudo.inputs[g:g + 1])
        total += float(log_compound(kind, family.from_gaussian(mean, var), jnp.asarray(stats_[g:g + 1]))[0])
    data = [jnp.asarray(v) for v in (pseudo.inputs, pseudo.mean, pseudo.noise, stats_)]
    got = loo_log_predictive[kind](params, *data, jnp.eye(d) if d else jnp.zeros(()))
    np.testing.assert_allclose(got, total, rtol=1e-6)  # the variance floor (1e-6) is far below these variances


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_loo_search_beats_the_evidence_on_single_labels():
    # 60 single noisy labels of a smooth probability over 3 inputs: the evidence of their
    # pseudo-observations (noise about 1/eps = 100 each) picks a small amplitude, the
    # probabilities stay near 1/2 and the classifier near chance (measured: log loss 0.67,
    # accuracy 0.55); the leave-one-out search scores the labels themselves (0.53, 0.78). On
    # 400 fresh labels the log losses' Monte Carlo SD is about 0.03, their difference's less
    rng = np.random.default_rng(1)
    w = rng.normal(size=3)
    truth = lambda x: 1 / (1 + np.exp(-3 * np.sin(x @ w)))  # noqa: E731
    x, xt = rng.uniform(-1.5, 1.5, (60, 3)), rng.uniform(-1.5, 1.5, (400, 3))
    y, yt = (rng.uniform(size=60) < truth(x)).astype(float), (rng.uniform(size=400) < truth(xt)).astype(float)
    scores = {}
    for search in ("loo", "exact"):
        p = np.clip(LMGP("binary", search=search, newton_steps=0).fit(x, y, np.arange(60)).predict(xt).expected,
                    1e-6, 1 - 1e-6)
        scores[search] = (-np.mean(yt * np.log(p) + (1 - yt) * np.log(1 - p)), np.mean((p > 0.5) == yt))
    assert scores["loo"][0] < scores["exact"][0] - 0.06
    assert scores["loo"][1] > scores["exact"][1] + 0.1


def test_loo_is_refused_for_covariances_by_name():
    with pytest.raises(ValueError, match="search must be one of"):
        LMGP("covariance", search="loo")


# ------------------------------------------------------------ Newton steps from the sites


@X64
@pytest.mark.parametrize("kind, y, labels", [
    ("binary", np.array([0, 1, 1, 0, 1, 1]), np.arange(6) // 2),
    ("counts", np.array([3, 0, 2, 5, 1, 4]), np.arange(6) // 2),
    ("categorical", np.array([0, 1, 2, 0, 1, 2]), np.arange(6) // 2),
    pytest.param("covariance", np.random.default_rng(7).normal(size=(6, 2)), np.arange(6) // 3,
                 marks=pytest.mark.slow),  # 14 s on one core: runs where CI=true
])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_site_expanded_at_its_own_mode_is_laplace_matching(kind, y, labels):
    pseudo = pseudo_observations(np.arange(6.0), y, kind, labels)
    params = {k: jnp.asarray(v) for k, v in pseudo.params.items()}
    mean, noise = relinearised_sites(kind, params, jnp.asarray(pseudo.mean))
    np.testing.assert_allclose(mean, pseudo.mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(noise, pseudo.noise, rtol=1e-7, atol=1e-10)


def _joint_log_posterior(kind, params, pseudo, f):
    # log N(f; m, K (x) B~) + sum_g l_g(f_g), with f stacked group-major
    from numpyro_lm.contrib.gp.blocks import _parts

    x = jnp.asarray(pseudo.inputs)
    if pseudo.mean.ndim == 1:
        prior = rbf_kernel(params)(x, x)
        centred = f - params.mean
    else:
        unit, scaled = _parts(params, jnp.eye(pseudo.mean.shape[1]), rbf_kernel)
        prior = jnp.kron(unit(x, x), scaled)
        centred = (f - params.mean).reshape(-1)
    group = {k: jnp.asarray(v) for k, v in pseudo.params.items()}
    likelihood = jnp.sum(jax.vmap(lambda p, v: site_log_likelihood(kind, p, v))(group, f))
    return -0.5 * centred @ jnp.linalg.solve(prior, centred) + likelihood


@X64
@pytest.mark.parametrize("kind, y", [
    ("binary", np.array([0, 1, 1, 0, 1, 1, 0, 0])),
    ("counts", np.array([3, 0, 2, 5, 1, 4, 0, 7])),
    ("categorical", np.array([0, 1, 2, 0, 1, 2, 2, 1])),
])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_newton_steps_reach_the_latent_gps_mode(kind, y):
    # the fixed point: the gradient of the joint log posterior of the latent values vanishes at
    # the GP's posterior mean on the re-expanded sites
    x = np.linspace(-2, 2, 8)
    pseudo = pseudo_observations(x, y, kind, np.arange(8))
    d = pseudo.mean.shape[1] if pseudo.mean.ndim == 2 else None
    params = KernelParams(jnp.asarray([0.5] if d else 0.5), jnp.asarray([0.0]),
                          jnp.asarray(np.zeros(d) if d else 0.2))
    sites, change = relinearise(pseudo, params, num_steps=20)
    assert change[-1] < 1e-10
    f = posterior_mean_at_groups(params, jnp.asarray(pseudo.inputs), jnp.asarray(sites.mean), jnp.asarray(sites.noise),
                                 jnp.eye(d) if d else jnp.zeros(()), rbf_kernel)
    grad = jax.grad(lambda v: _joint_log_posterior(kind, params, pseudo, v))(f)
    assert np.max(np.abs(grad)) < 1e-8
    # and Laplace Matching's own sites are not there: the steps did something
    start = posterior_mean_at_groups(params, jnp.asarray(pseudo.inputs), jnp.asarray(pseudo.mean),
                                     jnp.asarray(pseudo.noise), jnp.eye(d) if d else jnp.zeros(()), rbf_kernel)
    assert np.max(np.abs(jax.grad(lambda v: _joint_log_posterior(kind, params, pseudo, v))(start))) > 1e-2


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_newton_steps_remove_the_pooled_bias_of_single_counts():
    # 400 single Poisson counts of a smooth rate: each site sits at log(y + eps), biased low for
    # small counts, and the GP pools that bias (measured: RMSE 0.65 of the rate, 28 % of the
    # grid's true rates inside the central 95 % interval); at the Laplace GP's mode the bias is
    # gone (measured: RMSE 0.13, 100 %: the 100 grid points are strongly correlated, so the
    # share moves in large jumps and only its side of 0.8 is asserted)
    rng = np.random.default_rng(8)
    rate = lambda x: np.exp(0.5 + np.sin(2 * x))  # noqa: E731
    x, grid = np.sort(rng.uniform(-3, 3, 400)), np.linspace(-2.8, 2.8, 100)
    y = rng.poisson(rate(x)).astype(float)
    scores = {}
    for steps in (0, 10):
        pred = LMGP("counts", newton_steps=steps).fit(x, y, np.arange(400)).predict(grid)
        low, high = (stats.gamma.ppf(q, np.asarray(pred.distribution.concentration),
                                     scale=1 / np.asarray(pred.distribution.rate)) for q in (0.025, 0.975))
        truth = rate(grid)
        scores[steps] = (np.sqrt(np.mean((pred.expected - truth) ** 2)), np.mean((truth > low) & (truth < high)))
    assert scores[10][0] < 0.5 * scores[0][0]
    assert scores[10][1] > 0.8 > scores[0][1]


@pytest.mark.parametrize("kind, y, labels, expected", [
    ("binary", np.array([0, 1, 1, 0, 1, 0]), np.arange(6), ("loo", 0)),
    ("binary", np.array([0, 1, 1, 0, 1, 0]), np.arange(6) // 2, ("exact", 10)),
    ("categorical", np.array([0, 1, 2, 0, 1, 2]), np.arange(6), ("loo", 0)),
    ("counts", np.array([3, 0, 2, 5, 1, 4]), np.arange(6), ("exact", 10)),
    ("covariance", np.random.default_rng(9).normal(size=(6, 2)), np.arange(6) // 3, ("diagonal", 10)),
])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_default_choices_follow_the_kind_and_the_groups(kind, y, labels, expected):
    pseudo = pseudo_observations(np.arange(6.0), y, kind, labels)
    assert tuple(default_choices(pseudo)) == expected
    assert default_choices(pseudo, search="exact").newton_steps == 10  # Newton steps follow the search
    assert default_choices(pseudo, newton_steps=3).newton_steps == 3
