"""The curvature protocol: every implementation agrees with dense linear algebra."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from numpyro_lm.curvature import CholeskyCurvature, Curvature, DenseCurvature, Gaussian, covariance

pytestmark = pytest.mark.usefixtures("x64")
IMPLEMENTATIONS = [DenseCurvature, CholeskyCurvature]


def random_precision(d=5, seed=0):
    a = jax.random.normal(jax.random.PRNGKey(seed), (d, d))
    return a @ a.T + 0.5 * jnp.eye(d)


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_operations_match_dense_linear_algebra(kind):
    h = random_precision()
    cov = jnp.linalg.inv(h)
    c = kind.from_precision(h)
    assert isinstance(c, Curvature) and c.dim == 5 and bool(c.positive())
    v = jax.random.normal(jax.random.PRNGKey(1), (3, 5))
    np.testing.assert_allclose(c.solve(v), v @ cov, rtol=1e-10)
    np.testing.assert_allclose(c.solve(v[0]), cov @ v[0], rtol=1e-10)
    root = c.inv_sqrt(jnp.eye(5)).T  # S, with S S' = H^-1
    np.testing.assert_allclose(root @ root.T, cov, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(c.whiten(c.inv_sqrt(v)), v, rtol=1e-10, atol=1e-12)  # S^-1 S = I
    np.testing.assert_allclose(c.logdet(), jnp.linalg.slogdet(h)[1], rtol=1e-12)
    np.testing.assert_allclose(c.variance(), jnp.diag(cov), rtol=1e-10)
    index = np.array([[0, 3], [4, 1]])
    np.testing.assert_allclose(c.block(index), cov[index[..., :, None], index[..., None, :]], rtol=1e-10)
    np.testing.assert_allclose(covariance(c), cov, rtol=1e-10)
    w, q = c.spectrum()
    np.testing.assert_allclose(w, jnp.linalg.eigvalsh(h), rtol=1e-10)
    np.testing.assert_allclose((q * w) @ q.T, h, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_a_batch_of_curvatures_vmaps(kind):
    hs = jnp.stack([random_precision(seed=s) for s in range(3)])
    cs = jax.vmap(kind.from_precision)(hs)
    np.testing.assert_allclose(jax.vmap(lambda c: c.variance())(cs), jax.vmap(lambda h: jnp.diag(jnp.linalg.inv(h)))(hs),
                               rtol=1e-10)


def test_dense_curvature_round_trips_through_the_covariance():
    h = random_precision()
    c = DenseCurvature.from_covariance(jnp.linalg.inv(h))
    np.testing.assert_allclose(c.precision, h, rtol=1e-9)
    assert bool(jnp.all(jnp.diff(c.eigenvalues) > 0))  # ascending, as from_precision gives


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_singular_or_indefinite_precision_is_flagged(kind):
    singular = jnp.array([[1.0, 1.0], [1.0, 1.0]])
    indefinite = jnp.diag(jnp.array([1.0, -1.0]))
    for h in (singular, indefinite):
        c = kind.from_precision(h)
        assert not bool(c.positive())
    # rounding can leave a zero eigenvalue slightly positive: still singular, NaN variances
    assert not bool(jnp.all(jnp.isfinite(DenseCurvature.from_precision(singular).variance())))


def test_gaussian_samples_and_density():
    h = random_precision(3)
    g = Gaussian(jnp.array([1.0, 0.0, -1.0]), DenseCurvature.from_precision(h))
    x = jax.random.normal(jax.random.PRNGKey(2), (4, 3))
    np.testing.assert_allclose(g.log_prob(x), stats.multivariate_normal(g.mean, np.linalg.inv(h)).logpdf(x), rtol=1e-10)
    n = 40000
    draws = g.sample(jax.random.PRNGKey(0), n)
    sd = np.sqrt(np.diag(np.linalg.inv(h)))
    # 5 Monte Carlo standard errors of the mean and of the covariance entries
    assert np.all(np.abs(draws.mean(0) - g.mean) < 5 * sd / np.sqrt(n))
    np.testing.assert_array_less(np.abs(np.cov(draws.T) - g.cov), 5 * np.sqrt(2.0 / n) * np.outer(sd, sd))
    np.testing.assert_allclose(g.sample(jax.random.PRNGKey(0), 10), draws[:10], rtol=1e-12)  # the same noise
