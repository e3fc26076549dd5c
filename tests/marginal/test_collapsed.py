"""The density of the hyperparameters and globals with the scalar blocks integrated out
(numpyro_lm.marginal.collapsed): against closed forms and one-dimensional quadrature."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from numpyro_lm.marginal.collapsed import block_constants, collapsed_quadrature, collapsed_value
from numpyro_lm.marginal.quadrature import block_quadrature

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


def _collapsed_log_p(log_density, flat, local, proposal, extras, rows=3, num_nodes=5):
    """log p(r, y) at each row: the three parts of numpyro_lm.marginal.collapsed."""
    value, log_q = collapsed_value(log_density, flat, local, proposal, extras, rows)
    quadrature = collapsed_quadrature(log_density, flat, local, proposal, extras, rows, num_nodes)
    precision = jax.vmap(lambda row, e: 1.0 / proposal(row, e)[1])(flat, extras)
    constants = np.array([block_constants(p[None])[0] for p in np.asarray(precision)])
    return np.asarray(value) + np.asarray(quadrature.log_ratio) + constants, np.asarray(log_q), quadrature


@pytest.mark.parametrize("local", [np.arange(1, 6), slice(1, 6)])
@pytest.mark.parametrize("offset_sd", [0.0, 0.3])
def test_gaussian_blocks_integrate_exactly(x64, local, offset_sd):
    """Gaussian blocks about their exact conditionals: the collapsed density is p(mu, y) in closed
    form, and with the centres moved by 0.3 conditional SDs still (the 5-node rule integrates the
    Gaussian about an offset centre to 1e-9), while each block's distance is that offset; the
    blocks given as indices or as a range."""
    mus = np.array([-1.0, 0.4, 2.0])
    flat = jnp.asarray(np.concatenate([mus[:, None], np.tile(Y + 3.0, (3, 1))], axis=1))  # blocks anywhere

    def proposal(row, extra):
        mean, var = gaussian_conditional(row[0])
        return mean + offset_sd * jnp.sqrt(var), var, jnp.zeros(())

    log_p, _, quadrature = _collapsed_log_p(gaussian_blocks, flat, local, proposal, jnp.zeros(3))
    exact = np.array([gaussian_exact(mu)[0] for mu in mus])
    np.testing.assert_allclose(log_p, exact, rtol=0, atol=1e-8)
    sd = np.sqrt(gaussian_exact(0.0)[2])
    # (the 5-node rule's mean about a centre 0.3 SD off: 2e-7 relative)
    np.testing.assert_allclose(quadrature.block_distance, offset_sd * sd, rtol=1e-6, atol=1e-12)


COUNTS = np.array([0.0, 2.0, 0.0, 1.0])
PRIOR_SD = 2.0


def poisson_blocks(v):
    """v = (beta, z_1..z_4): z_j ~ N(0, 2), y_j ~ Poisson(exp(beta + z_j)), few counts: skewed conditionals."""
    beta, z = v[0], v[1:]
    rate = beta + z
    return (jnp.sum(-0.5 * (z / PRIOR_SD) ** 2 - 0.5 * jnp.log(2 * jnp.pi * PRIOR_SD**2))
            + jnp.sum(COUNTS * rate - jnp.exp(rate)))


@pytest.mark.parametrize("offset_sd", [pytest.param(0.0, marks=pytest.mark.slow), 0.3])
def test_skewed_blocks_match_one_dimensional_quadrature(x64, offset_sd):
    """Each block's integral, mean and variance against scipy's adaptive quadrature, about the
    blocks' modes or 0.3 SD beside them; Laplace's integral is off by a few hundredths of a nat,
    its mean (the mode) by 0.3 SD."""
    beta = 0.2
    integrand = [lambda z, j=j, p=p: z**p * np.exp(-0.5 * (z / PRIOR_SD) ** 2 - 0.5 * np.log(2 * np.pi * PRIOR_SD**2)
                                                   + COUNTS[j] * (beta + z) - np.exp(beta + z))
                 for j in range(4) for p in range(3)]
    moments = np.array([integrate.quad(f, -30, 30, epsabs=0, epsrel=1e-12)[0] for f in integrand]).reshape(4, 3)
    exact_log_p = np.sum(np.log(moments[:, 0]))
    exact_mean = moments[:, 1] / moments[:, 0]
    exact_var = moments[:, 2] / moments[:, 0] - exact_mean**2
    v = jnp.array([beta, 0.0, 0.0, 0.0, 0.0])
    for _ in range(50):  # Newton on the separable blocks
        v = v.at[1:].add(-jax.grad(poisson_blocks)(v)[1:] / jnp.diag(jax.hessian(poisson_blocks)(v))[1:])
    a = -jnp.diag(jax.hessian(poisson_blocks)(v))[1:]
    laplace = float(poisson_blocks(v)) + float(block_constants(a[None])[0])
    assert abs(laplace - exact_log_p) > 0.02  # what the quadrature is for
    assert np.max(np.abs(v[1:] - exact_mean) / np.sqrt(exact_var)) > 0.2
    centre = v.at[1:].add(offset_sd / jnp.sqrt(a))
    log_ratio, offset, var = block_quadrature(poisson_blocks, centre, np.arange(1, 5), a, num_nodes=9)
    log_p = float(poisson_blocks(centre)) + float(block_constants(a[None])[0]) + float(jnp.sum(log_ratio))
    # nine nodes on these strongly skewed integrands (a zero count under a wide prior): measured
    # 2.6e-3 nats over the four blocks about the modes (Laplace 0.030), means within 0.0024 SD,
    # variances 0.5%
    assert abs(log_p - exact_log_p) < min(0.005, float(abs(laplace - exact_log_p)) / 5)
    mean = np.asarray(centre[1:] + offset)
    assert np.max(np.abs(mean - exact_mean) / np.sqrt(exact_var)) < 0.005
    np.testing.assert_allclose(var, exact_var, rtol=0.01)


@pytest.mark.slow
def test_collapsed_weights_of_an_exact_proposal_are_constant(x64):
    """Draws of mu from its exact posterior with the blocks' exact conditionals: p(mu, y) / q(mu)
    is the evidence p(y) at every draw."""
    post_var = 1.0 / (1.0 / 4.0 + Y.size / (1 + NOISE**2))
    post_mean = post_var * Y.sum() / (1 + NOISE**2)
    rng = np.random.default_rng(0)
    mus = post_mean + np.sqrt(post_var) * rng.standard_normal(40)
    flat = jnp.asarray(np.concatenate([mus[:, None], rng.standard_normal((40, 5))], axis=1))

    def proposal(row, extra):
        mean, var = gaussian_conditional(row[0])
        return mean, var, jax.scipy.stats.norm.logpdf(row[0], post_mean, np.sqrt(post_var))

    log_p, log_q, _ = _collapsed_log_p(gaussian_blocks, flat, np.arange(1, 6), proposal, jnp.zeros(40), rows=7)
    log_w = log_p - log_q
    evidence = stats.multivariate_normal.logpdf(Y, np.zeros(5), 4.0 + np.eye(5) * (1 + NOISE**2))
    np.testing.assert_allclose(log_w, evidence, rtol=0, atol=1e-8)


def gaussian_conditional(mu):
    """Each block's conditional mean and variance given mu (traceable)."""
    var = 1.0 / (1.0 + 1.0 / NOISE**2)
    return var * (mu + jnp.asarray(Y) / NOISE**2), jnp.full(Y.size, var)
