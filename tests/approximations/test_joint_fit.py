"""Rows of a model evaluated in chunks sized by the largest array one row computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.approximations import joint_fit as fit_module
from numpyro_lm.approximations.joint_fit import (CPU_ROW_NUMBERS, ROW_BUDGET, largest_intermediate, log_densities,
                                                map_rows, rows_at_once, runs_loops)
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


def test_runs_loops_sees_a_scan_and_not_a_plain_model():
    import numpyro
    import numpyro.distributions as dist
    from numpyro.contrib.control_flow import scan

    def chain(y):
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))

        def step(prev, _):
            f = numpyro.sample("f", dist.Normal(prev, sigma))
            return f, f

        _, f = scan(step, 0.0, None, length=y.shape[0])
        numpyro.sample("y", dist.Normal(f, 1.0), obs=y)

    def flat(y):
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        f = numpyro.sample("f", dist.Normal(0.0, sigma).expand(y.shape))
        numpyro.sample("y", dist.Normal(f, 1.0), obs=y)

    y = jnp.zeros(5)
    for model, loops in ((chain, True), (flat, False)):
        info = model_info(model, (y,))
        assert runs_loops(lambda r: info.log_density(r, (y,)), jnp.zeros(info.size)) is loops


def test_rows_that_loop_take_the_whole_budget_at_once():
    # a loop's steps cost a fixed time per operation: the CPU's cache-sized chunks do not apply
    assert rows_at_once(404, 4000, loops=True) == min(4000, ROW_BUDGET // 404)
    assert rows_at_once(10**8, 5, loops=True) == 1


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
