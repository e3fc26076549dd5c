"""MVI refinement: the paper's 2-D mixture (KL ordering) and robust Cauchy regression (LPD)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.scipy.special import logsumexp
from numpyro.distributions import constraints

from numpyro_lm import LaplaceMatching, NotTrustedWarning
from numpyro_lm.curvature import DenseCurvature, Gaussian
from numpyro_lm.posterior.refine import evidence_lower_bound, refine_gaussian

pytestmark = pytest.mark.usefixtures("x64")
KEY = jax.random.PRNGKey(0)


def log_mixture(w):
    """MVI paper eq. (14): 2/3 N(0, I) + 1/3 N((-1, -2), diag(3.5, 0.3))."""
    a = dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)).log_prob(w) + jnp.log(2 / 3)
    b = dist.MultivariateNormal(jnp.array([-1.0, -2.0]), jnp.diag(jnp.array([3.5, 0.3]))).log_prob(w)
    return jnp.logaddexp(a, b + jnp.log(1 / 3))


def mixture():
    w = numpyro.sample("w", dist.ImproperUniform(constraints.real_vector, (), (2,)))
    numpyro.factor("target", log_mixture(w))


@pytest.mark.slow  # 8 s on one core: runs where CI=true (Makefile)
def test_mixture_kl_ordering_of_the_paper():
    # KL(q || p) by quadrature on a 901 x 901 grid over [-9, 9]^2 (p is normalised: the
    # grid holds all but 3e-6 of its mass)
    grid = jnp.linspace(-9.0, 9.0, 901)
    points = jnp.stack([g.ravel() for g in jnp.meshgrid(grid, grid)], -1)
    area = (grid[1] - grid[0]) ** 2
    log_p = log_mixture(points)
    kl = {}
    for method in (None, "mean", "eig", "lowrank"):
        lm = LaplaceMatching(mixture, refine=method, refine_num_samples=1000, strategy="laplace").run(KEY)
        log_q = dist.MultivariateNormal(lm.gaussian.mean, lm.gaussian.cov).log_prob(points)
        kl[method] = float(jnp.sum(jnp.exp(log_q) * (log_q - log_p)) * area)
        d = lm.diagnostics()
        if method is not None:
            assert d["refine"] == method and d["refine_elbo_after"] > d["refine_elbo_before"]
    # measured: LA 0.245, MVI_mu 0.182, MVI_eig 0.133, MVI_lr 0.125 (the paper's order)
    assert kl[None] > kl["mean"] > kl["eig"] > kl["lowrank"]


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_bound_of_a_gaussian_target_is_its_entropy_identity():
    # for p = N(0, I) in 2-D and q = p the bound is log Z = 0 up to the MC error of the
    # fixed draws' second moment: E[log p] = -(log 2 pi + 1) exactly, entropy cancels it
    z = jax.random.normal(KEY, (20000, 2), dtype=jnp.float64)
    log_p = lambda w: dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)).log_prob(w)
    bound = evidence_lower_bound(log_p, jnp.zeros(2), jnp.eye(2), 0.0, z)
    assert abs(float(bound)) < 0.03  # sd of mean(|z|^2)/2 over 20000 draws: 0.007


@pytest.mark.parametrize("method", ["mean", "eig", "lowrank", "diag", "dadvi"])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_refinement_never_lowers_the_bound(method):
    # a skewed 2-D target (Gumbel x Normal): every refinement raises the bound
    def log_p(w):
        return dist.Gumbel(0.0, 1.0).log_prob(w[0]) + dist.Normal(0.5 * w[0], 1.0).log_prob(w[1])

    gaussian = Gaussian(jnp.zeros(2), DenseCurvature.from_precision(-jax.hessian(log_p)(jnp.zeros(2))))
    z = jax.random.normal(KEY, (500, 2), dtype=jnp.float64)
    refined, info = refine_gaussian(log_p, gaussian, method, z, jnp.ones(4), max_iter=100, gtol=1e-6)
    assert float(info.elbo_after) > float(info.elbo_before)
    # the Gumbel's mean is Euler's gamma (0.577); its mode, LA's mean, is 0
    assert 0.3 < float(refined.mean[0]) < 0.8


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_dadvi_newton_reaches_the_optimum_lbfgs_reaches_on_the_same_draws():
    # "dadvi" and "eig" share the fixed-draw bound (the same root, its scales in logs): on
    # the same draws Newton and L-BFGS must find the same optimum of this smooth function
    def log_p(w):
        return dist.Gumbel(0.0, 1.0).log_prob(w[0]) + dist.Normal(0.5 * w[0], 1.0).log_prob(w[1])

    gaussian = Gaussian(jnp.zeros(2), DenseCurvature.from_precision(-jax.hessian(log_p)(jnp.zeros(2))))
    z = jax.random.normal(KEY, (300, 2), dtype=jnp.float64)
    newton, n_info = refine_gaussian(log_p, gaussian, "dadvi", z, jnp.ones(4), max_iter=50, gtol=1e-9)
    lbfgs, l_info = refine_gaussian(log_p, gaussian, "eig", z, jnp.ones(4), max_iter=500, gtol=1e-9)
    assert int(n_info.num_iter) < 15  # second order from the Laplace start: a few steps
    np.testing.assert_allclose(n_info.elbo_after, l_info.elbo_after, rtol=0, atol=1e-9)
    np.testing.assert_allclose(newton.mean, lbfgs.mean, atol=1e-5)  # optimiser tolerances
    np.testing.assert_allclose(newton.cov, lbfgs.cov, atol=1e-5)


@pytest.mark.parametrize("method", ["eig", "dadvi"])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_refine_works_in_float32(x32, method):
    with pytest.warns(NotTrustedWarning):  # the Gaussian misses the mixture's second component
        lm = LaplaceMatching(mixture, refine=method).run(KEY)
    d = lm.diagnostics()
    assert d["refine_elbo_after"] >= d["refine_elbo_before"] and np.all(np.isfinite(lm.gaussian.cov))
    # the refined Gaussian's precision eigenvalues ascend, as the Laplace fit's do
    assert 0 < d["hessian_min_eigenvalue"] <= d["hessian_max_eigenvalue"]


def test_unknown_refine_is_refused():
    with pytest.raises(ValueError, match="refine must be"):
        LaplaceMatching(mixture, refine="full")


# ------------------------------------------------------------- Cauchy regression

CENTRES = jnp.linspace(-10.0, 10.0, 10)


def features(x, r=2.0):
    rbf = jnp.exp(-0.5 * jnp.square(x[:, None] - CENTRES[None, :]) / r**2)
    return jnp.concatenate([rbf, jnp.ones((x.shape[0], 1))], axis=1)


def cauchy_regression(phi, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([phi.shape[1]]).to_event(1))
    numpyro.sample("y", dist.Cauchy(phi @ w, 0.2), obs=y)


def paper_data(key, n):
    """MVI paper eq. (15): y = 0.3 x sin(0.7 x) - 0.03 x^2 + U(-0.5, 0.5), x ~ U(-10, 10)."""
    kx, ky = jax.random.split(key)
    x = jax.random.uniform(kx, (n,), minval=-10.0, maxval=10.0)
    y = 0.3 * x * jnp.sin(0.7 * x) - 0.03 * x**2 + jax.random.uniform(ky, (n,), minval=-0.5, maxval=0.5)
    return features(x), y


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_every_mvi_variant_improves_the_cauchy_regression_lpd():
    methods = (None, "mean", "eig", "lowrank")
    fits = {m: LaplaceMatching(cauchy_regression, refine=m, num_samples=1000, refine_num_samples=300, strategy="laplace",
                               refine_max_iter=60, progress_bar=False) for m in methods}
    lpd = {m: [] for m in methods}
    for i in range(20):  # 20 data sets of N = 50, each tested on 500 points
        phi, y = paper_data(jax.random.PRNGKey(i), 50)
        phi_test, y_test = paper_data(jax.random.PRNGKey(1000 + i), 500)
        for m in methods:
            w = fits[m].run(jax.random.PRNGKey(i), phi, y).get_samples()["w"]
            log_lik = dist.Cauchy(w @ phi_test.T, 0.2).log_prob(y_test)
            lpd[m].append(float(jnp.mean(logsumexp(log_lik, axis=0) - jnp.log(w.shape[0]))))
    mean_lpd = {m: np.mean(v) for m, v in lpd.items()}
    # measured (2000 draws, 1000 test points): LA -0.623, MVI_mu -0.604, MVI_eig -0.592,
    # MVI_lr -0.596; the paper's Table 2: -0.818, -0.771, -0.722, -0.726
    for m in ("mean", "eig", "lowrank"):
        assert mean_lpd[m] > mean_lpd[None], mean_lpd


def test_refinement_of_a_large_model_is_refused_before_allocating():
    """dadvi's Newton Hessian evaluates the model at 300 draws for each of 2 D products: for 200
    coordinates and 10^5 observations that is hundreds of GiB; refused with the size and the
    fix, the object left without a result. A structured curvature cannot be refined at all."""
    from numpyro_lm.core.curvature_choice import DenseMemoryError

    def wide(y=None):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([200]).to_event(1))
        with numpyro.plate("obs", 100_000):
            numpyro.sample("y", dist.Normal(jnp.sum(w), 1.0), obs=y)

    lm = LaplaceMatching(wide, refine="dadvi", progress_bar=False)
    with pytest.raises(DenseMemoryError, match="refine='dadvi' over 200 latent coordinates.*GiB.*Leave refine out"):
        lm.run(jax.random.PRNGKey(0), y=np.zeros(100_000, np.float32))
    with pytest.raises(RuntimeError):
        lm.get_samples()
    with pytest.raises(ValueError, match="dense curvature's eigenbasis"):
        LaplaceMatching(wide, refine="dadvi", curvature="arrowhead")
