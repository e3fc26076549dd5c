"""Wishart and inverse Wishart in the logm and sqrtm bases."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from numpyro_lm.families.bases import get_basis
from numpyro_lm.families import get_family
from numpyro_lm.families.wishart import inverse_wishart_logm_seeds, wishart_logm_seeds

pytestmark = pytest.mark.usefixtures("x64")

V2 = np.array([[0.75, 0.5], [0.5, 1.0]])  # thesis Table A.1's V0
V3 = np.array([[2.0, 0.3, -0.4], [0.3, 1.0, 0.2], [-0.4, 0.2, 0.5]])
FAMILIES = [("wishart", "logm"), ("wishart", "sqrtm"), ("inverse_wishart", "logm"), ("inverse_wishart", "sqrtm")]


def _density(name, params):
    cls = dist.Wishart if name == "wishart" else dist.InverseWishart
    return cls(params["concentration"], scale_matrix=params["scale_matrix"])


# p = 3 with a non-diagonal scale for one family; p = 2 (thesis Table A.1's V0) for all
ROUND_TRIPS = [(key, (5.0, 40.0), V2) for key in FAMILIES[1:]] + [(FAMILIES[0], (5.0, 9.0), V3)]
# the matrix-log ones compile for 20 s each (2 cores): slow, run where CI=true (Makefile)
ROUND_TRIP_PARAMS = [pytest.param(k, c, v, id=f"{'-'.join(k)}-p{v.shape[0]}",
                                  marks=[pytest.mark.slow] if k[1] == "logm" else []) for k, c, v in ROUND_TRIPS]


@pytest.mark.parametrize("key,counts,v", ROUND_TRIP_PARAMS)
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_round_trip_is_exact_and_batches(key, counts, v):
    """A batch of parameters (one compilation of the jitted maps per family and shape)."""
    family = get_family(*key)
    n = jnp.asarray(counts)
    params = {"concentration": n, "scale_matrix": jnp.broadcast_to(jnp.asarray(v), n.shape + v.shape)}
    mean, cov = family.to_gaussian(params)
    d = v.shape[0] * (v.shape[0] + 1) // 2
    assert mean.shape == n.shape + (d,) and cov.shape == n.shape + (d, d)
    back = family.from_gaussian(mean, cov)
    np.testing.assert_allclose(back["concentration"], n, rtol=1e-6)
    np.testing.assert_allclose(back["scale_matrix"], params["scale_matrix"], rtol=1e-6, atol=1e-9)


# one family per basis: each check compiles third derivatives through the matrix function
@pytest.mark.parametrize("key", [pytest.param(FAMILIES[0], id="wishart-logm", marks=pytest.mark.slow),
                                 pytest.param(FAMILIES[3], id="inverse_wishart-sqrtm")])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_to_gaussian_is_the_laplace_approximation_in_the_basis(key):
    name, basis = key
    family = get_family(*key)
    params = {"concentration": jnp.asarray(7.0), "scale_matrix": jnp.asarray(V2)}
    mean, cov = family.to_gaussian(params)
    t = get_basis(basis).transform(None)

    def log_density(y):
        x = t(y)
        return _density(name, params).log_prob(x) + t.log_abs_det_jacobian(y, x)

    # the inverse Wishart log density rounds at ~1e-14 (cancelling terms): the mode is
    # found to a Newton step of ~1e-7 posterior SDs, i.e. a gradient of that order
    grad, hess = jax.jit(lambda y: (jax.grad(log_density)(y), jax.hessian(log_density)(y)))(mean)
    np.testing.assert_allclose(grad, 0.0, atol=1e-6)
    np.testing.assert_allclose(jnp.linalg.inv(-hess), cov, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize(
    "key,scalar",
    [(("wishart", "sqrtm"), ("gamma", "sqrt")), (("inverse_wishart", "logm"), ("inverse_gamma", "log"))],
)
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_one_by_one_matrices_reduce_to_gamma_maps(key, scalar):
    """Wishart(n, v) with p = 1 is Gamma(n/2, 1/(2v)); InverseWishart(nu, psi) is InverseGamma(nu/2, psi/2)."""
    n, v = 6.0, 0.8
    mean, cov = get_family(*key).to_gaussian({"concentration": jnp.asarray(n), "scale_matrix": jnp.full((1, 1), v)})
    rate = 1 / (2 * v) if key[0] == "wishart" else v / 2
    m, s2 = get_family(*scalar).to_gaussian({"concentration": jnp.asarray(n / 2), "rate": jnp.asarray(rate)})
    np.testing.assert_allclose(mean[0], m, rtol=1e-8)
    np.testing.assert_allclose(cov[0, 0], s2, rtol=1e-6)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
@pytest.mark.parametrize("n", [4.0, 100.0])
def test_seeds_logm_closed_form_differs_by_order_p_over_n(n):
    """The seeds' Jacobian (det X) moves the mode from logm(n V) to logm((n - p + 1) V).

    For V a multiple of the identity the exact mode is logm(n V): the seeds' diagonal
    entries are off by log(n / (n - p + 1)), and their variances by the same ratio.
    """
    p = 2
    v = 0.5 * jnp.eye(p)
    params = {"concentration": jnp.asarray(n), "scale_matrix": v}
    exact_mean, exact_cov = get_family("wishart", "logm").to_gaussian(params)
    seeds_mean, seeds_cov = wishart_logm_seeds(params)
    diag = jnp.array([0, 2])
    np.testing.assert_allclose(exact_mean[diag], jnp.log(n * 0.5), rtol=1e-8)
    np.testing.assert_allclose(exact_mean[diag] - seeds_mean[diag], jnp.log(n / (n - p + 1)), rtol=1e-8)
    ratio = jnp.diagonal(seeds_cov) / jnp.diagonal(exact_cov)
    assert float(jnp.max(jnp.abs(ratio - 1))) < 2 * p / n + 0.05
    iw_exact = get_family("inverse_wishart", "logm").to_gaussian(params)[0]
    np.testing.assert_allclose(iw_exact[diag] - inverse_wishart_logm_seeds(params)[0][diag],
                               jnp.log((n + p - 1) / n), rtol=1e-8)


@pytest.mark.parametrize("name", ["wishart", "inverse_wishart"])
def test_draws_follow_the_family(name):
    family = get_family(name, "logm")
    params = {"concentration": jnp.asarray(8.0), "scale_matrix": jnp.asarray(V2)}
    y = family.sample_basis(jax.random.PRNGKey(0), params, 4000)
    x = get_basis("logm").transform(None)(y)
    if name == "wishart":
        # E[X] = n V; Var X_ij = n (V_ij^2 + V_ii V_jj): 5 Monte Carlo standard errors
        expected = 8.0 * V2
        tol = 5 * np.sqrt(8.0 * (V2**2 + np.outer(np.diag(V2), np.diag(V2))) / 4000)
    else:
        # E[X] = Psi / (nu - p - 1); the entries' MC standard error is below 0.01 here
        expected, tol = V2 / (8.0 - 2 - 1), 0.03
    np.testing.assert_array_less(np.abs(np.asarray(x.mean(0)) - expected), tol)
