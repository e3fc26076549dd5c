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


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
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


def random_arrowhead(num_blocks, size, num_global, seed=0, order=None):
    """A random positive definite block-arrowhead precision with its coordinates shuffled, or in
    ``order`` ("locals first", "globals first": a plate's site beside the globals)."""
    from numpyro_lm.curvature import ArrowheadCurvature

    rng = np.random.default_rng(seed)
    dim = num_blocks * size + num_global
    orders = {None: rng.permutation(dim), "locals first": np.arange(dim),
              "globals first": np.roll(np.arange(dim), -num_global)}
    order = orders[order]
    local, glob = order[: num_blocks * size].reshape(num_blocks, size), order[num_blocks * size:]
    a = rng.normal(size=(num_blocks, size, size))
    a = a @ np.swapaxes(a, 1, 2) + 2 * np.eye(size)
    b = 0.3 * rng.normal(size=(num_blocks, size, num_global))
    c = rng.normal(size=(num_global, num_global))
    c = c @ c.T + (2 + num_blocks) * np.eye(num_global)
    return ArrowheadCurvature.from_blocks(local, glob, jnp.asarray(a), jnp.asarray(b), jnp.asarray(c))


def random_diagonal_with_block(seed=0):
    from numpyro_lm.curvature import DiagonalCurvature

    rng = np.random.default_rng(seed)
    p = rng.uniform(0.5, 3.0, size=7)
    m = rng.normal(size=(3, 3))
    return DiagonalCurvature(jnp.asarray(p), jnp.asarray([5, 1, 3]), jnp.asarray(m @ m.T + np.eye(3)))


def random_lowrank_update(seed=0, rank=3):
    """An arrowhead ``M`` plus ``Q B Q'`` with ``B`` indefinite (one negative eigenvalue) and
    ``H`` still positive definite, as the likelihood of a regression gives with the prior's
    non-positive blocks."""
    from numpyro_lm.curvature import LowRankUpdateCurvature

    base = random_arrowhead(4, 2, 3, seed=seed)
    rng = np.random.default_rng(seed + 10)
    q = np.linalg.qr(rng.normal(size=(base.dim, rank)))[0]
    b = np.diag(np.r_[-0.5, np.linspace(1.0, 4.0, rank - 1)])
    assert np.linalg.eigvalsh(np.asarray(base.precision) + q @ b @ q.T)[0] > 0
    return LowRankUpdateCurvature.from_update(base, jnp.asarray(q), jnp.asarray(b))


STRUCTURED = {
    "arrowhead": lambda: random_arrowhead(4, 2, 3),
    "lowrank-update": random_lowrank_update,
    "arrowhead-scalar-blocks": lambda: random_arrowhead(6, 1, 2, seed=1),
    "arrowhead-no-globals": lambda: random_arrowhead(3, 2, 0, seed=2),
    "arrowhead-locals-first": lambda: random_arrowhead(4, 2, 3, seed=4, order="locals first"),
    "arrowhead-globals-first": lambda: random_arrowhead(6, 1, 2, seed=5, order="globals first"),
    "diagonal-with-block": random_diagonal_with_block,
}


@pytest.mark.parametrize("name", sorted(STRUCTURED))
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_structured_operations_match_dense_linear_algebra(name):
    """Every operation of a structured curvature equals the dense algebra of its precision
    (built column by column from ``solve``: no structure assumed in the reference)."""
    c = STRUCTURED[name]()
    d = c.dim
    cov = np.asarray(c.solve(jnp.eye(d)))
    h = np.linalg.inv(cov)
    assert isinstance(c, Curvature) and bool(c.positive())
    np.testing.assert_allclose(cov, cov.T, atol=1e-12)
    if hasattr(c, "precision"):
        np.testing.assert_allclose(c.precision, h, rtol=1e-10, atol=1e-10)
    v = np.random.default_rng(3).normal(size=(3, d))
    root = np.asarray(c.inv_sqrt(jnp.eye(d))).T
    np.testing.assert_allclose(root @ root.T, cov, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c.whiten(c.inv_sqrt(v)), v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c.logdet(), np.linalg.slogdet(h)[1], rtol=1e-10)
    np.testing.assert_allclose(c.variance(), np.diag(cov), rtol=1e-10)
    index = np.array([[0, 3, 5], [4, 1, 1]])
    np.testing.assert_allclose(c.block(index), cov[index[..., :, None], index[..., None, :]], rtol=1e-10, atol=1e-14)
    w = np.linalg.eigvalsh(h)
    low, high = (float(x) for x in c.extreme_eigenvalues())
    # exact for the diagonal; power iteration for the arrowhead: a lower bound on the
    # largest eigenvalue and an upper bound on the smallest, close after 50 iterations
    assert w[0] * (1 - 1e-9) <= low <= 1.05 * w[0] and 0.95 * w[-1] <= high <= w[-1] * (1 + 1e-9)


@pytest.mark.parametrize("order", [None, "locals first", "globals first"])
def test_arrowhead_parts_split_and_join_as_index_arrays_do(order):
    """Contiguous blocks beside the globals are read as slices (``placement``), anything else
    (shuffled, or indices traced under jit) through the index arrays; both give the same parts,
    and joining the parts gives the vector back."""
    from numpyro_lm.curvature.arrowhead import join_parts, placement, split_parts

    c = random_arrowhead(5, 2, 3, seed=6, order=order)
    local, glob = np.asarray(c.local_index), np.asarray(c.global_index)
    assert (placement(local, glob) is None) == (order is None)
    v = jnp.asarray(np.random.default_rng(7).normal(size=(4, c.dim)))
    parts = split_parts(local, glob, v)
    np.testing.assert_array_equal(parts[0], np.asarray(v)[:, local])
    np.testing.assert_array_equal(parts[1], np.asarray(v)[:, glob])
    np.testing.assert_array_equal(join_parts(local, glob, *parts), v)
    traced = jax.jit(lambda l, g: join_parts(l, g, *split_parts(l, g, v)))(local, glob)
    np.testing.assert_array_equal(traced, v)
    np.testing.assert_allclose(c.matvec(v), np.asarray(v) @ np.asarray(c.precision).T, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_arrowhead_flags_a_block_that_is_not_positive_definite():
    c = random_arrowhead(4, 2, 3)
    bad = c.a.at[2].set(-c.a[2])
    from numpyro_lm.curvature import ArrowheadCurvature

    flagged = ArrowheadCurvature.from_blocks(c.local_index, c.global_index, bad, c.b, c.c)
    assert not bool(flagged.positive())
    assert np.all(np.isnan(np.asarray(flagged.variance())))
    local, schur = flagged.failing_blocks()
    assert bool(local[2]) and int(np.sum(np.asarray(local))) == 1


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_lowrank_update_flags_a_direction_that_is_not_positive():
    """A negative update larger than the base along one direction: ``positive()`` is false,
    variances are NaN, ``failing_directions`` points at that direction, and ``modified()`` is
    the positive definite counterpart with the same eigenvectors."""
    from numpyro_lm.curvature import LowRankUpdateCurvature

    base = random_arrowhead(4, 2, 3)
    e = np.zeros((base.dim, 1))
    e[5, 0] = 1.0
    h = np.asarray(base.precision)
    c = LowRankUpdateCurvature.from_update(base, jnp.asarray(e), jnp.asarray([[-3.0 * h[5, 5]]]))
    assert np.linalg.eigvalsh(h - 3.0 * h[5, 5] * e @ e.T)[0] < 0
    assert not bool(c.positive())
    assert np.all(np.isnan(np.asarray(c.variance())))
    assert int(np.argmax(np.asarray(c.failing_directions()))) == 5
    fixed = c.modified()
    assert bool(fixed.positive())
    # along x = S y (y the update's direction) the quadratic form is 1 + mu < 0 for H and
    # |1 + mu| for the modified precision; on S-orthogonal directions they agree
    x = np.asarray(base.inv_sqrt(c.y[:, 0]))
    quad = x @ np.asarray(c.precision) @ x
    assert quad < 0
    np.testing.assert_allclose(x @ np.asarray(fixed.precision) @ x, -quad, rtol=1e-10)
    other = np.asarray(base.inv_sqrt(jnp.asarray(np.linalg.qr(np.c_[c.y, np.eye(base.dim)[:, :1]])[0][:, 1])))
    np.testing.assert_allclose(np.asarray(fixed.precision) @ other, np.asarray(c.precision) @ other, rtol=1e-10,
                               atol=1e-10)


def test_dense_curvature_resolves_a_badly_scaled_precision_in_float32(x32):
    """Coordinates on scales 1e-3 to 1e3 around a well-conditioned correlation: H's condition
    number is 1e12, far beyond float32, its Jacobi-scaled D H D's about 10. The unscaled
    eigendecomposition called H singular (eigenvalues below sqrt(D) eps max are zero);
    the scaled one gives every variance to float32's precision."""
    corr = np.array([[1.0, 0.5, 0.2], [0.5, 1.0, 0.3], [0.2, 0.3, 1.0]])
    scales = np.array([1e-3, 1.0, 1e3])
    h64 = corr / scales[:, None] / scales[None, :]  # the precision of a covariance s_i s_j R^-1_ij
    c = DenseCurvature.from_precision(jnp.asarray(h64, jnp.float32))
    assert c.eigenvalues.dtype == jnp.float32 and bool(c.positive())
    exact = np.diag(np.linalg.inv(h64))
    # float32 round-off times the scaled condition number (about 10): 1e-5 relative
    np.testing.assert_allclose(np.asarray(c.variance(), np.float64), exact, rtol=1e-5)
    np.testing.assert_allclose(float(c.logdet()), np.linalg.slogdet(h64)[1], rtol=1e-5)
    np.testing.assert_allclose(float(c.scaled_condition()), np.linalg.cond(corr), rtol=1e-4)
    eigenvalues = np.linalg.eigvalsh(h64)
    with np.errstate(divide="ignore"):
        unscaled_floor = np.sqrt(3) * np.finfo(np.float32).eps * eigenvalues[-1]
    assert eigenvalues[0] < unscaled_floor  # what an unscaled float32 decomposition could not resolve


def test_a_curvature_beyond_peaked_is_not_positive_where_the_precision_cannot_span_it(x32):
    """A search run into a collapsing scale (a funnel): scaling would make its Hessian look fine.
    Beyond PEAKED and with a diagonal wider than float32 resolves, it is refused as an unscaled
    decomposition refused it; in float64 the same diagonal is within resolution (and was answered)."""
    assert not bool(DenseCurvature.from_precision(jnp.diag(jnp.array([1e13, 0.5]))).positive())
    assert bool(DenseCurvature.from_precision(jnp.diag(jnp.array([1e11, 0.5]))).positive())  # below PEAKED
    with jax.enable_x64(True):
        assert bool(DenseCurvature.from_precision(jnp.diag(jnp.array([1e13, 0.5], jnp.float64))).positive())
