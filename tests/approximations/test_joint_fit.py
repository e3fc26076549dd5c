"""Rows of a model evaluated in chunks sized by the largest array one row computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.approximations import joint_fit as fit_module
from numpyro_lm.approximations.joint_fit import (CPU_ROW_NUMBERS, ROW_BUDGET, largest_intermediate, log_densities,
                                                map_rows, rows_at_once)
from numpyro_lm.core.model import model_info
from shared_models import whitened_gp


def test_largest_intermediate_sees_the_kernel_matrix():
    # the n x n kernel is the largest array, not the n observations: chunks must be sized by it
    n = 60
    x, y = jnp.linspace(-3, 3, n), jnp.zeros(n)
    info = model_info(whitened_gp, (x, y))
    size = largest_intermediate(lambda r: info.log_density(r, (x, y)), jnp.zeros(info.size))
    assert size == n * n


@pytest.mark.parametrize("per_row, n", [(207, 4000), (10_003, 1000), (200_003, 200), (10_003, 997), (100, 7), (10**8, 5)])
def test_rows_at_once_fit_the_budget_and_divide_the_rows_where_they_can(per_row, n):
    rows = rows_at_once(per_row, n)
    budget = CPU_ROW_NUMBERS if jax.default_backend() == "cpu" else ROW_BUDGET
    assert 1 <= rows <= n and (rows == 1 or rows * per_row <= budget)
    target = min(n, max(1, budget // per_row))
    # a divisor of n where one lies within a factor 2 of the budget's rows (no remainder to compile)
    if any(n % r == 0 for r in range(target, (target - 1) // 2, -1)):
        assert n % rows == 0 and 2 * rows > target
    else:
        assert rows == target


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_map_rows_in_chunks_equals_vmap(monkeypatch):
    n = 40
    x = jnp.linspace(-3, 3, n)
    y = (jnp.sin(x) > 0).astype(jnp.float32)
    # a well-conditioned kernel: batched and single Cholesky factors then agree to float32 round-off
    kwargs = {"jitter": 1.0}
    info = model_info(whitened_gp, (x, y), kwargs)
    flat = jax.random.normal(jax.random.PRNGKey(0), (7, info.size))
    whole = jax.vmap(lambda r: info.log_density(r, (x, y), kwargs))(flat)
    # a budget of three kernel matrices: chunks of three rows, the last one short
    monkeypatch.setattr(fit_module, "ROW_BUDGET", 3 * n * n)
    chunked = log_densities(info, flat, (x, y), kwargs)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5)  # float32 round-off of a ~100-term sum
    assert map_rows(info, lambda r: r[:2], flat).shape == (7, 2)
