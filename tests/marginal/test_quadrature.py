"""The blocks' Gauss-Hermite quadrature: its indexing of the blocks (slices where contiguous)."""

import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.marginal.quadrature import add_at, as_slice, block_quadrature


@pytest.mark.parametrize("index", [slice(3, 8), np.arange(3, 8), np.array([0, 2, 5]), slice(0, 10)])
def test_add_at_is_a_scatter_add(index):
    x, values = jnp.arange(10.0), jnp.linspace(1.0, 2.0, np.arange(10)[index].size)
    np.testing.assert_array_equal(add_at(x, as_slice(index), values), x.at[index].add(values))


def test_only_concrete_contiguous_integer_ranges_become_slices():
    assert as_slice(np.arange(4, 9)) == slice(4, 9)
    gaps = np.array([1, 2, 4])
    assert as_slice(gaps) is gaps
    assert as_slice(np.arange(5)[::-1]) is not None and not isinstance(as_slice(np.arange(5)[::-1]), slice)
    assert isinstance(as_slice(jnp.arange(3)), type(jnp.arange(3)))  # a device array stays as it is


def test_block_quadrature_is_the_same_with_the_blocks_as_a_range_or_as_indices():
    # three Poisson blocks (counts 0, 2, 7) with a global before them: the rule must not depend on
    # how the blocks' coordinates are written
    counts = jnp.array([0.0, 2.0, 7.0])

    def log_density(v):
        z = v[1:]
        return jnp.sum(counts * z - jnp.exp(z) - 0.5 * z**2) - 0.5 * v[0] ** 2

    x = jnp.array([0.3, -0.5, 0.6, 1.8])
    precision = jnp.exp(x[1:]) + 1.0
    by_range = block_quadrature(log_density, x, np.arange(1, 4), precision)
    by_index = block_quadrature(log_density, x, jnp.arange(1, 4), precision)
    for a, b in zip(by_range, by_index):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # float32 round-off of the same sums
