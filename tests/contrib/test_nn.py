"""The Laplace Bridge for neural networks (numpyro_lm/contrib/nn/): last-layer curvature, logit Gaussians,
the prior precision, predictives and metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from numpyro_lm.contrib.nn import LastLayerLaplace, class_probabilities, curvature, fit_last_layer, log_evidence, logit_gaussian
from numpyro_lm.contrib.nn import metrics
from numpyro_lm.contrib.nn.last_layer import PRIOR_GRID, augment

X64 = pytest.mark.usefixtures("x64")  # identities compared to 1e-8


def _problem(n=40, d=3, k=4, seed=0):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, d))
    weight, bias = rng.normal(size=(d, k)), rng.normal(size=k)
    labels = rng.integers(0, k, n)
    return jnp.asarray(features), jnp.asarray(labels), jnp.asarray(weight), jnp.asarray(bias)


def _dense_hessian(curv, d, k):
    """The structured curvature as a dense P x P matrix."""
    if curv.structure == "full":
        return (curv.vectors * curv.values) @ curv.vectors.T
    if curv.structure == "kron":
        (a, g), (ua, ug) = curv.values, curv.vectors
        return jnp.kron((ua * a) @ ua.T, (ug * g) @ ug.T)
    return jnp.diag(curv.values.reshape(-1))


@X64
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_full_curvature_is_the_exact_hessian_of_the_last_layer():
    # the logits are linear in the last layer, so the GGN is the Hessian of the cross-entropy
    features, labels, weight, bias = _problem()
    phi = augment(features)
    w = jnp.concatenate([weight, bias[None]], 0)

    def nll(theta):
        logits = phi @ theta.reshape(w.shape)
        return -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[:, None], 1))

    exact = jax.hessian(nll)(w.reshape(-1))
    np.testing.assert_allclose(_dense_hessian(curvature(phi, w, "full"), *w.shape), exact, atol=1e-10)
    # the diagonal structure is its diagonal
    np.testing.assert_allclose(curvature(phi, w, "diag").values.reshape(-1), jnp.diag(exact), atol=1e-10)


@X64
def test_the_kronecker_curvature_is_exact_when_every_input_has_the_same_probabilities():
    features, labels, weight, _ = _problem()
    w = jnp.concatenate([jnp.zeros_like(weight), jnp.zeros((1, weight.shape[1]))], 0)  # uniform p everywhere
    phi = augment(features)
    np.testing.assert_allclose(_dense_hessian(curvature(phi, w, "kron"), *w.shape),
                               _dense_hessian(curvature(phi, w, "full"), *w.shape), atol=1e-10)


@X64
@pytest.mark.parametrize("structure", ["full", "kron", "diag"])
def test_the_logit_gaussian_is_the_jacobian_sandwich(structure):
    features, labels, weight, bias = _problem()
    post = fit_last_layer(features, labels, weight, bias, structure=structure, prior_precision=0.7)
    d, k = post.weights.shape
    sigma = jnp.linalg.inv(_dense_hessian(post.curvature, d, k) + 0.7 * jnp.eye(d * k))
    test = jnp.asarray(np.random.default_rng(1).normal(size=(5, features.shape[1])))
    jac = jnp.einsum("nd,kl->nkdl", augment(test), jnp.eye(k)).reshape(5, k, d * k)  # J = phi' (x) I_K
    mean, cov = logit_gaussian(post, test)
    np.testing.assert_allclose(mean, test @ weight + bias, rtol=1e-10)
    np.testing.assert_allclose(cov, jac @ sigma @ jac.transpose(0, 2, 1), rtol=1e-8, atol=1e-12)


@X64
@pytest.mark.parametrize("structure", ["full", "kron", "diag"])
def test_the_prior_precision_maximises_the_laplace_evidence(structure):
    features, labels, weight, bias = _problem(n=60)
    post = fit_last_layer(features, labels, weight, bias, structure=structure)
    phi = augment(features)
    d, k = post.weights.shape
    h = _dense_hessian(post.curvature, d, k)

    def dense(lam):  # log p(y|w) - lam/2 |w|^2 + P/2 log lam - 1/2 log|H + lam I|
        logits = phi @ post.weights
        log_lik = jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[:, None], 1))
        return (log_lik - 0.5 * lam * jnp.sum(post.weights**2) + 0.5 * d * k * jnp.log(lam)
                - 0.5 * jnp.linalg.slogdet(h + lam * jnp.eye(d * k))[1])

    for lam in (0.01, 1.0, 30.0):
        np.testing.assert_allclose(log_evidence(phi, labels, post.weights, post.curvature, lam), dense(lam), rtol=1e-10)
    best = float(post.prior_precision)
    assert best in PRIOR_GRID
    assert all(dense(best) >= dense(lam) for lam in PRIOR_GRID[::20])


def test_bad_shapes_are_refused_by_name():
    features, labels, weight, bias = _problem()
    with pytest.raises(ValueError, match="pass its transpose"):
        fit_last_layer(features, labels, weight.T, bias)
    with pytest.raises(ValueError, match="bias must be"):
        fit_last_layer(features, labels, weight, bias[:2])
    with pytest.raises(ValueError, match="labels must be"):
        fit_last_layer(features, labels.astype(float), weight, bias)
    with pytest.raises(ValueError, match="class indices 0..3"):
        fit_last_layer(features, labels.at[0].set(4), weight, bias)
    with pytest.raises(ValueError, match="features hold 1 values that are not finite"):
        fit_last_layer(features.at[2, 1].set(jnp.nan), labels, weight, bias)
    with pytest.raises(ValueError, match="structure must be"):
        LastLayerLaplace(lambda x: x, weight, bias, structure="block")
    with pytest.raises(RuntimeError, match="fit"):
        LastLayerLaplace(lambda x: x, weight, bias).predict(features)
    fitted = LastLayerLaplace(lambda x: x, weight, bias).fit(features, labels)
    with pytest.raises(ValueError, match="not finite"):
        fitted.predict(features.at[0, 0].set(jnp.inf))


# ------------------------------------------------------------------ predictives


@X64
def test_the_probit_predictive_is_its_formula_and_mc_is_the_expectation():
    mean = jnp.asarray([[0.5, -0.3]])
    cov = jnp.asarray([[[1.0, 0.3], [0.3, 0.5]]])
    probit = class_probabilities(mean, cov, "probit").probabilities
    scaled = mean / jnp.sqrt(1 + jnp.pi / 8 * jnp.asarray([1.0, 0.5]))
    np.testing.assert_allclose(probit, jax.nn.softmax(scaled, -1), rtol=1e-12)
    # two classes: p_0 = E sigmoid(z0 - z1), z0 - z1 ~ N(0.8, 1.0 + 0.5 - 0.6), by Gauss-Hermite
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    exact = np.sum(weights * special.expit(0.8 + np.sqrt(0.9) * nodes)) / np.sqrt(2 * np.pi)
    mc = class_probabilities(mean, cov, "mc", num_samples=40_000, rng_key=jax.random.PRNGKey(0)).probabilities
    assert abs(float(mc[0, 0]) - exact) < 4 * 0.2 / np.sqrt(40_000)  # 4 SE; sd of sigmoid below 0.2


@X64
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_bridges_agree_on_a_zero_sum_gaussian_and_lb_norm_scales_by_sum_or_mean():
    rng = np.random.default_rng(3)
    root = rng.normal(size=(3, 3))
    centre = np.eye(3) - 1 / 3
    cov = jnp.asarray(centre @ (root @ root.T + np.eye(3)) @ centre)[None]
    mean = jnp.asarray(centre @ rng.normal(size=3))[None]
    plain = class_probabilities(mean, cov, "bridge")
    zero_sum = class_probabilities(mean, cov, "bridge_zero_sum")
    np.testing.assert_allclose(plain.concentration, zero_sum.concentration, rtol=1e-8)
    np.testing.assert_allclose(plain.probabilities.sum(-1), 1.0, rtol=1e-12)
    # LB-norm: c = reduce(diag)/sqrt(K/2), alpha scales by c and mu by 1/sqrt(c)
    var = np.diag(np.asarray(cov[0]))
    for method, c in (("lb_norm", var.mean() / np.sqrt(1.5)), ("lb_norm_sum", var.sum() / np.sqrt(1.5))):
        alpha = class_probabilities(mean, cov, method).concentration
        want = class_probabilities(mean / np.sqrt(c), cov / c, "bridge").concentration
        np.testing.assert_allclose(alpha, want, rtol=1e-8)


def test_unknown_predictives_and_mc_without_a_key_are_refused():
    with pytest.raises(ValueError, match="method must be one of"):
        class_probabilities(jnp.zeros((1, 3)), jnp.ones((1, 3)), "laplace")
    with pytest.raises(ValueError, match="rng_key"):
        class_probabilities(jnp.zeros((1, 3)), jnp.ones((1, 3)), "mc")


# ------------------------------------------------------------------ metrics


def test_the_metrics_are_their_closed_forms():
    p = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    y = np.array([0, 1, 1, 1])
    np.testing.assert_allclose(metrics.nll(p, y), -np.mean(np.log([0.9, 0.8, 0.4, 0.7])))
    np.testing.assert_allclose(metrics.brier(p, y), np.mean([0.02, 0.08, 0.72, 0.18]))
    # ECE, 10 bins: confidences 0.9, 0.8, 0.6, 0.7 each alone in a bin, correct 1, 1, 0, 1
    np.testing.assert_allclose(metrics.ece(p, y), np.mean([0.1, 0.2, 0.6, 0.3]))


def test_auroc_is_the_share_of_correctly_ordered_pairs():
    rng = np.random.default_rng(4)
    a, b = rng.normal(1.0, 1.0, 50).round(1), rng.normal(0.0, 1.0, 40).round(1)  # rounded: ties
    pairs = np.mean((a[:, None] > b[None, :]) + 0.5 * (a[:, None] == b[None, :]))
    np.testing.assert_allclose(metrics.auroc(a, b), pairs, rtol=1e-12)
    assert metrics.auroc([2, 3], [0, 1]) == 1.0 and metrics.auroc([0, 1], [2, 3]) == 0.0


# ------------------------------------------------------------------ end to end


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_last_layer_laplace_on_a_trained_softmax_regression():
    # features tanh(x A) of three separated blobs, the last layer trained by gradient descent:
    # the bridge's probabilities follow the MAP's, more so where the data are, and the OOD
    # inputs far from the blobs get lower confidence than the test inputs
    rng = np.random.default_rng(5)
    centres = np.array([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    y = rng.integers(0, 3, 300)
    x = centres[y] + 0.5 * rng.normal(size=(300, 2))
    proj = jnp.asarray(rng.normal(size=(2, 8)))
    feature_fn = lambda inputs: jnp.tanh(jnp.asarray(inputs, jnp.float32) @ proj)  # noqa: E731
    w, b = jnp.zeros((8, 3)), jnp.zeros(3)

    def loss(params):
        logits = feature_fn(x) @ params[0] + params[1]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.asarray(y)[:, None], 1)) \
            + 1e-3 * jnp.sum(params[0] ** 2)

    params = (w, b)
    for _ in range(300):
        grads = jax.grad(loss)(params)
        params = tuple(p - 0.5 * g for p, g in zip(params, grads))
    lll = LastLayerLaplace(feature_fn, *params).fit(x, y)
    test_y = rng.integers(0, 3, 200)
    test_x = centres[test_y] + 0.5 * rng.normal(size=(200, 2))
    pred = lll.predict(test_x)
    assert pred.probabilities.shape == (200, 3) and pred.concentration.shape == (200, 3)
    assert float(np.mean(np.argmax(pred.probabilities, 1) == test_y)) > 0.9
    far = rng.normal(size=(200, 2)) * 0.3 + np.array([6.0, 6.0])
    ood = lll.predict(far)
    assert metrics.auroc(metrics.confidence(pred.probabilities), metrics.confidence(ood.probabilities)) > 0.7


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_bridge_stays_finite_where_the_logits_are_far_apart():
    # a ReLU network far from its data: logits 200 apart overflow exp() in float32; the class
    # probabilities come from log alpha and stay finite (the top class's probability 1)
    mean = jnp.asarray([[150.0, -50.0], [120.0, 0.0]], jnp.float32)
    var = jnp.asarray([[4.0, 4.0], [1.0, 2.0]], jnp.float32)
    for method in ("bridge", "bridge_zero_sum", "lb_norm"):
        p = class_probabilities(mean, var, method).probabilities
        assert np.all(np.isfinite(p)), method
        np.testing.assert_allclose(p[:, 0], 1.0, atol=1e-6)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_an_equinox_network_plugs_in_by_its_feature_layers_and_last_linear():
    # an equinox MLP: its hidden layers are the feature function, its last Linear the last
    # layer (equinox stores the weight (K, D): pass the transpose); the logit mean is the
    # network's own output
    import equinox as eqx  # installed with tinygp, a core dependency: no skip

    net = eqx.nn.MLP(4, 3, width_size=8, depth=2, activation=jnp.tanh, key=jax.random.PRNGKey(0))

    def feature_fn(x):
        def one(v):
            for layer in net.layers[:-1]:
                v = net.activation(layer(v))
            return v
        return jax.vmap(one)(jnp.asarray(x, jnp.float32))

    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(50, 4)), rng.integers(0, 3, 50)
    last = net.layers[-1]
    lll = LastLayerLaplace(feature_fn, last.weight.T, last.bias).fit(x, y)
    mean, cov = lll.logits(x[:5])
    np.testing.assert_allclose(mean, jax.vmap(net)(jnp.asarray(x[:5], jnp.float32)), rtol=1e-5, atol=1e-6)
    assert cov.shape == (5, 3, 3) and np.all(np.linalg.eigvalsh(np.asarray(cov, np.float64)) > 0)
    with pytest.raises(ValueError, match="pass its transpose"):
        LastLayerLaplace(feature_fn, last.weight, last.bias).fit(x, y)
