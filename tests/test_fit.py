"""Rows of a model evaluated in chunks sized by the largest array one row computes."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_lm import fit as fit_module
from numpyro_lm.fit import largest_intermediate, log_densities, map_rows
from numpyro_lm.model import model_info


def whitened_gp(x, y=None, jitter=1e-3):
    amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
    ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
    d = x[:, None] - x[None, :]
    k = amp**2 * jnp.exp(-(d**2) / (2 * ls**2)) + jitter * jnp.eye(x.shape[0])
    with numpyro.plate("n", x.shape[0]):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=jnp.linalg.cholesky(k) @ z), obs=y)


def test_largest_intermediate_sees_the_kernel_matrix():
    # the n x n kernel is the largest array, not the n observations: chunks must be sized by it
    n = 60
    x, y = jnp.linspace(-3, 3, n), jnp.zeros(n)
    info = model_info(whitened_gp, (x, y))
    size = largest_intermediate(lambda r: info.log_density(r, (x, y)), jnp.zeros(info.size))
    assert size == n * n


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
