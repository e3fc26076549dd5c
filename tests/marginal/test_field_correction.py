"""The second-order correction of a Markov field's Laplace marginal (numpyro_lm.marginal.field_correction):
against the expansion with the dense inverse (with a border too), against exact one-dimensional
integrals, and refused where the higher derivatives are not diagonal (nor linear predictors')."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.marginal.field_correction import (border_derivatives, diagonal_derivatives, field_skewness,
                                                  second_order_correction)

pytestmark = pytest.mark.usefixtures("x64")


def poisson_ar1(n, rho, sigma, y):
    """``phi(x) = -log p(y, x)`` of Poisson counts over an AR(1) field (the Gaussian's constants left out)."""
    q = (np.diag(np.r_[np.full(n - 1, 1 + rho**2), 1.0]) - rho * (np.eye(n, k=1) + np.eye(n, k=-1))) / sigma**2
    return lambda x: 0.5 * x @ q @ x + jnp.sum(jnp.exp(1.0 + x) - y * (1.0 + x))


def correction(phi, x, band):
    return jax.jit(lambda z, b: second_order_correction(phi, z, b, 1))(x, band)


def mode_and_band(phi, n):
    step = jax.jit(lambda x: x - jnp.linalg.solve(jax.hessian(phi)(x), jax.grad(phi)(x)))
    x = jnp.zeros(n)
    for _ in range(40):
        x = step(x)
    h = np.asarray(jax.hessian(phi)(x))
    return x, h, jnp.stack([jnp.diag(h), jnp.r_[0.0, jnp.diag(h, -1)]], axis=1)


@pytest.mark.parametrize("n, rho", [pytest.param(30, 0.8, marks=pytest.mark.slow), (9, 0.3), (3, 0.5)])  # several blocks; fewer than two; fewer than one
def test_the_band_gives_the_dense_expansion(n, rho):
    """The correction read off the band (a solve, the Takahashi blocks) equals the expansion's three
    terms with the dense inverse, its cubic sum over pairs up to 4 apart and beyond (here the
    neighbouring blocks reach 7: the pairs farther apart carry cubes of correlations below 0.8^8)."""
    y = np.random.default_rng(0).poisson(3.0, n).astype(float)
    phi = poisson_ar1(n, rho, 0.5, y)
    x, h, band = mode_and_band(phi, n)
    cov = np.linalg.inv(h)
    t = q = np.exp(1.0 + np.asarray(x))  # Poisson: every derivative beyond the second is exp(1 + x)
    sd2 = np.diag(cov)
    full = -np.sum(q * sd2**2) / 8 + (t * sd2) @ cov @ (t * sd2) / 8 + t @ cov**3 @ t / 12
    ours = float(correction(phi, x, band))
    assert abs(ours - full) < 1e-3 * abs(full)  # the pairs left out: < 0.8^24 of a term each


@pytest.mark.slow
def test_independent_coordinates_are_corrected_towards_their_exact_integrals():
    """Coordinates coupled to nothing (rho = 0): the log integral is a sum of one-dimensional ones,
    computed by quadrature. Laplace is off by 0.0327 nats over the 12 counts (counts 1-12); the
    corrected value by 0.0016 (the expansion's next order, O(1 / count^2) per coordinate)."""
    y = np.arange(1.0, 13.0)
    n = y.size
    phi = poisson_ar1(n, 0.0, 1.0, y)
    x, h, band = mode_and_band(phi, n)
    grid = np.linspace(-12.0, 8.0, 200001)
    exact = 0.0
    for i in range(n):
        f = -(0.5 * grid**2 + np.exp(1.0 + grid) - y[i] * (1.0 + grid))
        top = f.max()
        exact += top + np.log(np.sum(np.exp(f - top)) * (grid[1] - grid[0]))
    laplace = -float(phi(x)) + 0.5 * n * np.log(2 * np.pi) - 0.5 * np.linalg.slogdet(h)[1]
    corrected = laplace + float(correction(phi, x, band))
    assert abs(exact - laplace) > 0.02  # measured 0.0327
    assert abs(exact - corrected) < 0.1 * abs(exact - laplace)  # measured 0.0016


@pytest.mark.slow
def test_derivatives_beyond_the_second_that_couple_coordinates_are_refused():
    """A likelihood term over two neighbours (x_{i-1} x_i^2): the third derivatives are not diagonal,
    the sign probe sees it, and no correction is applied."""
    n = 12
    y = np.random.default_rng(1).poisson(3.0, n).astype(float)
    base = poisson_ar1(n, 0.5, 0.5, y)
    coupled = lambda x: base(x) + 0.1 * jnp.sum(x[1:] ** 2 * x[:-1])  # noqa: E731
    x, _, band = mode_and_band(base, n)
    assert float(diagonal_derivatives(base, x)[2]) < 1e-12
    assert float(diagonal_derivatives(coupled, x)[2]) > 1e-3
    assert float(correction(coupled, x, band)) == 0.0
    assert float(correction(base, x, band)) != 0.0


def bordered(n, y, z, extra=None):
    """``phi`` of Poisson counts over an AR(1) field with a border inside the vector (a level at
    position 0, a covariate's slope at 5), every count's rate ``exp(1 + f_i + mu + beta z_i)``;
    ``extra(f, mu)`` added: a term that is no function of the linear predictors."""
    rho, sigma, glob = 0.5, 0.5, (0, 5)
    q = (np.diag(np.r_[np.full(n - 1, 1 + rho**2), 1.0]) - rho * (np.eye(n, k=1) + np.eye(n, k=-1))) / sigma**2
    field = np.setdiff1d(np.arange(n + 2), glob)

    def phi(x):
        f, mu, beta = x[field], x[0], x[5]
        eta = 1.0 + f + mu + beta * z
        value = 0.5 * f @ q @ f + 0.5 * mu**2 + 0.5 * beta**2 + jnp.sum(jnp.exp(eta) - y * eta)
        return value if extra is None else value + extra(f, mu)

    step = jax.jit(lambda x: x - jnp.linalg.solve(jax.hessian(phi)(x), jax.grad(phi)(x)))  # one compile, not 50 eager
    x = jnp.zeros(n + 2)
    for _ in range(50):
        x = step(x)
    h = np.asarray(jax.hessian(phi)(x))
    hf = h[np.ix_(field, field)]
    band = jnp.stack([jnp.diag(hf), jnp.r_[0.0, jnp.diag(hf, -1)]], axis=1)
    return phi, x, h, band, (glob, jnp.asarray(h[np.ix_(field, glob)]), jnp.asarray(h[np.ix_(glob, glob)]))


def bordered_correction(phi, x, band, border):
    glob = border[0]
    return float(jax.jit(lambda z, b, hs: second_order_correction(phi, z, b, 1, (glob, *hs)))(x, band, border[1:]))


def test_a_border_gives_the_dense_expansion():
    """A level and a slope on every count's linear predictor: the band's correction over the
    predictors' covariance (the band's Takahashi blocks plus the border's rank two) equals the
    expansion's three terms with the dense third and fourth derivatives and the dense inverse
    (measured 1e-5 relative: the pairs beyond the blocks' reach, cubes of correlations of 0.5^8)."""
    n = 12
    rng = np.random.default_rng(0)
    y, z = rng.poisson(3.0, n).astype(float), rng.normal(size=n)
    phi, x, h, band, border = bordered(n, y, z)
    s = np.linalg.inv(h)
    third = np.asarray(jax.jacfwd(jax.hessian(phi))(x))
    fourth = np.asarray(jax.jacfwd(jax.jacfwd(jax.hessian(phi)))(x))
    dense = (-np.einsum("ijkl,ij,kl->", fourth, s, s) / 8 + np.einsum("ijk,lmn,ij,kl,mn->", third, third, s, s, s) / 8
             + np.einsum("ijk,lmn,il,jm,kn->", third, third, s, s, s) / 12)
    ours = bordered_correction(phi, x, band, border)
    assert abs(ours - dense) < 1e-3 * abs(dense)
    # the border's share is no rounding: held at its mode instead (the field's band alone), 15 % off
    assert abs(float(correction(lambda f: phi(jnp.concatenate([x[:1], f[:4], x[5:6], f[4:]])),
                                jnp.concatenate([x[1:5], x[6:]]), band)) - dense) > 0.05 * abs(dense)


def test_a_border_that_is_no_linear_predictor_is_refused():
    """A term mu^2 f_i^2: the third derivatives are no sum over linear predictors, the sign probe
    sees it, and no correction is applied."""
    n = 12
    rng = np.random.default_rng(0)
    y, z = rng.poisson(3.0, n).astype(float), rng.normal(size=n)
    phi, x, _, band, border = bordered(n, y, z, extra=lambda f, mu: 0.1 * mu**2 * jnp.sum(f**2))
    assert float(border_derivatives(phi, x, border[0])[3]) > 1e-3
    assert bordered_correction(phi, x, band, border) == 0.0
    plain, x, _, band, border = bordered(n, y, z)
    assert float(border_derivatives(plain, x, border[0])[3]) < 1e-12


def test_the_fields_skewness_is_the_dense_third_cumulants():
    """gamma_i = -sum_j t_j S_ij^3 / S_ii^1.5 from the band's blocks equals the dense sum (the pairs
    left out, more than 4 apart, carry cubes of correlations below 0.8^5 of a term)."""
    n = 30
    y = np.random.default_rng(0).poisson(3.0, n).astype(float)
    phi = poisson_ar1(n, 0.8, 0.5, y)
    x, h, band = mode_and_band(phi, n)
    cov = np.linalg.inv(h)
    t = np.exp(1.0 + np.asarray(x))
    dense = -(cov**3 @ t) / np.diag(cov) ** 1.5
    ours = np.asarray(jax.jit(lambda z, b: field_skewness(phi, z, b, 1))(x, band))
    np.testing.assert_allclose(ours, dense, rtol=0, atol=2e-3 * np.max(np.abs(dense)))
    assert np.all(dense < 0)  # Poisson counts: each conditional's left tail is the longer


def test_the_skewness_of_independent_coordinates_is_their_exact_conditionals_to_leading_order():
    """Coordinates coupled to nothing: each one's skewness from a fine grid against the formula,
    within 25 % (the formula's next order is O(1 / count) relative; counts 2-12 here)."""
    y = np.array([2.0, 5.0, 12.0])
    phi = poisson_ar1(y.size, 0.0, 1.0, y)
    x, _, band = mode_and_band(phi, y.size)
    ours = np.asarray(jax.jit(lambda z, b: field_skewness(phi, z, b, 1))(x, band))
    grid = np.linspace(-10.0, 6.0, 400001)
    for i in range(y.size):
        f = -(0.5 * grid**2 + np.exp(1.0 + grid) - y[i] * (1.0 + grid))
        w = np.exp(f - f.max())
        w /= w.sum()
        m = np.sum(w * grid)
        exact = np.sum(w * (grid - m) ** 3) / np.sum(w * (grid - m) ** 2) ** 1.5
        assert abs(ours[i] - exact) < 0.25 * abs(exact), (i, ours[i], exact)


def test_a_skewness_whose_derivatives_couple_coordinates_is_not_a_number():
    n = 12
    y = np.random.default_rng(1).poisson(3.0, n).astype(float)
    base = poisson_ar1(n, 0.5, 0.5, y)
    coupled = lambda x: base(x) + 0.1 * jnp.sum(x[1:] ** 2 * x[:-1])  # noqa: E731
    x, _, band = mode_and_band(base, n)
    assert np.all(np.isnan(np.asarray(jax.jit(lambda z, b: field_skewness(coupled, z, b, 1))(x, band))))


@pytest.mark.parametrize("border", [False, True])
def test_the_log_determinants_gradient_from_the_third_diagonal_is_the_dense_one(border):
    """``log_det_gradient`` (the third derivatives' diagonal times the predictors' variances, the
    border's rows summed over them) equals :math:`\\partial_a \\log\\det H = \\sum_{jk} \\phi_{ajk}
    (H^{-1})_{jk}` with the dense third derivatives and inverse, to float64 round-off."""
    from numpyro_lm.curvature.banded import BandedCurvature
    from numpyro_lm.curvature.banded_arrowhead import BandedArrowheadCurvature
    from numpyro_lm.marginal.field_correction import log_det_gradient

    n = 12
    rng = np.random.default_rng(0)
    y, z = rng.poisson(3.0, n).astype(float), rng.normal(size=n)
    if border:
        phi, x, h, band, (glob, h_fg, h_gg) = bordered(n, y, z)
        field = np.setdiff1d(np.arange(n + 2), glob)
        curvature = BandedArrowheadCurvature.from_blocks(BandedCurvature.from_band(band, 1), field, np.asarray(glob),
                                                         h_fg, h_gg)
    else:
        phi, glob = poisson_ar1(n, 0.6, 0.5, y), ()
        x, h, band = mode_and_band(phi, n)
        curvature = BandedCurvature.from_band(band, 1)
    gradient, error = jax.jit(lambda v: log_det_gradient(phi, v, curvature, glob))(x)
    dense = np.einsum("ajk,jk->a", np.asarray(jax.jacfwd(jax.hessian(phi))(x)), np.linalg.inv(h))
    np.testing.assert_allclose(gradient, dense, rtol=1e-9, atol=1e-12 * np.max(np.abs(dense)))  # round-off
    assert float(error) < 1e-12  # the derivatives are a sum over linear predictors: the check holds


def test_a_log_determinants_gradient_whose_derivatives_are_no_predictors_fails_its_check():
    """The term mu^2 f_i^2 again: the check reports it (the caller takes the gradient by reverse mode)."""
    from numpyro_lm.curvature.banded import BandedCurvature
    from numpyro_lm.curvature.banded_arrowhead import BandedArrowheadCurvature
    from numpyro_lm.marginal.field_correction import log_det_gradient
    from numpyro_lm.mode.hessian import structure_tol

    n = 12
    rng = np.random.default_rng(0)
    y, z = rng.poisson(3.0, n).astype(float), rng.normal(size=n)
    phi, x, _, band, (glob, h_fg, h_gg) = bordered(n, y, z, extra=lambda f, mu: 0.1 * mu**2 * jnp.sum(f**2))
    field = np.setdiff1d(np.arange(n + 2), glob)
    curvature = BandedArrowheadCurvature.from_blocks(BandedCurvature.from_band(band, 1), field, np.asarray(glob),
                                                     h_fg, h_gg)
    assert float(log_det_gradient(phi, x, curvature, glob)[1]) > structure_tol(x.dtype)
