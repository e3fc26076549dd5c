"""Rows of a model evaluated in chunks sized by the largest array one row computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.approximations import joint_fit as fit_module
from numpyro_lm.approximations.joint_fit import largest_intermediate, log_densities, map_rows
from numpyro_lm.core.model import model_info
from shared_models import whitened_gp


def test_largest_intermediate_sees_the_kernel_matrix():
    # the n x n kernel is the largest array, not the n observations: chunks must be sized by it
    n = 60
    x, y = jnp.linspace(-3, 3, n), jnp.zeros(n)
    info = model_info(whitened_gp, (x, y))
    size = largest_intermediate(lambda r: info.log_density(r, (x, y)), jnp.zeros(info.size))
    assert size == n * n


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
