"""Banded (block-tridiagonal) curvature: against dense linear algebra and the AR(1) closed form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.curvature import Curvature
from numpyro_lm.curvature.banded import BandedCurvature

pytestmark = pytest.mark.usefixtures("x64")


def random_band(dim, half_width, seed=0):
    """A random positive definite precision with entries only within ``half_width`` of the
    diagonal: ``(dense, lower band (dim, half_width + 1))``."""
    rng = np.random.default_rng(seed)
    h = np.zeros((dim, dim))
    for k in range(1, half_width + 1):
        off = rng.normal(size=dim - k)
        h += np.diag(off, -k) + np.diag(off, k)
    h += np.diag(np.abs(h).sum(1) + rng.uniform(0.5, 2.0, dim))  # diagonally dominant
    band = np.zeros((dim, half_width + 1))
    for k in range(half_width + 1):
        band[k:, k] = np.diagonal(h, -k)
    return h, band


# padded; aligned; one block; blocks unrolled (UNROLLED_BLOCK_MAX) and by LAPACK
@pytest.mark.parametrize("dim,half_width", [(11, 2), pytest.param(12, 1, marks=pytest.mark.slow),
                                            pytest.param(3, 2, marks=pytest.mark.slow), pytest.param(23, 5, marks=pytest.mark.slow),
                                            pytest.param(30, 9, marks=pytest.mark.slow)])
def test_operations_match_dense_linear_algebra(dim, half_width):
    """Every operation equals the dense algebra of the same precision, also where the dimension
    is not a multiple of the block size (padded) and where there are fewer than two blocks."""
    h, band = random_band(dim, half_width, seed=dim)
    v = np.random.default_rng(1).normal(size=(2, 3, dim))  # leading dims kept
    index = np.array([[0, dim - 1, 1], [2, 1, 1]])

    @jax.jit  # one program: each operation called eagerly compiles its own (12 s against 2.6 s)
    def operations(band, v):
        c = BandedCurvature.from_band(band, half_width)
        return c, {"positive": c.positive(), "precision": c.precision, "solve": c.solve(v), "matvec": c.matvec(v),
                   "root": c.inv_sqrt(jnp.eye(dim)).T, "whitened": c.whiten(c.inv_sqrt(v)), "logdet": c.logdet(),
                   "variance": c.variance(), "covariance_band": c.covariance_band(), "diagonal": c.diagonal(),
                   "block": c.block(index), "block_10": c.block(np.array([1, 0])),
                   "extreme": c.extreme_eigenvalues()}

    c, r = operations(jnp.asarray(band), v)
    assert isinstance(c, Curvature) and c.dim == dim and bool(r["positive"])
    np.testing.assert_allclose(r["precision"], h, rtol=1e-12, atol=1e-12)
    cov = np.linalg.inv(h)
    np.testing.assert_allclose(r["solve"], np.einsum("ij,abj->abi", cov, v), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(r["matvec"], np.einsum("ij,abj->abi", h, v), rtol=1e-12, atol=1e-12)
    root = np.asarray(r["root"])  # S with S S' = H^-1
    np.testing.assert_allclose(root @ root.T, cov, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(r["whitened"], v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(r["logdet"], np.linalg.slogdet(h)[1], rtol=1e-12)
    np.testing.assert_allclose(r["variance"], np.diag(cov), rtol=1e-10)
    diagonal, following = r["covariance_band"]  # H^-1's diagonal blocks and the ones right of them
    b, padded = half_width, c.diag.shape[0] * half_width
    full = np.eye(padded)
    full[:dim, :dim] = cov  # the padding's identity coordinates are coupled to nothing
    for i in range(diagonal.shape[0]):
        np.testing.assert_allclose(diagonal[i], full[i * b:(i + 1) * b, i * b:(i + 1) * b], rtol=1e-10, atol=1e-12)
        if i + 1 < diagonal.shape[0]:
            np.testing.assert_allclose(following[i], full[i * b:(i + 1) * b, (i + 1) * b:(i + 2) * b], rtol=1e-10,
                                       atol=1e-12)
    np.testing.assert_allclose(r["diagonal"], np.diag(h))
    np.testing.assert_allclose(r["block"], cov[index[..., :, None], index[..., None, :]], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(r["block_10"], cov[np.ix_([1, 0], [1, 0])], rtol=1e-10)
    w = np.linalg.eigvalsh(h)
    low, high = (float(x) for x in r["extreme"])
    assert w[0] * (1 - 1e-9) <= low <= 1.05 * w[0] and 0.95 * w[-1] <= high <= w[-1] * (1 + 1e-9)


@pytest.mark.parametrize("rho", [0.0, 0.6, 0.99])
def test_the_takahashi_variances_of_a_stationary_ar1_are_its_closed_form(rho):
    """A stationary AR(1) with innovation SD sigma has precision tridiagonal
    (1, 1 + rho^2, ..., 1 + rho^2, 1) / sigma^2 with -rho / sigma^2 beside the diagonal, and
    every marginal variance sigma^2 / (1 - rho^2), whatever the length: the recursion must
    give it at both ends and in the middle, also at rho = 0.99 (variance 50 sigma^2)."""
    n, sigma = 2000, 0.5
    band = np.zeros((n, 2))
    band[:, 0] = (1 + rho**2) / sigma**2
    band[[0, -1], 0] = 1 / sigma**2
    band[1:, 1] = -rho / sigma**2
    c = BandedCurvature.from_band(jnp.asarray(band), 1)
    np.testing.assert_allclose(c.variance(), sigma**2 / (1 - rho**2), rtol=1e-9)
    # log det Q = -2 n log sigma + log(1 - rho^2) (the stationary start's precision)
    np.testing.assert_allclose(c.logdet(), -2 * n * np.log(sigma) + np.log(1 - rho**2), rtol=1e-10)


def test_a_precision_that_is_not_positive_definite_is_flagged():
    h, band = random_band(9, 2, seed=3)
    band[4, 0] = -5.0  # a negative diagonal entry in the middle
    c = BandedCurvature.from_band(jnp.asarray(band), 2)
    assert not bool(c.positive())
    assert bool(jnp.all(jnp.isnan(c.variance())))


@pytest.mark.slow
def test_a_batch_of_banded_curvatures_vmaps():
    bands = np.stack([random_band(8, 2, seed=s)[1] for s in range(3)])
    batch = jax.vmap(lambda b: BandedCurvature.from_band(b, 2))(jnp.asarray(bands))
    logdets = jax.vmap(lambda c: c.logdet())(batch)
    for b, value in zip(bands, logdets):
        np.testing.assert_allclose(value, BandedCurvature.from_band(jnp.asarray(b), 2).logdet(), rtol=1e-12)


@pytest.mark.parametrize("glob", [[0], pytest.param([3, 9, 1], marks=pytest.mark.slow)])
def test_a_band_with_a_dense_border_matches_dense_linear_algebra(glob):
    """A banded field beside global coordinates placed anywhere among it (an intercept first,
    coefficients scattered): every operation equals the dense algebra."""
    from numpyro_lm.curvature.banded_arrowhead import BandedArrowheadCurvature

    n, g = 10, len(glob)
    dim = n + g
    h_field, band = random_band(n, 2, seed=7)
    rng = np.random.default_rng(8)
    b = 0.3 * rng.normal(size=(n, g))
    c = rng.normal(size=(g, g))
    c = c @ c.T + (2 + n) * np.eye(g)
    field_index = np.setdiff1d(np.arange(dim), glob)
    h = np.zeros((dim, dim))
    h[np.ix_(field_index, field_index)] = h_field
    h[np.ix_(field_index, glob)] = b
    h[np.ix_(glob, field_index)] = b.T
    h[np.ix_(glob, glob)] = c
    v = np.random.default_rng(9).normal(size=(3, dim))
    index = np.array([[glob[0], 2, 5]])

    @jax.jit  # one program: each operation called eagerly compiles its own
    def operations(band, b, c, v):
        curv = BandedArrowheadCurvature.from_blocks(BandedCurvature.from_band(band, 2), field_index, np.asarray(glob),
                                                    b, c)
        return curv, {"positive": curv.positive(), "precision": curv.precision, "solve": curv.solve(v),
                      "root": curv.inv_sqrt(jnp.eye(dim)).T, "whitened": curv.whiten(curv.inv_sqrt(v)),
                      "logdet": curv.logdet(), "variance": curv.variance(), "diagonal": curv.diagonal(),
                      "block": curv.block(index)}

    curv, r = operations(jnp.asarray(band), jnp.asarray(b), jnp.asarray(c), v)
    assert isinstance(curv, Curvature) and curv.dim == dim and bool(r["positive"])
    np.testing.assert_allclose(r["precision"], h, rtol=1e-12, atol=1e-12)
    cov = np.linalg.inv(h)
    np.testing.assert_allclose(r["solve"], v @ cov, rtol=1e-10, atol=1e-12)
    root = np.asarray(r["root"])
    np.testing.assert_allclose(root @ root.T, cov, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(r["whitened"], v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(r["logdet"], np.linalg.slogdet(h)[1], rtol=1e-12)
    np.testing.assert_allclose(r["variance"], np.diag(cov), rtol=1e-10)
    np.testing.assert_allclose(r["diagonal"], np.diag(h))
    np.testing.assert_allclose(r["block"], cov[index[..., :, None], index[..., None, :]], rtol=1e-10)


@pytest.mark.parametrize("dim,half_width", [(11, 2), (7, 1), pytest.param(30, 9, marks=pytest.mark.slow)])
def test_a_weighted_sum_of_inverses_is_the_dense_sum(dim, half_width):
    """``weighted_inverse`` over a stack of points (padded blocks, a tridiagonal band, blocks by
    LAPACK) is :math:`\\sum_k w_k H_k^{-1}` to round-off; a point of zero weight adds nothing even
    where it is not positive definite, and one of positive weight that is not makes it NaN."""
    from numpyro_lm.curvature.banded import weighted_inverse

    hs, bands = zip(*[random_band(dim, half_width, seed=s) for s in range(3)])
    broken = np.array(bands[0])
    broken[:, 0] *= -1.0  # a negative diagonal: not positive definite
    stack = jax.vmap(lambda b: BandedCurvature.from_band(b, half_width))(jnp.asarray(np.stack([*bands, broken])))
    w = np.array([0.2, 0.5, 0.3, 0.0])
    got = jax.jit(weighted_inverse)(stack, jnp.asarray(w))
    want = sum(wk * np.linalg.inv(h) for wk, h in zip(w, hs))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * np.max(np.abs(want)))  # float64 round-off
    assert np.all(np.isnan(jax.jit(weighted_inverse)(stack, jnp.asarray([0.2, 0.5, 0.0, 0.3]))))


@pytest.mark.parametrize("glob", [[0], [3, 9, 1]])
def test_a_weighted_sum_of_bordered_inverses_is_the_dense_sum(glob):
    """The same with a dense border placed anywhere among the field (``banded_arrowhead``)."""
    from numpyro_lm.curvature.banded_arrowhead import BandedArrowheadCurvature, weighted_inverse

    n, g = 10, len(glob)
    dim = n + g
    field_index = np.setdiff1d(np.arange(dim), glob)
    hs, parts = [], []
    for s in range(3):
        h_field, band = random_band(n, 2, seed=7 + s)
        rng = np.random.default_rng(8 + s)
        b = 0.3 * rng.normal(size=(n, g))
        c = rng.normal(size=(g, g))
        c = c @ c.T + (2 + n) * np.eye(g)
        h = np.zeros((dim, dim))
        h[np.ix_(field_index, field_index)] = h_field
        h[np.ix_(field_index, glob)] = b
        h[np.ix_(glob, field_index)] = b.T
        h[np.ix_(glob, glob)] = c
        hs.append(h)
        parts.append((band, b, c))
    stacked = [jnp.asarray(np.stack(a)) for a in zip(*parts)]
    stack = jax.vmap(lambda band, b, c: BandedArrowheadCurvature.from_blocks(
        BandedCurvature.from_band(band, 2), field_index, np.asarray(glob), b, c))(*stacked)
    w = np.array([0.3, 0.0, 0.7])
    got = jax.jit(weighted_inverse)(stack, jnp.asarray(w))
    want = sum(wk * np.linalg.inv(h) for wk, h in zip(w, hs))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * np.max(np.abs(want)))  # float64 round-off
