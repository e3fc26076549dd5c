r"""PIHAM (Contisciani, Hobbhahn, Power, Hennig and De Bacco 2024; thesis chapter 5): a
probabilistic model of attributed multilayer networks whose latent variables are all Gaussian.

Nodes ``i = 1..N`` have out- and in-going community memberships ``U_i, V_i in R^K``
(undirected: ``V = U``); each layer ``l`` an affinity ``W^l in R^{K x K}``; each attribute
``x`` a community loading ``H_x`` (``K x Z`` for a categorical attribute, ``K`` otherwise).
All have ``N(0, 1)`` priors (thesis C.2). With ``f`` the row softmax and ``g`` the link of the
data type (logistic for Bernoulli, ``exp`` for Poisson, identity for Gaussian, softmax over
categories for categorical; thesis Table 5.1)

.. math:: \lambda^l_{ij} = f(U_i)^\top g(W^l) f(V_j), \qquad
          \pi_{ix} = \tfrac12 (f(U_i) + f(V_i))^\top g(H_x)

(eqs. 5.6-5.7, C.1) are the means of ``A^l_ij`` (Bernoulli / Poisson / ``N(., sigma^2)``) and
of ``X_ix`` (categorical / Poisson / ``N(., sigma^2)``). Self-loops are not modelled; held-out
entries are masked out of the likelihood.

:func:`piham_model` is the NumPyro model (for NUTS or the generic ``LaplaceMatching``);
:func:`log_joint` is the same density as a pure function of a parameter dict, and
:func:`node_log_density` is the part of it that involves one node's membership, whose
Hessian is that node's exact ``K x K`` block of the joint Hessian at ``O(N K^2)`` cost.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = ["Network", "LAYER_KINDS", "ATTRIBUTE_KINDS", "piham_model", "log_joint", "node_log_density",
           "edge_means", "attribute_means", "check_network"]

LAYER_KINDS = ("bernoulli", "poisson", "gaussian")
ATTRIBUTE_KINDS = ("categorical", "poisson", "gaussian")


class Network(NamedTuple):
    """An attributed multilayer network.

    ``layers``: ``L`` arrays ``(N, N)`` (``A[i, j]``: from ``i`` to ``j``) of kinds
    ``layer_kinds`` (:data:`LAYER_KINDS`); ``attributes``: ``P`` arrays ``(N,)`` of kinds
    ``attribute_kinds`` (:data:`ATTRIBUTE_KINDS`; categorical ones hold integers
    ``0..Z-1`` with ``Z`` in ``num_categories``, 0 for the others).
    """

    layers: tuple
    layer_kinds: tuple
    attributes: tuple = ()
    attribute_kinds: tuple = ()
    num_categories: tuple = ()


def check_network(network: Network) -> int:
    """Refuse a malformed network by name; return ``N``."""
    if len(network.layers) != len(network.layer_kinds) or not network.layers:
        raise ValueError(f"network: {len(network.layers)} layers but {len(network.layer_kinds)} layer_kinds; "
                         "give at least one layer and one kind per layer")
    n = np.shape(network.layers[0])[0]
    for l, (a, kind) in enumerate(zip(network.layers, network.layer_kinds)):
        a = np.asarray(a)
        if kind not in LAYER_KINDS:
            raise ValueError(f"layer {l}: kind {kind!r} is not one of {LAYER_KINDS}")
        if a.shape != (n, n):
            raise ValueError(f"layer {l}: shape {a.shape}, expected ({n}, {n}) like layer 0")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"layer {l}: holds values that are not finite")
        if kind == "bernoulli" and not np.all((a == 0) | (a == 1)):
            raise ValueError(f"layer {l}: a Bernoulli layer holds values other than 0 and 1")
        if kind == "poisson" and not (np.all(a >= 0) and np.all(a == np.round(a))):
            raise ValueError(f"layer {l}: a Poisson layer holds negative or non-integer values")
    if not (len(network.attributes) == len(network.attribute_kinds) == len(network.num_categories)):
        raise ValueError("network: attributes, attribute_kinds and num_categories must have one entry per attribute")
    for x, (values, kind, z) in enumerate(zip(network.attributes, network.attribute_kinds, network.num_categories)):
        values = np.asarray(values)
        if kind not in ATTRIBUTE_KINDS:
            raise ValueError(f"attribute {x}: kind {kind!r} is not one of {ATTRIBUTE_KINDS}")
        if values.shape != (n,):
            raise ValueError(f"attribute {x}: shape {values.shape}, expected ({n},)")
        if kind == "categorical" and (z < 2 or not np.all((values >= 0) & (values < z) & (values == np.round(values)))):
            raise ValueError(f"attribute {x}: categorical values must be integers in 0..{z - 1} with "
                             "num_categories >= 2")
        if kind == "poisson" and not (np.all(values >= 0) and np.all(values == np.round(values))):
            raise ValueError(f"attribute {x}: a Poisson attribute holds negative or non-integer values")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"attribute {x}: holds values that are not finite")
    return n


def _link(kind, w):
    if kind == "bernoulli":
        return jax.nn.sigmoid(w)
    if kind == "poisson":
        return jnp.exp(w)
    if kind == "categorical":
        return jax.nn.softmax(w, -1)
    return w


def _log_prob(kind, value, mean, noise_scale):
    """Log density of ``value`` given its mean ``mean`` (a probability vector for categorical)."""
    if kind == "bernoulli":
        mean = jnp.clip(mean, 1e-7, 1 - 1e-7)
        return value * jnp.log(mean) + (1 - value) * jnp.log1p(-mean)
    if kind == "poisson":
        return dist.Poisson(jnp.maximum(mean, 1e-30)).log_prob(value)
    if kind == "categorical":
        return jnp.log(jnp.maximum(jnp.take_along_axis(mean, value[..., None].astype(jnp.int32), -1)[..., 0], 1e-30))
    return dist.Normal(mean, noise_scale).log_prob(value)


def edge_means(params, network: Network, directed=True):
    """``lambda (L, N, N)``: eq. 5.6 at ``params``."""
    u = jax.nn.softmax(params["U"], -1)
    v = jax.nn.softmax(params["V"], -1) if directed else u
    return jnp.stack([u @ _link(kind, params["W"][l]) @ v.T for l, kind in enumerate(network.layer_kinds)])


def attribute_means(params, network: Network, directed=True):
    """Per attribute: ``pi`` ``(N, Z)`` for categorical, ``(N,)`` otherwise (eqs. 5.7, C.1)."""
    u = jax.nn.softmax(params["U"], -1)
    mix = 0.5 * (u + jax.nn.softmax(params["V"], -1)) if directed else u
    return [mix @ _link(kind, params[f"H{x}"]) for x, kind in enumerate(network.attribute_kinds)]


def _prior(params):
    return sum(jnp.sum(dist.Normal(0.0, 1.0).log_prob(value)) for value in params.values())


def log_joint(params, network: Network, edge_mask, attribute_mask, *, directed=True, noise_scale=1.0):
    """``log p(A, X, Theta)`` over the masked-in entries (``edge_mask (L, N, N)``,
    ``attribute_mask (P, N)``, 1 for training entries; self-loops are dropped here)."""
    total = _prior(params)
    means = edge_means(params, network, directed)
    off = 1.0 - jnp.eye(means.shape[-1])
    for l, kind in enumerate(network.layer_kinds):
        total += jnp.sum(_log_prob(kind, network.layers[l], means[l], noise_scale) * edge_mask[l] * off)
    for x, (kind, pi) in enumerate(zip(network.attribute_kinds, attribute_means(params, network, directed))):
        total += jnp.sum(_log_prob(kind, network.attributes[x], pi, noise_scale) * attribute_mask[x])
    return total


def node_log_density(membership, i, params, network: Network, edge_mask, attribute_mask, *, site="U",
                     directed=True, noise_scale=1.0):
    """The terms of :func:`log_joint` that involve node ``i``'s ``site`` row, with that row set
    to ``membership (K,)``: its prior, its row of every layer (``U``; its column for ``V``;
    both for undirected networks) and its attributes. Differs from ``log_joint`` by a constant
    in ``membership``, so its Hessian is the joint Hessian's ``K x K`` block for that row."""
    own = jax.nn.softmax(membership)
    u = jax.nn.softmax(params["U"], -1)
    v = jax.nn.softmax(params["V"], -1) if directed else u
    others = v if site == "U" else u
    n = u.shape[0]
    off = jnp.arange(n) != i
    total = jnp.sum(dist.Normal(0.0, 1.0).log_prob(membership))
    for l, kind in enumerate(network.layer_kinds):
        w = _link(kind, params["W"][l])
        row, col = network.layers[l][i], network.layers[l][:, i]
        if site == "U" or not directed:  # row i: lambda_ij = own' W v_j
            total += jnp.sum(_log_prob(kind, row, others @ w.T @ own, noise_scale) * edge_mask[l][i] * off)
        if site == "V" or not directed:  # column i: lambda_ji = u_j' W own
            total += jnp.sum(_log_prob(kind, col, others @ w @ own, noise_scale) * edge_mask[l][:, i] * off)
    if directed:
        mix = 0.5 * (own + (v[i] if site == "U" else u[i]))
    else:
        mix = own
    for x, kind in enumerate(network.attribute_kinds):
        pi = mix @ _link(kind, params[f"H{x}"])
        total += _log_prob(kind, network.attributes[x][i], pi, noise_scale) * attribute_mask[x][i]
    return total


def init_shapes(network: Network, num_communities: int, directed=True):
    """``{site: shape}`` of PIHAM's latent variables."""
    n, k = np.shape(network.layers[0])[0], num_communities
    shapes = {"U": (n, k)}
    if directed:
        shapes["V"] = (n, k)
    shapes["W"] = (len(network.layers), k, k)
    for x, (kind, z) in enumerate(zip(network.attribute_kinds, network.num_categories)):
        shapes[f"H{x}"] = (k, z) if kind == "categorical" else (k,)
    return shapes


def piham_model(network: Network, num_communities: int, edge_mask=None, attribute_mask=None, *, directed=True,
                noise_scale=1.0):
    """PIHAM as a NumPyro model (module docstring): standard normal sites ``U``, ``V``
    (directed only), ``W`` and ``H0, H1, ...``, and the masked log likelihood as a factor."""
    n = check_network(network)
    edge_mask = jnp.ones((len(network.layers), n, n)) if edge_mask is None else jnp.asarray(edge_mask)
    attribute_mask = (jnp.ones((len(network.attributes), n)) if attribute_mask is None
                      else jnp.asarray(attribute_mask))
    params = {site: numpyro.sample(site, dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape)))
              for site, shape in init_shapes(network, num_communities, directed).items()}
    numpyro.factor("likelihood", log_joint(params, network, edge_mask, attribute_mask, directed=directed,
                                           noise_scale=noise_scale) - _prior(params))


def as_arrays(network: Network) -> Network:
    """The network with JAX float32 layers and attributes (categorical ones int32)."""
    attributes = tuple(jnp.asarray(a, jnp.int32 if kind == "categorical" else jnp.float32)
                       for a, kind in zip(network.attributes, network.attribute_kinds))
    return network._replace(layers=tuple(jnp.asarray(a, jnp.float32) for a in network.layers),
                            attributes=attributes)


def default_masks(network: Network, edge_mask: Optional[np.ndarray] = None,
                  attribute_mask: Optional[np.ndarray] = None):
    n = np.shape(network.layers[0])[0]
    em = np.ones((len(network.layers), n, n), np.float32) if edge_mask is None else np.asarray(edge_mask, np.float32)
    am = (np.ones((len(network.attributes), n), np.float32) if attribute_mask is None
          else np.asarray(attribute_mask, np.float32))
    if em.shape != (len(network.layers), n, n):
        raise ValueError(f"edge_mask: shape {em.shape}, expected {(len(network.layers), n, n)}")
    if am.shape != (len(network.attributes), n):
        raise ValueError(f"attribute_mask: shape {am.shape}, expected {(len(network.attributes), n)}")
    return jnp.asarray(em), jnp.asarray(am)
