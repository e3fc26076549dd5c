"""Each block's own log density from the model's per-site log probabilities (numpyro_lm.marginal.block_terms)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import integrate

from numpyro_lm.core.model import model_info
from numpyro_lm.marginal.block_terms import (ENTRY_BASE, block_log_density, entry_directions, entry_products,
                                             find_block_entries)
from numpyro_lm.marginal.quadrature import block_quadrature
from shared_models import poisson_glmm


def pairs(first, second, num_groups, y=None):
    """Each observation involves two groups' effects: no entry is one block's."""
    z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([num_groups]).to_event(1))
    with numpyro.plate("obs", first.size):
        numpyro.sample("y", dist.Normal(z[first] + z[second], 1.0), obs=y)


def _entries(model, args, kwargs, local):
    info = model_info(model, args, kwargs)
    point = np.random.default_rng(0).normal(size=info.size) * 0.3
    directions = entry_directions(info.size, local)
    with jax.enable_x64(True):
        products = jax.device_get(entry_products(info, point, directions, args, kwargs))
    return info, find_block_entries(products, directions, local)


@pytest.mark.parametrize("num_groups", [7, ENTRY_BASE + 5])  # one base-B digit, and two
def test_each_observation_is_found_in_its_group(num_groups):
    """Groups in a shuffled order, one group without observations: the observations' entries map
    to their groups, the effects' prior entries are the blocks in order, the globals' to none."""
    rng = np.random.default_rng(1)
    group = rng.permutation(np.repeat(np.arange(num_groups - 1), 3)).astype(np.int32)
    y = rng.poisson(2.0, group.size).astype(np.float32)
    args, kwargs = (group, num_groups), {"y": y}
    z = model_info(poisson_glmm, args, kwargs).layout.site("z")
    _, entries = _entries(poisson_glmm, args, kwargs, np.arange(z.offset, z.offset + z.size))
    found = dict(zip([name for name, _ in entries.sites], entries.ids))
    assert dict(entries.sites) == {"y": 0, "z": 1} and entries.blocks == num_groups  # y's summed by a scatter
    np.testing.assert_array_equal(found["y"], group)
    np.testing.assert_array_equal(found["z"], np.arange(num_groups))


@pytest.mark.parametrize("counts, per_block", [((3, 3, 3, 3), 3), ((3, 2, 4, 3), 0)])
def test_a_balanced_design_in_group_order_is_summed_by_a_reshape(counts, per_block):
    """Observations in group order, as many in each group: their entries are summed by a reshape,
    to the segment sum's values; one group short of the others: the segment sum."""
    rng = np.random.default_rng(4)
    group = np.repeat(np.arange(len(counts)), counts).astype(np.int32)
    args, kwargs = (group, len(counts)), {"y": rng.poisson(2.0, group.size).astype(np.float32)}
    z = model_info(poisson_glmm, args, kwargs).layout.site("z")
    info, entries = _entries(poisson_glmm, args, kwargs, np.arange(z.offset, z.offset + z.size))
    assert dict(entries.sites)["y"] == per_block
    terms = info.site_log_probs(jnp.asarray(rng.normal(size=info.size), jnp.float32), args, kwargs)
    scattered = tuple((name, 0) for name, _ in entries.sites)
    np.testing.assert_allclose(block_log_density(terms, entries.sites, entries.ids, entries.blocks),
                               block_log_density(terms, scattered, entries.ids, entries.blocks),
                               rtol=1e-6)  # float32 sums of three or four terms, in another order


def test_entries_shared_by_two_blocks_are_refused():
    first, second = np.array([0, 1, 2, 3], np.int32), np.array([1, 2, 3, 0], np.int32)
    args, kwargs = (first, second, 4), {"y": np.zeros(4, np.float32)}
    assert _entries(pairs, args, kwargs, np.arange(4))[1] is None


def test_obs_mask_models_have_no_per_site_entries():
    def masked(y, mask):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        numpyro.sample("y", dist.Normal(z, 1.0).to_event(1), obs=y, obs_mask=mask)

    args = (np.zeros(3, np.float32), np.array([True, False, True]))
    info = model_info(masked, args)
    with pytest.raises(ValueError, match="obs_mask"):
        info.site_log_probs(jnp.zeros(info.size), args)


@pytest.mark.slow
def test_the_blocks_values_sum_to_the_log_density(x64):
    """The blocks' values plus the entries of no block are the model's log density (property)."""
    rng = np.random.default_rng(2)
    group = np.repeat(np.arange(5), 4).astype(np.int32)
    args, kwargs = (group, 5), {"y": rng.poisson(3.0, group.size).astype(np.float64)}
    z = model_info(poisson_glmm, args, kwargs).layout.site("z")
    info, entries = _entries(poisson_glmm, args, kwargs, np.arange(z.offset, z.offset + z.size))
    flat = jnp.asarray(rng.normal(size=info.size))
    terms = info.site_log_probs(flat, args, kwargs)
    in_blocks = block_log_density(terms, entries.sites, entries.ids, entries.blocks)
    rest = sum(float(jnp.sum(t)) for name, t in terms.items() if name not in dict(entries.sites))
    np.testing.assert_allclose(float(jnp.sum(in_blocks)) + rest, float(info.log_density(flat, args, kwargs)),
                               rtol=1e-12)


@pytest.mark.parametrize("num_nodes", [5, 9])
def test_quadrature_from_values_matches_one_dimensional_integrals(x64, num_nodes):
    """Skewed Poisson blocks (counts 0-2): each block's log R from the values at the nodes is the
    rule applied to the exact values, which the slopes' integration approaches within its own
    error, and the rule is nearer scipy's integral than Laplace."""
    rng = np.random.default_rng(3)
    group = np.repeat(np.arange(6), 2).astype(np.int32)
    y = rng.poisson(0.4, group.size).astype(np.float64)
    args, kwargs = (group, 6), {"y": y}
    z = model_info(poisson_glmm, args, kwargs).layout.site("z")
    local = np.arange(z.offset, z.offset + z.size)
    info, entries = _entries(poisson_glmm, args, kwargs, local)
    log_density = lambda v: info.log_density(v, args, kwargs)  # noqa: E731
    values = lambda v: block_log_density(info.site_log_probs(v, args, kwargs), entries.sites, entries.ids, 6)  # noqa: E731
    beta, sigma = -0.5, 1.5
    x = jnp.zeros(info.size).at[0].set(beta).at[1].set(jnp.log(sigma))
    grad, hessian = jax.jit(jax.grad(log_density)), jax.jit(lambda v: jnp.diag(jax.hessian(log_density)(v)))
    for _ in range(30):  # each block's conditional mode, Newton coordinate by coordinate
        x = x.at[local].add(-grad(x)[local] / hessian(x)[local])
    precision = -hessian(x)[local]
    from_values = block_quadrature(log_density, x, local, precision, num_nodes=num_nodes, values=values)
    from_slopes = block_quadrature(log_density, x, local, precision, num_nodes=num_nodes)

    def f(j, zj):  # block j's terms in closed form: its prior and its counts
        rate = beta + sigma * zj
        return -0.5 * zj**2 + np.sum(y[group == j] * rate - np.exp(rate))

    nodes, weights = np.polynomial.hermite.hermgauss(num_nodes)
    scale = np.sqrt(2.0 / np.asarray(precision))
    for j in range(6):
        zj = float(x[local[j]])
        phi = np.array([f(j, zj + scale[j] * t) - f(j, zj) for t in nodes])
        rule = np.log(np.sum(weights / np.sqrt(np.pi) * np.exp(phi + nodes**2)))  # the rule with exact values
        np.testing.assert_allclose(from_values[0][j], rule, rtol=0, atol=1e-12)  # the same sums
        # the slopes' piecewise Lobatto integration: 1e-4 nats a block (quadrature module)
        assert abs(float(from_slopes[0][j]) - rule) < 1e-4
        exact = integrate.quad(lambda u: np.exp(f(j, u) - f(j, zj)), zj - 12, zj + 12, epsabs=0, epsrel=1e-11)[0]
        log_r = np.log(exact / (np.sqrt(2 * np.pi / float(precision[j]))))
        # measured: the 5-node rule 1.7-2.6e-3 nats from the integral, 9 nodes 0.9-1.5e-4,
        # Laplace (log R = 0) 0.008-0.010
        assert abs(float(from_values[0][j]) - log_r) < (4e-3 if num_nodes == 5 else 3e-4) < abs(log_r) / 2
    np.testing.assert_allclose(from_values[1], from_slopes[1], atol=1e-4)  # the conditional means
