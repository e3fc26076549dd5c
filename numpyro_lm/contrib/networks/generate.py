r"""Synthetic attributed multilayer networks: the thesis' two settings (appendix C.3 and C.4).

Both return a :class:`Network` and the generating memberships ``softmax``-free, as
probability rows ``(N, K)``, so that recovered communities can be scored against them.

- :func:`mtcov_network` (C.3, "homogeneous"): a multilayer mixed-membership SBM (De Bacco et
  al. 2017) with Poisson layers and one categorical attribute, as in Contisciani et al.
  (2020). Equal-size hard groups, 20% of nodes made mixed with Dirichlet(0.1) memberships;
  layer 1 assortative (diagonal ``p1 = <k> K / N``, off-diagonal ``p2 = 0.1 p1``), layer 2
  disassortative (the reverse); ``A^l_ij ~ Poisson(u_i' W^l v_j)``, no self-loops; the
  attribute equals the node's main community for half the nodes and is uniform otherwise.
  The thesis sets the correlation of ``U`` and ``V`` to 0.1 without saying how; here ``V``
  is ``U`` for the hard nodes and an independent Dirichlet(0.1) draw for the mixed ones.
- :func:`piham_network` (C.4, "heterogeneous"): PIHAM's own generative process (thesis eqs.
  5.2-5.7) with a Bernoulli, a Poisson and a Gaussian layer and a categorical (``Z = 4``), a
  Poisson and a Gaussian attribute; latent ``U_ik ~ N(2, 0.2^2)`` in the node's group and
  ``N(-1, 0.2^2)`` elsewhere (``V``: SD 0.3), ``W`` diagonal ``N(0, 0.45^2)`` and
  off-diagonal ``N(-4, 0.45^2)``, ``H`` as in appendix C.4.
- :func:`prior_network`: every latent variable drawn from PIHAM's own ``N(0, 1)`` prior, then
  the data from the likelihood. The model is then exactly right, so the exact posterior's
  90% intervals cover the truth 90% of the time on average over draws: the instance on which
  the calibration of approximate intervals can be judged (C.4's latents lie far out in the
  prior's tails, where even the exact posterior does not cover them).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import softmax

from .model import Network, attribute_means, edge_means, init_shapes

__all__ = ["mtcov_network", "piham_network", "prior_network", "GeneratedNetwork"]


class GeneratedNetwork(NamedTuple):
    """``network`` and the true membership probabilities ``u``, ``v`` ``(N, K)``."""

    network: Network
    u: np.ndarray
    v: np.ndarray


def _hard_groups(n, k):
    return np.repeat(np.arange(k), int(np.ceil(n / k)))[:n]


def mtcov_network(num_nodes=500, num_communities=3, average_degree=20.0, num_categories=3, mixed=0.2,
                  attribute_match=0.5, seed=0) -> GeneratedNetwork:
    """Thesis appendix C.3 (module docstring): two Poisson layers, one categorical attribute."""
    rng = np.random.default_rng(seed)
    n, k = num_nodes, num_communities
    groups = _hard_groups(n, k)
    u = np.eye(k)[groups]
    v = u.copy()
    overlapping = rng.choice(n, int(mixed * n), replace=False)
    u[overlapping] = rng.dirichlet(0.1 * np.ones(k), len(overlapping))
    v[overlapping] = rng.dirichlet(0.1 * np.ones(k), len(overlapping))
    p1 = average_degree * k / n
    assortative = np.full((k, k), 0.1 * p1) + np.eye(k) * 0.9 * p1
    disassortative = np.full((k, k), p1) - np.eye(k) * 0.9 * p1
    rate = np.stack([u @ assortative @ v.T, u @ disassortative @ v.T])
    edges = rng.poisson(rate).astype(np.float32)
    edges[:, np.arange(n), np.arange(n)] = 0.0
    main = u.argmax(1)
    attribute = np.where(rng.uniform(size=n) < attribute_match, main, rng.integers(0, num_categories, n))
    network = Network(layers=(edges[0], edges[1]), layer_kinds=("poisson", "poisson"),
                      attributes=(attribute.astype(np.int32),), attribute_kinds=("categorical",),
                      num_categories=(num_categories,))
    return GeneratedNetwork(network, u, v)


def piham_network(num_nodes=200, num_communities=3, num_categories=4, noise_scale=1.0, seed=0) -> GeneratedNetwork:
    """Thesis appendix C.4 (module docstring): Bernoulli, Poisson and Gaussian layers;
    categorical, Poisson and Gaussian attributes, from PIHAM's own model."""
    rng = np.random.default_rng(seed)
    n, k, z = num_nodes, num_communities, num_categories
    member = np.eye(k, dtype=bool)[_hard_groups(n, k)]
    latent_u = np.where(member, rng.normal(2.0, 0.2, (n, k)), rng.normal(-1.0, 0.2, (n, k)))
    latent_v = np.where(member, rng.normal(2.0, 0.3, (n, k)), rng.normal(-1.0, 0.3, (n, k)))
    u, v = softmax(latent_u, -1), softmax(latent_v, -1)
    w = np.where(np.eye(k, dtype=bool), rng.normal(0.0, 0.45, (3, k, k)), rng.normal(-4.0, 0.45, (3, k, k)))
    probability = u @ (1 / (1 + np.exp(-w[0]))) @ v.T
    rate = u @ np.exp(w[1]) @ v.T
    mean = u @ w[2] @ v.T
    off = ~np.eye(n, dtype=bool)
    layers = (np.where(off, rng.uniform(size=(n, n)) < probability, 0).astype(np.float32),
              np.where(off, rng.poisson(rate), 0).astype(np.float32),
              np.where(off, rng.normal(mean, noise_scale), 0).astype(np.float32))
    # H, 1-based k as in the thesis: categorical N(0.5 + k, 0.2^2) on its own category
    ks = np.arange(1, k + 1)
    h_cat = np.where(np.arange(z)[None] == np.arange(k)[:, None], rng.normal(0.5 + ks[:, None], 0.2, (k, z)),
                     rng.normal(0.0, 0.2, (k, z)))
    if k < z:
        h_cat[:, k:] = rng.normal(0.2, 0.2, (k, z - k))
    if k > z:
        h_cat[z:] = rng.normal(0.2, 0.2, (k - z, z))
    h_pois = rng.normal(1.5 * (ks + 2) / 3, 0.1)
    h_gauss = rng.normal(4.0 + (1 - ks) * 3.0, 0.2)
    mix = 0.5 * (u + v)
    p_cat = mix @ softmax(h_cat, -1)
    categorical = np.array([rng.choice(z, p=p / p.sum()) for p in p_cat], np.int32)
    attributes = (categorical, rng.poisson(mix @ np.exp(h_pois)).astype(np.float32),
                  rng.normal(mix @ h_gauss, noise_scale).astype(np.float32))
    network = Network(layers=layers, layer_kinds=("bernoulli", "poisson", "gaussian"), attributes=attributes,
                      attribute_kinds=("categorical", "poisson", "gaussian"), num_categories=(z, 0, 0))
    return GeneratedNetwork(network, u, v)


def prior_network(num_nodes=40, num_communities=3, layer_kinds=("bernoulli", "poisson", "gaussian"),
                  attribute_kinds=("categorical",), num_categories=(4,), directed=True, noise_scale=1.0,
                  seed=0) -> tuple[GeneratedNetwork, dict]:
    """A network drawn from PIHAM itself (module docstring): ``(GeneratedNetwork, latents)``
    with ``latents`` the drawn ``U``, ``V``, ``W``, ``H0, ...``."""
    rng = np.random.default_rng(seed)
    n = num_nodes
    shape_of = Network(layers=(np.zeros((n, n)),) * len(layer_kinds), layer_kinds=tuple(layer_kinds),
                       attributes=(np.zeros(n),) * len(attribute_kinds), attribute_kinds=tuple(attribute_kinds),
                       num_categories=tuple(num_categories))
    latents = {site: rng.normal(size=shape).astype(np.float32)
               for site, shape in init_shapes(shape_of, num_communities, directed).items()}
    off = ~np.eye(n, dtype=bool)
    layers = []
    for kind, mean in zip(layer_kinds, np.asarray(edge_means(latents, shape_of, directed), np.float64)):
        draw = {"bernoulli": lambda m: rng.uniform(size=m.shape) < m, "poisson": rng.poisson,
                "gaussian": lambda m: rng.normal(m, noise_scale)}[kind](mean)
        layers.append(np.where(off, draw, 0).astype(np.float32))
    attributes = []
    for kind, mean in zip(attribute_kinds, attribute_means(latents, shape_of, directed)):
        mean = np.asarray(mean, np.float64)
        if kind == "categorical":
            attributes.append(np.array([rng.choice(len(p), p=p / p.sum()) for p in mean], np.int32))
        elif kind == "poisson":
            attributes.append(rng.poisson(mean).astype(np.float32))
        else:
            attributes.append(rng.normal(mean, noise_scale).astype(np.float32))
    u = softmax(latents["U"], -1)
    v = softmax(latents["V"], -1) if directed else u
    network = shape_of._replace(layers=tuple(layers), attributes=tuple(attributes))
    return GeneratedNetwork(network, u, v), latents
