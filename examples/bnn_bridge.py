"""
The Laplace Bridge on a small neural network (thesis chapter 4).
================================================================

An MLP 64-32-10 trained with optax on scikit-learn's digits; ``LastLayerLaplace`` puts a
Gaussian over its last layer (Kronecker-factored curvature, prior precision by marginal
likelihood), and each test image's Gaussian over the logits maps in closed form to a
Dirichlet over the class probabilities. Printed: accuracy and calibration of the MAP, the
bridge, the extended probit and MC(1000), the time per prediction of each, and the
uncertainty-aware top-k lists (thesis Algorithm 4) of the least certain images.

Needs scikit-learn for the data (``pip install -e ".[data]"``). Run with
``.venv/bin/python examples/bnn_bridge.py`` (about 15 s on 2 cores).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

from numpyro_lm.contrib.bridge import uncertainty_aware_top_k
from numpyro_lm.contrib.nn import LastLayerLaplace, metrics

data = load_digits()
order = np.random.default_rng(0).permutation(len(data.target))
x, y = data.data[order] / 16.0, data.target[order]
x_train, y_train, x_test, y_test = x[:1257], y[:1257], x[1257:], y[1257:]

# the network: tanh features, then a linear last layer; trained to its MAP by Adam
params = {"w1": jax.random.normal(jax.random.PRNGKey(0), (64, 32)) / 8.0, "b1": jnp.zeros(32),
          "w2": jax.random.normal(jax.random.PRNGKey(1), (32, 10)) / 6.0, "b2": jnp.zeros(10)}


def features(p, inputs):
    return jnp.tanh(jnp.asarray(inputs, jnp.float32) @ p["w1"] + p["b1"])


def loss(p):
    logits = features(p, x_train) @ p["w2"] + p["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.asarray(y_train)[:, None], 1))


optimiser = optax.adamw(1e-2, weight_decay=1e-4)
state = optimiser.init(params)
step = jax.jit(lambda p, s: (lambda g: optimiser.update(g, s, p))(jax.grad(loss)(p)))
for _ in range(2000):
    updates, state = step(params, state)
    params = optax.apply_updates(params, updates)

lll = LastLayerLaplace(lambda inputs: features(params, inputs), params["w2"], params["b2"]).fit(x_train, y_train)
print(f"prior precision by marginal likelihood: {float(lll.posterior.prior_precision):.3g}")
map_p = np.asarray(jax.nn.softmax(features(params, x_test) @ params["w2"] + params["b2"]))
print(f"{'predictive':>16}  accuracy    NLL    ECE  us/prediction")
print(f"{'MAP':>16}  {np.mean(map_p.argmax(1) == y_test):8.3f} {metrics.nll(map_p, y_test):6.3f} "
      f"{metrics.ece(map_p, y_test):6.3f}")
for method in ("bridge_zero_sum", "lb_norm", "probit", "mc"):
    predict = jax.jit(lambda inputs, m=method: lll.predict(inputs, m, rng_key=jax.random.PRNGKey(0)).probabilities)
    jax.block_until_ready(predict(x_test))
    start = time.perf_counter()
    p = np.asarray(jax.block_until_ready(predict(x_test)))
    us = 1e6 * (time.perf_counter() - start) / len(x_test)
    print(f"{method:>16}  {np.mean(p.argmax(1) == y_test):8.3f} {metrics.nll(p, y_test):6.3f} "
          f"{metrics.ece(p, y_test):6.3f} {us:10.2f}")

# uncertainty-aware top-k on the bridge's Dirichlets: the three least certain test images
bridge = lll.predict(x_test)
lists = np.asarray(uncertainty_aware_top_k(bridge.concentration))
# the Beta marginals behind the lists are as good as the Dirichlet is true to the logit Gaussian
print(f"bridge spread factor (1: Dirichlet-shaped logit Gaussian; trust the marginals below 2): median "
      f"{float(np.median(bridge.spread_factor)):.2f}, share below 2: {float(np.mean(bridge.spread_factor < 2)):.2f}")
for i in np.argsort(np.asarray(bridge.probabilities).max(1))[:3]:
    print(f"image {i} (label {y_test[i]}): top-k list {np.flatnonzero(lists[i]).tolist()}, "
          f"Dirichlet {np.round(np.asarray(bridge.concentration[i]), 1).tolist()}")
