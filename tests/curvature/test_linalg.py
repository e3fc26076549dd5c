"""The vmap-safe linear algebra: JAX's numbers, batched one call at a time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.curvature.linalg import SEQUENTIAL_MAX, cholesky, eigh, solve_triangular

pytestmark = pytest.mark.usefixtures("x64")


@pytest.mark.parametrize("batch", [8, 300])  # one LAPACK call per entry; the vectorised loops
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_batched_results_equal_jax_and_unbatched_calls(batch):
    assert (batch <= SEQUENTIAL_MAX) == (batch == 8)
    a = jax.random.normal(jax.random.PRNGKey(0), (batch, 6, 6))
    h = a @ jnp.swapaxes(a, -1, -2) + jnp.eye(6)
    b = jax.random.normal(jax.random.PRNGKey(1), (batch, 6))
    w, q = jax.jit(jax.vmap(eigh))(h)
    np.testing.assert_allclose(w, jnp.linalg.eigvalsh(h), rtol=1e-10)
    np.testing.assert_allclose(q[7], eigh(h[7])[1], rtol=1e-12)
    chol = jax.jit(jax.vmap(cholesky))(h)
    np.testing.assert_allclose(chol, jnp.linalg.cholesky(h), rtol=1e-12)
    x = jax.jit(jax.vmap(lambda c, v: solve_triangular(c, v, lower=True)))(chol, b)
    np.testing.assert_allclose(jnp.einsum("bij,bj->bi", chol, x), b, rtol=1e-10, atol=1e-12)
    y = jax.vmap(lambda c, v: solve_triangular(c.T, v, lower=False))(chol, b)
    np.testing.assert_allclose(jnp.einsum("bji,bj->bi", chol, y), b, rtol=1e-10, atol=1e-12)
    # matrix right-hand sides, and a shared (unbatched) factor
    rhs = jax.random.normal(jax.random.PRNGKey(2), (batch, 6, 4))
    z = jax.vmap(lambda v: solve_triangular(chol[0], v, lower=True))(rhs)
    np.testing.assert_allclose(jnp.einsum("ij,bjk->bik", chol[0], z), rhs, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(solve_triangular(chol[0], rhs[0], lower=True), z[0], rtol=1e-10)


@pytest.mark.parametrize("copies", [1, 30])
def test_batched_cholesky_marks_a_matrix_that_is_not_positive_definite(copies):
    h = jnp.concatenate([jnp.stack([jnp.eye(3), jnp.diag(jnp.array([1.0, -1.0, 2.0])), jnp.ones((3, 3))])] * copies)
    chol = jax.vmap(cholesky)(h)
    assert bool(jnp.all(jnp.isfinite(chol[0])))
    assert not bool(jnp.all(jnp.isfinite(chol[1])))
    # exactly singular: a zero pivot (then NaN or inf below it), as LAPACK gives
    assert not bool(jnp.all(jnp.isfinite(chol[2])) & jnp.all(jnp.diagonal(chol[2]) > 0))
