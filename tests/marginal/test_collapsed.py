"""The density of the hyperparameters and globals with the scalar blocks integrated out
(numpyro_lm.marginal.collapsed): against closed forms and one-dimensional quadrature."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from numpyro_lm.marginal.collapsed import block_modes, collapsed_check, collapsed_log_density

Y = np.array([0.3, -1.2, 2.0, 0.7, -0.1])
NOISE = 0.5


def gaussian_blocks(v):
    """v = (mu, z_1..z_5): z_j ~ N(mu, 1), y_j ~ N(z_j, NOISE); mu ~ N(0, 2)."""
    mu, z = v[0], v[1:]
    return (jnp.sum(jax.scipy.stats.norm.logpdf(z, mu, 1.0)) + jnp.sum(jax.scipy.stats.norm.logpdf(Y, z, NOISE))
            + jax.scipy.stats.norm.logpdf(mu, 0.0, 2.0))


def gaussian_exact(mu):
    """log p(mu, y) and each block's conditional mean and variance, in closed form."""
    log_p = np.sum(stats.norm.logpdf(Y, mu, np.sqrt(1 + NOISE**2))) + stats.norm.logpdf(mu, 0.0, 2.0)
    var = 1.0 / (1.0 + 1.0 / NOISE**2)
    return log_p, var * (mu + Y / NOISE**2), np.full(Y.size, var)


@pytest.mark.parametrize("local", [np.arange(1, 6), slice(1, 6)])
def test_gaussian_blocks_integrate_exactly(x64, local):
    """Laplace is exact on Gaussian blocks, and the quadrature's moments are the conditional's,
    with the blocks given as indices or as a range."""
    for mu in (-1.0, 0.4):
        start = jnp.concatenate([jnp.array([mu]), jnp.asarray(Y) + 3.0])  # 3-6 SDs from the modes
        log_p, v, mean, var = collapsed_log_density(gaussian_blocks, start, local, tol=1e-10)
        exact = gaussian_exact(mu)
        # float64 rounding of a few terms; the quadrature of a Gaussian is exact
        np.testing.assert_allclose(float(log_p), exact[0], rtol=0, atol=1e-9)
        np.testing.assert_allclose(mean, exact[1], rtol=0, atol=1e-9)
        np.testing.assert_allclose(v[1:], exact[1], rtol=0, atol=1e-9)  # the modes: the means here
        np.testing.assert_allclose(var, exact[2], rtol=1e-9)


COUNTS = np.array([0.0, 2.0, 0.0, 1.0])
PRIOR_SD = 2.0


def poisson_blocks(v):
    """v = (beta, z_1..z_4): z_j ~ N(0, 2), y_j ~ Poisson(exp(beta + z_j)), few counts: skewed conditionals."""
    beta, z = v[0], v[1:]
    rate = beta + z
    return (jnp.sum(-0.5 * (z / PRIOR_SD) ** 2 - 0.5 * jnp.log(2 * jnp.pi * PRIOR_SD**2))
            + jnp.sum(COUNTS * rate - jnp.exp(rate)))


def test_skewed_blocks_match_one_dimensional_quadrature(x64):
    """Each block's integral, mean and variance against scipy's adaptive quadrature; Laplace's
    integral alone is off by a few hundredths of a nat, its mean (the mode) by 0.3 SD."""
    beta = 0.2
    integrand = [lambda z, j=j, p=p: z**p * np.exp(-0.5 * (z / PRIOR_SD) ** 2 - 0.5 * np.log(2 * np.pi * PRIOR_SD**2) + COUNTS[j] * (beta + z)
                                                   - np.exp(beta + z)) for j in range(4) for p in range(3)]
    moments = np.array([integrate.quad(f, -30, 30, epsabs=0, epsrel=1e-12)[0] for f in integrand]).reshape(4, 3)
    exact_log_p = np.sum(np.log(moments[:, 0]))
    exact_mean = moments[:, 1] / moments[:, 0]
    exact_var = moments[:, 2] / moments[:, 0] - exact_mean**2
    log_p, v, mean, var = collapsed_log_density(poisson_blocks, jnp.array([beta, 0.0, 0.0, 0.0, 0.0]),
                                                np.arange(1, 5), tol=1e-10, num_nodes=9)
    a = -jnp.diag(jax.hessian(poisson_blocks)(v))[1:]
    laplace = float(poisson_blocks(v)) + 2 * np.log(2 * np.pi) - 0.5 * float(jnp.sum(jnp.log(a)))
    assert abs(laplace - exact_log_p) > 0.02  # what the quadrature is for
    assert np.max(np.abs(v[1:] - exact_mean) / np.sqrt(exact_var)) > 0.2
    # nine nodes on these strongly skewed integrands (a zero count under a wide prior): measured
    # 2.6e-3 nats over the four blocks (Laplace 0.030), means within 0.0024 SD, variances 0.5%
    assert abs(float(log_p) - exact_log_p) < min(0.005, float(abs(laplace - exact_log_p)) / 5)
    assert np.max(np.abs(np.asarray(mean) - exact_mean) / np.sqrt(exact_var)) < 0.005
    np.testing.assert_allclose(var, exact_var, rtol=0.01)


def test_block_modes_say_where_a_block_has_no_mode(x64):
    """A block with no curvature (a flat direction) is not a mode found, and the density is NaN."""
    def flat_block(v):
        return -0.5 * v[1] ** 2 + 0.0 * v[2]

    _, _, found = block_modes(flat_block, jnp.zeros(3), np.array([1, 2]), tol=1e-8)
    assert not bool(found)
    assert np.isnan(float(collapsed_log_density(flat_block, jnp.zeros(3), np.array([1, 2]), 1e-8)[0]))


@pytest.mark.parametrize("offset_sd", [0.0, 0.3])
def test_collapsed_check_measures_the_conditionals_error(x64, offset_sd):
    """With the exact conditionals as the proposal every block's distance is zero and the
    collapsed weights are constant (q(mu) the exact posterior of mu); with the means moved by
    0.3 conditional SDs (and the variances right) each distance is 0.3 SD."""
    post_var = 1.0 / (1.0 / 4.0 + Y.size / (1 + NOISE**2))
    post_mean = post_var * Y.sum() / (1 + NOISE**2)
    rng = np.random.default_rng(0)
    mus = post_mean + np.sqrt(post_var) * rng.standard_normal(40)
    flat = np.concatenate([mus[:, None], rng.standard_normal((40, 5))], axis=1)

    def proposal(row, extra):
        mean, var = gaussian_conditional(row[0])
        log_q = jax.scipy.stats.norm.logpdf(row[0], post_mean, np.sqrt(post_var))
        return mean + offset_sd * jnp.sqrt(var), var, log_q

    check = collapsed_check(gaussian_blocks, jnp.asarray(flat), np.arange(1, 6), proposal, jnp.zeros(40), 1e-10, 7)
    log_w = np.asarray(check.log_p - check.log_q)
    assert np.ptp(log_w) < 1e-8  # p(mu, y) / q(mu) = p(y): constant
    np.testing.assert_allclose(log_w[0], stats.multivariate_normal.logpdf(
        Y, np.zeros(5), 4.0 + np.eye(5) * (1 + NOISE**2)), atol=1e-9)
    sd = np.sqrt(1.0 / (1.0 + 1.0 / NOISE**2))
    np.testing.assert_allclose(check.block_distance, offset_sd * sd, atol=1e-9)


def gaussian_conditional(mu):
    """Each block's conditional mean and variance given mu (traceable)."""
    var = 1.0 / (1.0 + 1.0 / NOISE**2)
    return var * (mu + jnp.asarray(Y) / NOISE**2), jnp.full(Y.size, var)
