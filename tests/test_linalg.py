"""The vmap-safe linear algebra: JAX's numbers, batched one call at a time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.linalg import cholesky, eigh, solve_triangular

pytestmark = pytest.mark.usefixtures("x64")


def test_batched_results_equal_jax_and_unbatched_calls():
    a = jax.random.normal(jax.random.PRNGKey(0), (300, 6, 6))
    h = a @ jnp.swapaxes(a, -1, -2) + jnp.eye(6)
    b = jax.random.normal(jax.random.PRNGKey(1), (300, 6))
    w, q = jax.jit(jax.vmap(eigh))(h)
    np.testing.assert_allclose(w, jnp.linalg.eigvalsh(h), rtol=1e-10)
    np.testing.assert_allclose(q[7], eigh(h[7])[1], rtol=1e-12)
    chol = jax.jit(jax.vmap(cholesky))(h)
    np.testing.assert_allclose(chol, jnp.linalg.cholesky(h), rtol=1e-12)
    x = jax.jit(jax.vmap(lambda c, v: solve_triangular(c, v, lower=True)))(chol, b)
    np.testing.assert_allclose(jnp.einsum("bij,bj->bi", chol, x), b, rtol=1e-10, atol=1e-12)
    y = jax.vmap(lambda c, v: solve_triangular(c.T, v, lower=False))(chol, b)
    np.testing.assert_allclose(jnp.einsum("bji,bj->bi", chol, y), b, rtol=1e-10, atol=1e-12)
