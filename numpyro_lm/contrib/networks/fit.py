r"""Fitting PIHAM: MAP by Adam from many random starts in one compiled program, then a Laplace
approximation per node and Laplace Matching of each membership to a Dirichlet.

1. **MAP.** ``num_restarts`` starts drawn from ``N(0, init_scale^2)`` (thesis C.2: ``N(0, 9)``)
   run ``num_steps`` Adam steps side by side (``vmap`` inside one ``jit``: a new restart costs
   no compilation); the start with the highest :func:`~numpyro_lm.contrib.networks.model.log_joint`
   wins. The origin is a saddle (every community alike), so the default start of a generic
   fit does not work here. Communities are exchangeable: restarts land on relabelled copies
   of the same modes, which the best-of rule does not mind; scores against a truth align the
   labels first (:func:`~numpyro_lm.contrib.networks.metrics.align`).
2. **Laplace, per node** (thesis eqs. 5.9-5.11): each node's ``U_i`` (and ``V_i``) gets the
   Gaussian ``N(mu_i, (-H_ii)^{-1})`` with ``H_ii`` the exact ``K x K`` block of the joint
   Hessian at the MAP, from :func:`~numpyro_lm.contrib.networks.model.node_log_density` (``O(N K^2)``
   per node, so ``O(N^2 K^4)`` for all: no ``NK x NK`` matrix). This is the thesis'
   factorised posterior: each membership conditional on the others at their MAP.
3. **Laplace Matching** (eq. 5.12-5.13): ``softmax(U_i)`` depends only on ``U_i`` minus its mean,
   so the Gaussian is projected onto the zero-sum plane (``P mu``, ``P Sigma P``, ``P = I -
   11'/K``: exact in distribution, unlike conditioning) and mapped to ``Dir(alpha_i)`` by the
   bridge; each membership's marginal is ``Beta(alpha_ik, alpha_i0 - alpha_ik)``.
4. **Credible intervals** (``interval="logistic_normal"``, default) come from the Gaussian
   itself, not from the Dirichlet: ``logit p_ik = x_k - logsumexp_{j != k} x_j`` is
   linearised at the mean, ``N(m_ik, g' Sigma_i g)`` with ``g = e_k - softmax_{-k}(mu_i)``,
   and its quantiles are mapped back by the logistic function (exact for ``K = 2``; against
   4000 softmax draws of the same Gaussian, measured equal to 0.01 in coverage). A Dirichlet
   has one total concentration for all ``K`` memberships, so once the Gaussian is narrow and
   its means far apart the bridge's Beta intervals are much too narrow: on networks drawn
   from PIHAM's prior (N = 150, the true ``W`` and ``H`` given, three draws) they covered the
   true memberships 17-78% of the time at nominal 90%, the logistic-normal ones 84-92%.
   ``interval="dirichlet"`` gives the Beta quantiles (the thesis' choice).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from ...curvature import CholeskyCurvature, covariance
from ...curvature.linalg import eigh
from ...families.laplace_bridge import dirichlet_from_zero_sum_gaussian
from ...families.quantiles import beta_logit_quantile
from ...mode.derivatives import hvp_operator
from ...runtime.precision import precise_jit
from .model import Network, as_arrays, check_network, default_masks, init_shapes, log_joint, node_log_density

__all__ = ["PIHAMFit", "Memberships", "fit_piham", "memberships", "logistic_normal_intervals", "COVARIANCES",
           "INTERVALS", "JOINT_LIMIT"]

COVARIANCES = ("auto", "joint", "node")
INTERVALS = ("logistic_normal", "dirichlet")
#: latent dimensions up to which ``covariance="auto"`` inverts the whole Hessian (4000: 64 MB
#: and a few seconds on two cores; N = 500 directed with K = 3 has 3000 plus W and H)
JOINT_LIMIT = 4000


class Memberships(NamedTuple):
    """Per node: ``concentration (N, K)`` of the Dirichlet, its ``mean``, the ``median``
    ``softmax(latent_mean)`` (each membership's median under the logistic normal), the
    equal-tailed credible interval ``lower``/``upper`` of each membership (module docstring,
    step 4; it holds ``median``, and the Dirichlet ``mean`` where the bridge fits), and the
    latent Gaussian ``latent_mean (N, K)``, ``latent_cov (N, K, K)``."""

    concentration: jax.Array
    mean: jax.Array
    median: jax.Array
    lower: jax.Array
    upper: jax.Array
    latent_mean: jax.Array
    latent_cov: jax.Array


class PIHAMFit(NamedTuple):
    """``params``: the MAP; ``log_joint``: its value; ``restart_log_joints (R,)``; ``U`` and
    ``V`` (``V is U`` for undirected networks): :class:`Memberships` at 90% credibility;
    ``covariance``: ``"joint"`` or ``"node"``, the one used."""

    params: dict
    log_joint: float
    restart_log_joints: np.ndarray
    U: Memberships
    V: Memberships
    covariance: str


def _map_program(network, edge_mask, attribute_mask, shapes, directed, noise_scale, num_steps, learning_rate):
    # a cosine decay to 1% ends at the mode; at a constant rate Adam hovers around it and a few
    # nodes' Hessian blocks are not yet negative definite
    optimiser = optax.adam(optax.cosine_decay_schedule(learning_rate, num_steps, alpha=0.01))

    def objective(params):
        return -log_joint(params, network, edge_mask, attribute_mask, directed=directed, noise_scale=noise_scale)

    def one_start(params):
        def step(carry, _):
            p, state = carry
            loss, grads = jax.value_and_grad(objective)(p)
            updates, state = optimiser.update(grads, state, p)
            return (optax.apply_updates(p, updates), state), loss

        (params, _), _ = jax.lax.scan(step, (params, optimiser.init(params)), None, length=num_steps)
        return params, -objective(params)

    return precise_jit(jax.vmap(one_start))


def _node_blocks(params, network, edge_mask, attribute_mask, site, directed, noise_scale):
    """``-H_ii`` for every node's ``site`` row: ``(N, K, K)``."""
    def block(row, i):
        return -jax.hessian(node_log_density)(row, i, params, network, edge_mask, attribute_mask, site=site,
                                              directed=directed, noise_scale=noise_scale)

    return precise_jit(jax.vmap(block))(params[site], jnp.arange(params[site].shape[0]))


@precise_jit
def _block_covariances(precision):
    """The inverse of each ``(K, K)`` block of ``precision (N, K, K)`` through its Cholesky factor."""
    return jax.vmap(lambda p: covariance(CholeskyCurvature.from_precision(p)))(precision)


def _joint_covariances(params, network, edge_mask, attribute_mask, sites, directed, noise_scale):
    """Per site, the ``(N, K, K)`` blocks of the inverse of the whole negative Hessian (every
    node, ``W`` and ``H`` together): the marginal Laplace covariances. ``D`` Hessian-vector
    products in chunks of 64 (the model's forward pass once: :func:`~numpyro_lm.mode.derivatives.hvp_operator`),
    then the package's curvature (:class:`~numpyro_lm.curvature.CholeskyCurvature`: one ``D x D``
    Cholesky)."""
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    index = unravel(jnp.arange(flat.shape[0], dtype=jnp.float32))

    def negative_log_joint(x):
        return -log_joint(unravel(x), network, edge_mask, attribute_mask, directed=directed, noise_scale=noise_scale)

    @precise_jit
    def joint_covariance(x):
        columns = jax.lax.map(hvp_operator(negative_log_joint, x), jnp.eye(x.shape[0], dtype=x.dtype), batch_size=64)
        curvature = CholeskyCurvature.from_precision(columns)
        return curvature.positive(), covariance(curvature)

    positive, cov = joint_covariance(flat)
    if not bool(positive):
        raise np.linalg.LinAlgError("the joint negative Hessian at the best restart's end point is not positive "
                                    "definite: it is not a mode. Raise num_steps or num_restarts, or pass "
                                    "covariance='node'.")
    out = {}
    for site in sites:
        idx = jnp.round(index[site]).astype(jnp.int32)  # (N, K)
        out[site] = cov[idx[:, :, None], idx[:, None, :]]
    return out


def logistic_normal_intervals(latent_mean, cov, credibility=0.9):
    r"""Equal-tailed intervals ``(lower, upper)``, each ``(..., K)``, of ``softmax(x)_k`` for
    ``x ~ N(latent_mean, cov)``, by the delta method on the logit (module docstring, step 4):

    .. math:: \operatorname{logit} p_k \approx N\big(\mu_k - \operatorname{lse}_{j \ne k} \mu_j,\;
              g_k^\top \Sigma g_k\big), \qquad g_k = e_k - \operatorname{softmax}_{j \ne k}(\mu).
    """
    k = latent_mean.shape[-1]
    others = ~jnp.eye(k, dtype=bool)  # row c: the components other than c
    masked = jnp.where(others, latent_mean[..., None, :], -jnp.inf)  # (..., K, K)
    centre = latent_mean - jax.scipy.special.logsumexp(masked, axis=-1)
    g = jnp.eye(k) - jax.nn.softmax(masked, axis=-1)  # row c: e_c - softmax over j != c
    spread = jnp.sqrt(jnp.maximum(jnp.einsum("...ci,...ij,...cj->...c", g, cov, g), 0.0))
    z = jax.scipy.special.ndtri(0.5 + credibility / 2.0)
    return jax.nn.sigmoid(centre - z * spread), jax.nn.sigmoid(centre + z * spread)


def memberships(latent_mean, cov, credibility=0.9, interval="logistic_normal") -> Memberships:
    """Dirichlet memberships from per-node Gaussians ``N(latent_mean_i, cov_i)`` (module
    docstring, steps 3-4); ``interval``: one of :data:`INTERVALS`."""
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {INTERVALS}, not {interval!r}")
    k = latent_mean.shape[-1]
    project = jnp.eye(k) - 1.0 / k
    mean_z = latent_mean @ project
    cov_z = project @ cov @ project
    alpha = dirichlet_from_zero_sum_gaussian(mean_z, jnp.diagonal(cov_z, axis1=-2, axis2=-1))
    rest = jnp.sum(alpha, -1, keepdims=True) - alpha
    if interval == "dirichlet":
        tail = (1.0 - credibility) / 2.0
        lower = jax.nn.sigmoid(beta_logit_quantile(alpha, rest, tail))
        upper = jax.nn.sigmoid(beta_logit_quantile(alpha, rest, 1.0 - tail))
    else:
        lower, upper = logistic_normal_intervals(latent_mean, cov, credibility)
    return Memberships(alpha, alpha / (alpha + rest), jax.nn.softmax(latent_mean, -1), lower, upper, latent_mean, cov)


def fit_piham(network: Network, num_communities: int, *, edge_mask=None, attribute_mask=None, directed=True,
              noise_scale=1.0, num_restarts=10, num_steps=2000, learning_rate=0.5, init_scale=3.0,
              credibility=0.9, covariance="auto", interval="logistic_normal", seed=0) -> PIHAMFit:
    """Fit PIHAM (module docstring) to ``network`` with ``num_communities`` communities.

    :param edge_mask: ``(L, N, N)``, 1 where an entry is observed (training), 0 where held out.
    :param attribute_mask: ``(P, N)`` likewise for the attributes.
    :param directed: ``False`` ties ``V = U``.
    :param noise_scale: ``sigma`` of Gaussian layers and attributes.
    :param num_restarts: random starts, run side by side (thesis: 50).
    :param num_steps: Adam steps per start (thesis: 2000 at learning rate 0.5), the rate decaying
        to 1% of ``learning_rate`` on a cosine.
    :param covariance: ``"node"``: each membership's Gaussian from its own Hessian block (the
        thesis' factorised posterior, conditional on the rest); ``"joint"``: the blocks of the
        inverse of the whole Hessian (marginal: wider, measured closer to NUTS); ``"auto"``
        (default): joint up to :data:`JOINT_LIMIT` latent dimensions.
    :param interval: how the membership intervals are computed (module docstring, step 4):
        ``"logistic_normal"`` (default) or ``"dirichlet"`` (the bridge's Beta quantiles).
    """
    check_network(network)
    if num_communities < 2:
        raise ValueError(f"num_communities must be at least 2, not {num_communities}")
    if covariance not in COVARIANCES:
        raise ValueError(f"covariance must be one of {COVARIANCES}, not {covariance!r}")
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {INTERVALS}, not {interval!r}")
    if num_restarts < 1 or num_steps < 1:
        raise ValueError(f"num_restarts and num_steps must be positive, not {num_restarts} and {num_steps}")
    em, am = default_masks(network, edge_mask, attribute_mask)
    data = as_arrays(network)
    shapes = init_shapes(network, num_communities, directed)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    starts = {site: init_scale * jax.random.normal(key, (num_restarts,) + shape)
              for key, (site, shape) in zip(keys, shapes.items())}
    program = _map_program(data, em, am, shapes, directed, noise_scale, num_steps, learning_rate)
    params, values = program(starts)
    values = np.asarray(values)
    if not np.any(np.isfinite(values)):
        raise FloatingPointError("every PIHAM restart ended at a non-finite log density: lower learning_rate or "
                                 "check the data's scale (Gaussian layers and attributes against noise_scale)")
    best = int(np.nanargmax(np.where(np.isfinite(values), values, -np.inf)))
    params = {site: value[best] for site, value in params.items()}
    sites = ("U", "V") if directed else ("U",)
    dimension = sum(int(np.prod(shape)) for shape in shapes.values())
    if covariance == "auto":
        covariance = "joint" if dimension <= JOINT_LIMIT else "node"
    covs = {}
    for site in sites if covariance == "node" else ():  # the joint path checks definiteness itself
        precision = _node_blocks(params, data, em, am, site, directed, noise_scale)
        smallest = np.asarray(jax.vmap(eigh)(precision)[0][:, 0])  # one LAPACK call a node (curvature.linalg)
        if np.any(smallest <= 0):
            bad = np.flatnonzero(smallest <= 0)
            raise np.linalg.LinAlgError(
                f"{site}: the Hessian block of {len(bad)} nodes (first: {bad[:5].tolist()}) is not negative "
                "definite at the best restart's end point: it is not a mode. Raise num_steps or num_restarts.")
        covs[site] = _block_covariances(precision)
    if covariance == "joint":
        covs = _joint_covariances(params, data, em, am, sites, directed, noise_scale)
    out = {site: memberships(params[site], covs[site], credibility, interval) for site in sites}
    return PIHAMFit(params, float(values[best]), values, out["U"], out.get("V", out["U"]), covariance)
