"""Nested Laplace over hyperparameters against long NUTS runs (cached in tests/data)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.scipy.special import digamma
from scipy import special
from numpyro.infer import MCMC

from hierarchical_models import MODELS
from shared_models import poisson_glmm
from numpyro_lm import LaplaceMatching
from numpyro_lm.samplers import warm_nuts
from numpyro_lm.curvature import CholeskyCurvature
from numpyro_lm.approximations.nested import ccd_points, cell_draws, cell_moments
from numpyro_lm.marginal.conditional import mean_shift
from numpyro_lm.approximations.nested.search import _derivatives, _stencil, explore

pytestmark = pytest.mark.usefixtures("x64")
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def reference(name):
    return np.load(os.path.join(DATA, f"{name}_nuts.npz"))


def errors(samples, ref, sites):
    """Worst |mean - ref mean| / ref sd and worst |sd / ref sd - 1| over the sites' coordinates."""
    mean_err, sd_err = 0.0, 0.0
    for site in sites:
        x = np.asarray(samples[site])
        m, s = ref[f"{site}_mean"], ref[f"{site}_sd"]
        mean_err = max(mean_err, float(np.max(np.abs(x.mean(0) - m) / s)))
        sd_err = max(sd_err, float(np.max(np.abs(x.std(0) / s - 1))))
    return mean_err, sd_err


# mean tolerance 0.1 ref SD: the nested draws' own MC error with 4000 draws is 0.016 SD
# and the reference's (4 x 5000 NUTS draws, ESS > 5000) under 0.015 SD
CASES = [
    ("eight_schools", ["tau"], ["mu", "tau", "theta"]),
    ("beta_binomial", ["m", "kappa"], ["m", "kappa", "p"]),
    ("hierarchical_poisson", ["alpha", "sigma"], ["alpha", "sigma", "z"]),
]


@pytest.mark.parametrize("name, hyper, sites", [pytest.param(*c, id=c[0], marks=pytest.mark.slow if c[0] == "beta_binomial" else ())
                                               for c in CASES])
def test_nested_laplace_matches_long_nuts(name, hyper, sites):
    model, args, kwargs = MODELS[name]()
    ref = reference(name)
    nested = LaplaceMatching(model, hyper=hyper, num_samples=4000).run(jax.random.PRNGKey(0), *args, **kwargs)
    mean_err, sd_err = errors(nested.get_samples(), ref, sites)
    assert mean_err < 0.1 and sd_err < 0.15, (mean_err, sd_err)
    if name == "eight_schools":
        # the joint fit, for contrast: measured 8.4 SD off in tau's mean, its SD 9 times too wide
        joint = LaplaceMatching(model, num_samples=4000, strategy="laplace").run(jax.random.PRNGKey(0), *args, **kwargs)
        joint_mean_err, joint_sd_err = errors(joint.get_samples(), ref, sites)
        assert joint_mean_err > 2.0 and joint_sd_err > 2.0
    d = nested.diagnostics()
    assert d["hyper"] == hyper and d["nested_edge_mass"] < 1e-3


def test_auto_picks_the_global_sites():
    model, args, kwargs = MODELS["eight_schools"]()
    lm = LaplaceMatching(model, hyper="auto", num_samples=100).run(jax.random.PRNGKey(0), *args, **kwargs)
    assert lm.diagnostics()["hyper"] == ["tau"]  # mu is a location: Gaussian given tau


def test_auto_finds_scales_without_plates():
    def regression(x, y):  # no plate: the noise scale is the hyperparameter
        beta = numpyro.sample("beta", dist.Normal(0.0, 5.0).expand([x.shape[1]]).to_event(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        numpyro.sample("y", dist.Normal(x @ beta, sigma), obs=y)

    x = jax.random.normal(jax.random.PRNGKey(1), (30, 2))
    y = x @ jnp.array([1.0, -1.0]) + 0.5 * jax.random.normal(jax.random.PRNGKey(2), (30,))
    lm = LaplaceMatching(regression, hyper="auto", num_samples=100).run(jax.random.PRNGKey(0), x, y)
    assert lm.diagnostics()["hyper"] == ["sigma"]
    with pytest.raises(ValueError, match="not every latent site"):  # nothing left for the inner fits
        LaplaceMatching(lambda: numpyro.sample("s", dist.HalfNormal(1.0)), hyper="auto").run(jax.random.PRNGKey(0))


def test_more_than_ten_hyper_coordinates_are_refused():
    with pytest.raises(ValueError, match="at most 10"):
        ccd_points(11)


def normal_unknown_scale(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def exact_moments(y):
    """Means and SDs of ``mu`` and ``sigma`` by brute-force quadrature on a fine grid."""
    mu = np.linspace(-15.0, 15.0, 3001)[:, None]
    sigma = np.linspace(1e-3, 30.0, 6000)[None, :]
    log_p = (-0.5 * (mu / 10.0) ** 2 - 0.5 * (sigma / 5.0) ** 2
             - y.size * np.log(sigma) - 0.5 * np.sum((y[:, None, None] - mu) ** 2, 0) / sigma**2)
    p = np.exp(log_p - log_p.max())
    p /= p.sum()
    out = {}
    for name, grid in (("mu", np.broadcast_to(mu, p.shape)), ("sigma", np.broadcast_to(sigma, p.shape))):
        m = np.sum(p * grid)
        out[name] = (m, np.sqrt(np.sum(p * (grid - m) ** 2)))
    return out


@pytest.mark.slow  # 5 s: CI=true and make test-all (the advice test below fits such a lattice by default)
def test_hyper_naming_every_site_integrates_the_posterior_on_a_lattice():
    """With every latent site a hyperparameter nothing is left to condition on: the lattice
    integrates the posterior itself. Five observations leave sigma's posterior skewed: the
    lattice's means and SDs are within Monte Carlo error of the exact ones, where the default
    fit's (Laplace in the log basis) are not."""
    y = np.array([1.2, -0.4, 2.5, 0.9, 3.1])
    truth = exact_moments(y)
    n = 4000
    lattice = LaplaceMatching(normal_unknown_scale, hyper=["mu", "sigma"], num_samples=n).run(jax.random.PRNGKey(0), y)
    assert lattice.design.kind == "lattice" and lattice.design.x_mode.shape[1] == 0
    assert lattice.diagnostics()["trusted"]
    samples = lattice.get_samples()
    for name, (m, sd) in truth.items():
        x = np.asarray(samples[name], np.float64)
        # 4 Monte Carlo SEs of a mean (sd / sqrt(n)) and of an SD (about sd sqrt(kurtosis - 1) / (2 sqrt(n)),
        # sigma's kurtosis under 9 here)
        assert abs(x.mean() - m) / sd < 4 / np.sqrt(n), (name, x.mean(), m, sd)
        assert abs(x.std() / sd - 1) < 4 * np.sqrt(8) / (2 * np.sqrt(n)), (name, x.std(), sd)
    laplace = LaplaceMatching(normal_unknown_scale, strategy="laplace", num_samples=n).run(jax.random.PRNGKey(0), y)
    m, sd = truth["sigma"]
    assert abs(np.asarray(laplace.get_samples()["sigma"], np.float64).mean() - m) / sd > 4 / np.sqrt(n)


def test_an_untrusted_small_model_is_told_of_the_lattice_and_the_lattice_fit_is_not():
    """A curved ridge of two coordinates (Laplace untrusted): the advice names ``hyper=`` with
    both sites; a fit over both has nothing more to suggest of the kind."""
    def ridge():
        x = numpyro.sample("x", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(x**2, 0.3))

    laplace = LaplaceMatching(ridge, strategy="laplace").run(jax.random.PRNGKey(0))
    assert not laplace.diagnostics()["trusted"]
    assert "hyper=['x', 'y']" in laplace.diagnostics()["verdict"]
    lattice = LaplaceMatching(ridge, hyper=["x", "y"]).run(jax.random.PRNGKey(0))
    assert "hyper=['x', 'y']" not in lattice.diagnostics()["verdict"]


def test_hyper_naming_every_site_beyond_the_lattice_is_refused():
    def four(y):
        loc = numpyro.sample("loc", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        numpyro.sample("y", dist.Normal(loc.sum(), numpyro.sample("s", dist.HalfNormal(1.0))), obs=y)

    with pytest.raises(ValueError, match=r"names every latent site \(4 coordinates\).*at most 3"):
        LaplaceMatching(four, hyper=["loc", "s"]).run(jax.random.PRNGKey(0), 1.0)


def test_stencil_derivatives_of_a_quadratic_are_exact():
    a = np.array([[2.0, 0.3], [0.3, 1.0]])
    f = lambda t: -0.5 * t @ a @ t + t @ np.array([1.0, -2.0])
    h = np.array([0.1, 0.2])
    values = np.array([f(p) for p in _stencil(2) * h])
    grad, hess = _derivatives(values, h, 2)
    np.testing.assert_allclose(grad, [1.0, -2.0], atol=1e-12)
    np.testing.assert_allclose(hess, -a, atol=1e-12)


def _quadratic_marginal(finite):
    """A marginal ``-0.5 |t - 0.01|^2 / 0.1^2`` (mode 0.01, SD 0.1 per coordinate), NaN where
    ``finite(t)`` is False: an inner fit that failed beside the point."""
    def marginal(points, x0s):
        logp = -0.5 * np.sum((points - 0.01) ** 2, 1) / 0.1**2
        return np.where([finite(p) for p in points], logp, np.nan), x0s
    return marginal


def test_the_mode_search_shrinks_its_stencil_where_an_inner_fit_fails():
    # NaN 0.04 above the mode: the first stencil (0.05) reaches it, and its differences would be
    # NaN (numpy's eigh then raised "Eigenvalues did not converge" on a float32 BNN)
    search = explore(_quadratic_marginal(lambda t: t[0] < 0.04), np.zeros(2), np.zeros(3))
    np.testing.assert_allclose(search.theta, [0.01, 0.01], atol=1e-6)  # a quadratic: the last Newton step is exact
    np.testing.assert_allclose(search.precision, np.eye(2) / 0.1**2, rtol=1e-3)  # exact differences on a quadratic


def test_a_marginal_that_fails_everywhere_beside_the_start_is_refused_by_name():
    with pytest.raises(ValueError, match="not finite beside .*LaplaceNUTS"):
        explore(_quadratic_marginal(lambda t: bool(np.all(t == 0.0))), np.zeros(2), np.zeros(3))


@pytest.mark.parametrize("radius", [0.055, 0.065, 0.07])
def test_the_mode_search_stops_when_round_off_keeps_it_within_twice_its_tolerance(radius):
    """Round-off in the inner fits as a marginal whose mode wanders ``radius`` SDs around its
    centre from one evaluation to the next and whose later values are higher: the line search
    always "improves", the decrement stays near 0.1 SD (NumPyro's mortality example: 50
    iterations, 0.088 SD, then an error). Measured: 9 iterations, 0.06-0.12 SD from the centre;
    before STALLED_ITERATIONS, 47 iterations at 0.06 and an error at 0.065."""
    a = np.array([[4.0, 1.0], [1.0, 2.0]]) * 50
    root = np.linalg.cholesky(np.linalg.inv(a))  # SD units -> basis units
    centre, calls = np.array([0.3, -0.2]), [0]

    def marginal(points, x0s):
        calls[0] += 1
        mode = centre + root @ (radius * np.array([np.cos(0.7 * calls[0]), np.sin(0.7 * calls[0])]))
        d = points - mode
        return -0.5 * np.einsum("ki,ij,kj->k", d, a, d) + 0.01 * calls[0], x0s

    search = explore(marginal, np.zeros(2), np.zeros((1,)))
    off = search.theta - centre
    assert search.num_iter < 20
    assert np.sqrt(off @ a @ off) < 2 * radius + 0.05  # within the wander and the tolerance


def _log_cosh_marginal(points, x0s):
    """``-4 log cosh(t - 1)``: mode 1, SD 0.5 there, its slope levelling off away from it, so that a
    Newton step from 0 (1.81) overshoots the mode."""
    return -4.0 * np.log(np.cosh(points[:, 0] - 1.0)), x0s


def test_a_search_one_point_at_a_time_fits_the_peak_of_a_step_that_overshoots(monkeypatch):
    """Fitting one point per call, a whole step that improves but overshoots (the quadratic along it
    peaks at 0.55 of it) has its peak fitted too, and the search ends at the mode in fewer inner
    fits than when whole improving steps are always taken (OVERSHOOT = 0)."""
    import numpyro_lm.approximations.nested.search as search_module

    found = explore(_log_cosh_marginal, np.zeros(1), np.zeros(1), one_at_a_time=True)
    assert abs(found.theta[0] - 1.0) < 0.1 * 0.5  # within 0.1 SD (MODE_TOL 0.05, quadratic convergence after)
    monkeypatch.setattr(search_module, "OVERSHOOT", 0.0)
    whole = explore(_log_cosh_marginal, np.zeros(1), np.zeros(1), one_at_a_time=True)
    assert abs(whole.theta[0] - 1.0) < 0.1 * 0.5
    assert found.num_evaluations < whole.num_evaluations


def linear_gaussian():
    """Four scalar hyperparameters, five latents and eight observations, all linear-Gaussian:
    the posterior is Gaussian in closed form (``truth``)."""
    rng = np.random.default_rng(1)
    a, b, sigma = rng.normal(size=(5, 4)), rng.normal(size=(8, 5)), 0.5
    c = rng.normal(size=(8, 4))
    y = rng.normal(size=8) * 2.0

    def model(a, b, c, y):
        theta = jnp.stack([numpyro.sample(n, dist.Normal(0.0, 1.0)) for n in "pqrs"])
        x = numpyro.sample("x", dist.Normal(a @ theta, 1.0).to_event(1))
        numpyro.sample("y", dist.Normal(b @ x + c @ theta, sigma).to_event(1), obs=y)

    # w = (theta, x) = L (theta, e) with theta, e ~ N(0, I); y = M w + noise
    lower = np.block([[np.eye(4), np.zeros((4, 5))], [a, np.eye(5)]])
    m = np.concatenate([c, b], axis=1)
    cov = np.linalg.inv(np.linalg.inv(lower @ lower.T) + m.T @ m / sigma**2)
    truth = (cov @ m.T @ y / sigma**2, cov)
    return model, tuple(jnp.asarray(v) for v in (a, b, c, y)), truth


def test_central_composite_design_is_exact_on_a_gaussian_posterior():
    model, args, (mean, cov) = linear_gaussian()
    lm = LaplaceMatching(model, hyper=["p", "q", "r", "s"], num_samples=4000).run(jax.random.PRNGKey(0), *args)
    assert lm.design.kind == "ccd" and lm.design.z.shape == (1 + 8 + 16, 4)
    # the CCD weights integrate a Gaussian's mass and second moments exactly, and the
    # conditional means are linear in theta: the mixture moments are the posterior's
    np.testing.assert_allclose(np.asarray(lm.gaussian.mean), mean, atol=1e-6)
    np.testing.assert_allclose(np.asarray(lm.gaussian.cov), cov, atol=1e-6)
    # the draws (split normal with unit scales, linear conditional means) are exact too:
    # log p - log q is constant (k-hat -inf) and the moments agree within Monte Carlo error
    assert np.ptp(np.asarray(lm.get_extra_fields()["log_weight"])) < 1e-6
    samples = lm.get_samples()
    draws = np.concatenate([np.stack([samples[n] for n in "pqrs"], 1), samples["x"]], 1)
    sd = np.sqrt(np.diag(cov))
    assert np.max(np.abs(draws.mean(0) - mean) / sd) < 4 / np.sqrt(4000)  # 4 Monte Carlo SEs
    assert np.max(np.abs(draws.std(0) / sd - 1)) < 4 / np.sqrt(2 * 4000)


def test_lattice_cells_are_exact_on_a_gaussian_posterior():
    # two hyperparameters: the lattice; its cells' log-quadratic densities and the linear
    # conditional means make the mixture the (Gaussian) posterior itself
    model, args, (mean, cov) = linear_gaussian()
    lm = LaplaceMatching(model, hyper=["p", "q"], num_samples=4000).run(jax.random.PRNGKey(0), *args)
    assert lm.design.kind == "lattice"
    # the only error is the tail beyond the lattice (log density drop 9 in 2-D: mass
    # e^-9 ~ 1.2e-4 at squared radius ~20, a share ~1.2e-3 of each variance); measured
    # 1.7e-5 SD in the means and 1.3e-4 in the correlation-scaled covariance
    sd = np.sqrt(np.diag(cov))
    assert np.max(np.abs(np.asarray(lm.gaussian.mean) - mean) / sd) < 1e-4
    assert np.max(np.abs(np.asarray(lm.gaussian.cov) - cov) / np.outer(sd, sd)) < 1.2e-3
    # the draws' density is the posterior's up to its normaliser (k-hat -inf)
    assert np.ptp(np.asarray(lm.get_extra_fields()["log_weight"])) < 1e-9


@pytest.mark.parametrize("g, c", [(0.0, 0.0), (3.0, 0.0), (-7.0, 2.0), (0.5, 10.0), (-0.2, 1.0)])
def test_cell_draws_follow_the_cell_density(g, c):
    h, n = 0.75, 200_000
    log_mass, m, v = cell_moments(np.array(g), np.array(c), h)
    # closed forms: the uniform cell and the exponential one (a = g h / 2)
    if c == 0.0 and g == 0.0:
        np.testing.assert_allclose([log_mass, m, v], [np.log(h), 0.0, h**2 / 12], atol=1e-12)
    elif c == 0.0:
        a = g * h / 2
        np.testing.assert_allclose(log_mass, np.log(2 * np.sinh(a) / g), rtol=1e-12)
        np.testing.assert_allclose(m, h / 2 * (1 / np.tanh(a) - 1 / a), rtol=1e-10)
        np.testing.assert_allclose(v, (h / 2) ** 2 * (1 / a**2 - 1 / np.sinh(a) ** 2), rtol=1e-10)
    u = cell_draws(np.random.default_rng(0), np.full(n, g), np.full(n, c), h)
    assert np.all(np.abs(u) <= h / 2)
    # 4 Monte Carlo standard errors of the mean and of the variance (kurtosis <= 3 on an interval)
    assert abs(u.mean() - m) < 4 * np.sqrt(v / n)
    assert abs(u.var() - v) < 4 * v * np.sqrt(2 / n)


def test_mean_shift_moves_a_skewed_conditional_towards_its_mean():
    # x = log G, G ~ Gamma(3): density exp(3x - e^x), mode log 3, mean digamma(3)
    alpha = 3.0
    mode, mean = np.log(alpha), float(digamma(alpha))
    neg = lambda theta, x: -(alpha * x[0] - jnp.exp(x[0]))
    curvature = CholeskyCurvature.from_precision(jnp.array([[alpha]]))  # the Laplace precision at the mode
    shift = mean_shift(neg, jnp.zeros(1), jnp.array([mode]), curvature)
    # the sigma-point Newton step removes most of the mode's bias (0.176)
    assert abs(mode + float(shift[0]) - mean) < 0.2 * abs(mode - mean)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_nested_fit_works_with_summary_arviz_and_warm_start(capsys):
    model, args, kwargs = MODELS["eight_schools"]()
    lm = LaplaceMatching(model, hyper=["tau"], num_samples=500).run(jax.random.PRNGKey(0), *args, **kwargs)
    lm.print_summary()
    assert "tau" in capsys.readouterr().out
    idata = lm.to_inference_data()
    assert idata.posterior["tau"].shape == (4, 125) and "log_weight" in idata.sample_stats  # pseudo-chains
    d = lm.diagnostics()  # the mixture's precision, eigenvalues ascending
    assert 0 < d["hessian_min_eigenvalue"] <= d["hessian_max_eigenvalue"]
    warm = warm_nuts(lm)
    mcmc = MCMC(warm.kernel, num_warmup=50, num_samples=50, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), *args, init_params=warm.init_params)
    assert np.isfinite(np.asarray(mcmc.get_samples()["tau"])).all()


def test_design_covariances_with_rounding_below_zero_still_factor():
    """A point deep in a funnel has a conditional covariance whose float32 rounding leaves an
    eigenvalue slightly below zero: it is floored at float32's resolution, the others are
    factored exactly."""
    from numpyro_lm.approximations.nested.design import conditional_cholesky

    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 4, 4))
    good = a @ np.swapaxes(a, 1, 2) + np.eye(4)
    q = np.linalg.qr(rng.normal(size=(4, 4)))[0]
    bad = (q * np.array([-1e-6, 1.0, 10.0, 288.0])) @ q.T
    chol = conditional_cholesky(np.concatenate([good, bad[None]]))
    np.testing.assert_allclose(chol[:3], np.linalg.cholesky(good), rtol=1e-12)
    rebuilt = chol[3] @ chol[3].T
    np.testing.assert_allclose(rebuilt, bad, atol=288.0 * np.finfo(np.float32).eps * 2)


@pytest.fixture(scope="module")
def eight_schools_nested():
    model, args, kwargs = MODELS["eight_schools"]()
    return LaplaceMatching(model, hyper=["tau"], num_samples=1000).run(jax.random.PRNGKey(0), *args, **kwargs)


@pytest.mark.parametrize("gathered", [True, False], ids=["all-draws", "by-point"])
def test_dense_draws_have_the_density_of_a_factor_that_follows_the_cell(eight_schools_nested, gathered, monkeypatch):
    """On a lattice the draws' conditional Cholesky factor moves with the hyperparameters across
    the cell, ``L(u) = L_k + S_k u``: each draw's log density is the Gaussian's with that factor
    (its log determinant per draw, not the point's), and the factor does move (eight schools'
    theta given tau: the conditional SDs grow with tau). Both ways of forming the draws."""
    from scipy.stats import multivariate_normal

    from numpyro_lm.approximations.nested import mixture
    from numpyro_lm.approximations.nested.fit import design_draws

    monkeypatch.setattr(mixture, "GATHER_MAX", mixture.GATHER_MAX if gathered else 0)

    result = eight_schools_nested._result
    design = result.design
    assert design.kind == "lattice" and design.x_chol_slope is not None
    assert np.max(np.abs(design.x_chol_slope)) > 0.1 * np.max(np.abs(design.x_chol))
    made = design_draws(design, result.info.layout, jax.random.PRNGKey(3), 200)
    x = np.asarray(made.flat, np.float64)[:, design.x_index]
    k, u = made.point, made.offset
    expected = []
    for n in range(len(k)):
        mean = design.x_mean[k[n]] + design.x_slope[k[n]] @ u[n]
        chol = design.x_chol[k[n]] + design.x_chol_slope[k[n]] @ u[n]
        expected.append(multivariate_normal(mean, chol @ chol.T).logpdf(x[n]))
    # float64 throughout (the module's x64): rounding alone
    np.testing.assert_allclose(made.log_q() - made.log_q_hyper, expected, rtol=1e-10, atol=1e-9)


def test_cell_covariances_are_the_mean_of_the_moving_factors_square(eight_schools_nested):
    """:func:`_cell_covariances` (the mixture's moments) against Monte Carlo over each cell's own
    draws of ``u``: ``E[L(u) L(u)']`` within 4 Monte Carlo SEs, and different from the point's
    covariance (so that the test can fail)."""
    from numpyro_lm.approximations.nested.mixture import _cell_covariances

    design = eight_schools_nested.design
    cells = _cell_covariances(design)
    rng, n = np.random.default_rng(0), 100_000
    for k in np.argsort(design.log_weights)[-3:]:
        u = cell_draws(rng, np.repeat(design.cell_slope[k : k + 1], n, 0), np.repeat(design.cell_curvature[k : k + 1], n, 0),
                       design.step)
        chol = design.x_chol[k] + np.einsum("ija,na->nij", design.x_chol_slope[k], u)
        squares = np.einsum("nij,nlj->nil", chol, chol)
        se = squares.std(0) / np.sqrt(n) + 1e-12
        assert np.max(np.abs(squares.mean(0) - cells[k]) / se) < 4.5  # 100 entries, 4.5 SEs
        assert np.max(np.abs(cells[k] - design.x_cov[k]) / se) > 8  # measured 17-35


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_block_quadrature_corrects_the_laplace_integral_of_each_block(x64):
    """Five groups of five binary observations with a random intercept each: the Laplace
    integral plus the Gauss-Hermite correction equals the exact one-dimensional integrals
    (scipy's adaptive quadrature), where Laplace alone is off by a few hundredths of a nat."""
    from scipy import integrate

    from numpyro_lm.marginal.quadrature import block_quadrature_correction

    rng = np.random.default_rng(1)
    y = (rng.uniform(size=(5, 5)) < 0.3).astype(float)

    def f_block(z, j):  # log N(z; 0, 1.5^2) + sum log Bernoulli(y | logit = -0.5 + z)
        eta = -0.5 + z
        return (-0.5 * (z / 1.5) ** 2 - np.log(1.5 * np.sqrt(2 * np.pi))
                + np.sum(y[j] * eta - np.logaddexp(0.0, eta)))

    def log_density(z):
        eta = -0.5 + z[:, None]
        return jnp.sum(-0.5 * (z / 1.5) ** 2 - jnp.log(1.5 * jnp.sqrt(2 * jnp.pi))) + jnp.sum(
            y * eta - jnp.logaddexp(0.0, eta))

    mode = jnp.zeros(5)
    for _ in range(50):  # Newton on the separable density
        g, h = jax.grad(log_density)(mode), jnp.diag(jax.hessian(log_density)(mode))
        mode = mode - g / h
    precision = -jnp.diag(jax.hessian(log_density)(mode))
    laplace = float(log_density(mode)) + 2.5 * np.log(2 * np.pi) - 0.5 * float(jnp.sum(jnp.log(precision)))
    exact = sum(np.log(integrate.quad(lambda z: np.exp(f_block(z, j)), -30, 30, epsabs=0, epsrel=1e-12)[0])
                for j in range(5))
    assert abs(laplace - exact) > 1e-2  # what the correction is for
    for batched in (False, True):  # the nodes' gradients one after another, or at once: the same sum
        corrected = laplace + float(block_quadrature_correction(log_density, mode, np.arange(5), precision, batched))
        # the 9-node rule with the interpolated slopes on these skewed integrands: measured 2.6e-5 nats
        assert abs(corrected - exact) < 1e-4 and abs(corrected - exact) < abs(laplace - exact) / 1000
    # and their derivatives (in the mode and the precisions, as LaplaceNUTS takes them) agree to rounding
    grads = [jax.grad(lambda m, p: block_quadrature_correction(log_density, m, np.arange(5), p, batched),
                      argnums=(0, 1))(mode, precision) for batched in (False, True)]
    for unbatched, batched in zip(*grads):
        np.testing.assert_allclose(batched, unbatched, rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_block_quadrature_stays_right_where_a_large_variance_makes_the_likelihood_a_step(x64):
    """Binary pairs under sigma = 20: each group's likelihood in its intercept is a step, the
    slope jumps by 2 sigma within 1 / sigma of the mode. The values at the nodes, integrated
    from the slopes piecewise, must stay near the exact integrals; one polynomial through the
    nodes' slopes overshot here by 6 nats a group (a sampler then ran off to sigma ~ 25)."""
    from scipy import integrate

    from numpyro_lm.marginal.quadrature import block_quadrature_correction

    sigma, y = 20.0, np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])

    def f_block(z, j):  # log N(z; 0, 1) + sum log Bernoulli(y | logit = 0.3 + sigma z)
        eta = 0.3 + sigma * z
        return -0.5 * z**2 - 0.5 * np.log(2 * np.pi) + np.sum(y[j] * eta - np.logaddexp(0.0, eta))

    def log_density(z):
        eta = 0.3 + sigma * z[:, None]
        return jnp.sum(-0.5 * z**2 - 0.5 * jnp.log(2 * jnp.pi)) + jnp.sum(y * eta - jnp.logaddexp(0.0, eta))

    mode = jnp.zeros(3)
    for _ in range(100):  # damped Newton on the separable density: the steps are steep
        g, h = jax.grad(log_density)(mode), jnp.diag(jax.hessian(log_density)(mode))
        mode = mode - jnp.clip(g / h, -0.1, 0.1)
    precision = -jnp.diag(jax.hessian(log_density)(mode))
    laplace = float(log_density(mode)) + 1.5 * np.log(2 * np.pi) - 0.5 * float(jnp.sum(jnp.log(precision)))
    exact = sum(np.log(integrate.quad(lambda z: np.exp(f_block(z, j)), -10, 10, points=[-0.3 / sigma],
                                      epsabs=0, epsrel=1e-12)[0]) for j in range(3))
    corrected = laplace + float(block_quadrature_correction(log_density, mode, np.arange(3), precision))
    # nine Gauss-Hermite nodes on a kinked integrand: with the exact values at the nodes the rule
    # itself is 0.011-0.018 nats a group off here (measured); piecewise slopes add < 1e-3
    assert abs(corrected - exact) < 0.06, (corrected, exact, laplace)
    assert abs(corrected - exact) < abs(laplace - exact) / 5


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_scalar_block_marginal_matches_the_exact_integral(x64):
    """The structured inner fits' log p~(sigma | y) of a Poisson GLMM (30 groups of three
    counts) against the exact marginal (Gauss-Hermite over each group's intercept, a fine grid
    over the fixed effect): with the blocks' Gauss-Hermite correction and the globals' shift its
    differences between three values of sigma are exact to a few thousandths of a nat (measured
    4e-3 and 7e-4; without the globals' shift 0.010 and 0.019), where the joint Laplace
    marginal's are off by 0.11 and 0.13."""
    from numpyro_lm.core.model import model_info
    from numpyro_lm.approximations.nested.inner import inner_program
    from numpyro_lm.mode.derivatives import value_grad_hessian

    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(30), 3).astype(np.int32)
    y = rng.poisson(np.exp(0.3 + 0.8 * rng.normal(size=30))[group]).astype(np.float64)
    args, kwargs = (group, 30), {"y": y}
    info = model_info(poisson_glmm, args, kwargs)
    sigma_index = info.layout.site("sigma").offset
    x_index = np.setdiff1d(np.arange(info.size), [sigma_index])
    inner, entries = inner_program(info, 1e-10, 100, (sigma_index,), tuple([True] * x_index.size), "arrowhead",
                                   None, args, kwargs)
    assert entries is not None  # the blocks' quadrature reads their entries
    thetas = np.log([0.5, 0.8, 1.2])[:, None]
    fits = jax.device_get(inner((thetas, np.zeros((3, x_index.size)), np.asarray(True), entries.ids), args, kwargs))
    ours = np.asarray(fits.log_density)

    def neg(theta, x):
        flat = jnp.zeros(info.size).at[x_index].set(x).at[sigma_index].set(theta)
        return -info.log_density(flat, args, kwargs)

    laplace = np.array([-float(neg(t[0], x)) - 0.5 * np.linalg.slogdet(np.asarray(
        value_grad_hessian(lambda v: neg(t[0], v), jnp.asarray(x))[2]))[1] for t, x in zip(thetas, fits.x)])
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)  # probabilists': int N(z) g(z)
    beta = np.linspace(-4.0, 4.0, 4001)
    exact = []
    for sigma in np.exp(thetas[:, 0]):
        rate = np.exp(beta[:, None, None] + sigma * nodes[None, None, :])  # (beta, 1, node)
        counts = y.reshape(30, 3)
        log_lik = np.sum(counts[None, :, :, None] * np.log(rate[:, :, None, :]) - rate[:, :, None, :]
                         - special.gammaln(counts + 1)[None, :, :, None], axis=2)  # (beta, group, node)
        per_group = special.logsumexp(log_lik + np.log(weights / np.sqrt(2 * np.pi)), axis=-1)
        integrand = np.sum(per_group, axis=1) - 0.5 * beta**2 - 0.5 * np.log(2 * np.pi)
        log_p = special.logsumexp(integrand) + np.log(beta[1] - beta[0])
        exact.append(log_p + np.log(2.0) - 0.5 * sigma**2 - 0.5 * np.log(2 * np.pi) + np.log(sigma))  # HalfNormal, Jacobian
    exact = np.asarray(exact)
    error = np.abs(np.diff(ours) - np.diff(exact))
    laplace_error = np.abs(np.diff(laplace) - np.diff(exact))
    assert np.max(error) < 5e-3 and np.max(error) < np.max(laplace_error) / 10, (error, laplace_error)


def _poisson_glmm_fit(num_groups=40):
    rng = np.random.default_rng(3)
    group = np.repeat(np.arange(num_groups), 3).astype(np.int32)
    y = rng.poisson(np.exp(0.5 + 0.6 * rng.normal(size=num_groups))[group]).astype(np.float32)
    lm = LaplaceMatching(poisson_glmm, hyper=["sigma"], curvature="arrowhead", progress_bar=False)
    lm.run(jax.random.PRNGKey(0), group, num_groups, y=y)
    return lm


@pytest.fixture(scope="module")
def structured_fit():
    """One structured fit for the tests below, in the module's float64 (a module fixture runs
    before the function-scoped ``x64`` one)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield _poisson_glmm_fit()
    finally:
        jax.config.update("jax_enable_x64", previous)


def test_flat_runs_assemble_rows_as_index_arrays_place_them():
    from numpyro_lm.approximations.nested.mixture import flat_runs

    theta_index, x_index = np.array([2, 5, 6]), np.array([0, 1, 3, 4, 7])
    theta, x = np.array([10.0, 11.0, 12.0]), np.arange(5.0)
    runs = flat_runs(theta_index, x_index)
    assert len(runs) == 5  # x[0:2], theta[0:1], x[2:4], theta[1:3], x[4:5]
    expected = np.empty(8)
    expected[theta_index], expected[x_index] = theta, x
    np.testing.assert_array_equal(np.concatenate([(theta, x)[s][a:b] for s, a, b in runs]), expected)


def test_the_verdicts_quadrature_takes_what_the_caches_hold_and_at_least_two_draws():
    from numpyro_lm.approximations.joint_fit import ROW_BUDGET
    from numpyro_lm.approximations.nested.blocks import COLLAPSED_ROWS, QUADRATURE_NUMBERS, quadrature_rows
    from numpyro_lm.marginal.collapsed import VERDICT_NODES

    points = 3 * VERDICT_NODES - 2  # gradients per draw
    assert quadrature_rows(1_000, 200) == COLLAPSED_ROWS  # a small model: as many as allowed
    assert quadrature_rows(QUADRATURE_NUMBERS // (3 * points), 200) == 3  # the budget's own count
    assert quadrature_rows(QUADRATURE_NUMBERS // (3 * points), 2) == 2  # never more than the draws
    assert quadrature_rows(10_000, 200) == 8  # the Poisson random effect at N = 5 000
    assert quadrature_rows(2_100_000, 200) == 2  # the 10^5-group GLMM: two, past the budget
    assert quadrature_rows(4 * ROW_BUDGET // points + 1, 200) == 1  # past eight row budgets: one
    assert quadrature_rows(2_100_000, 1) == 1


def test_structured_draws_follow_the_mixture_and_repeat_with_the_key(structured_fit):
    """The draws made on the device (normals, the point's conditional, the flat rows) have the
    mixture's means and variances, coordinate by coordinate, and the same key gives the same draws."""
    from numpyro_lm.approximations.nested.fit import design_draws
    from numpyro_lm.approximations.nested.mixture import mixture_variances

    result = structured_fit._result
    n = 4000
    made = design_draws(result.design, result.info.layout, jax.random.PRNGKey(5), n)
    assert isinstance(made.flat, jax.Array)
    flat = np.asarray(made.flat, np.float64)
    mean, var = mixture_variances(result.design, result.info.layout.size)
    sd = np.sqrt(var)
    # Monte Carlo error of a mean: sd / sqrt(n); of a variance: var sqrt(2 / n) (near-Gaussian
    # coordinates); 4.5 of them over the 43 coordinates
    np.testing.assert_array_less(np.abs(flat.mean(0) - mean) / sd, 4.5 / np.sqrt(n))
    np.testing.assert_array_less(np.abs(flat.var(0) / var - 1), 4.5 * np.sqrt(2 / n))
    again = design_draws(result.design, result.info.layout, jax.random.PRNGKey(5), n)
    np.testing.assert_array_equal(np.asarray(again.flat), np.asarray(made.flat))


def test_a_structured_nested_fit_is_judged_with_its_blocks_integrated_out(structured_fit):
    """A random intercept per group: the verdict's weights live on (sigma, beta) with the blocks
    integrated out, and the blocks' own conditionals are checked against their quadrature; a
    design whose block means are moved by half a conditional SD is caught by that check, and
    named, where its weights over (sigma, beta) are still light."""
    from numpyro_lm.approximations.nested.fit import NestedResult

    lm = structured_fit
    result = lm._result
    assert isinstance(result, NestedResult) and result.blocks is not None and result.blocks.sites == {"z"}
    d = lm.diagnostics()
    assert d["trusted"], d["verdict"]
    # the blocks' conditionals: the mixture's means carry the skewness correction; measured 0.012 SD
    assert d["importance_shift"]["z"] < 0.05
    design = result.design
    moved = design.x_mean.copy()
    local = result.blocks.local
    moved[:, local] += 0.5 * np.sqrt(design.x_var[:, local])
    bad = NestedResult(result.info, result.args, result.kwargs, result.rng_key, result.hyper,
                       design._replace(x_mean=moved), result.search,
                       (result.gaussian, result.params, result._finite, result._positive), result.num_samples,
                       result.compiler_options, blocks=result.blocks)
    verdict = bad.verdicts()[0]
    assert not verdict.trusted
    # half a conditional SD, over a marginal SD that the spread of (sigma, beta) widens a little
    assert 0.35 < verdict.shift["z"] < 0.55, verdict.shift
    assert any("'z'" in r for r in verdict.reasons)
    # the blocks' means do not enter the weights over (sigma, beta) (but as the quadrature's centres:
    # 40 skewed blocks' 5-node rule half an SD from their modes, measured 0.093 nats at most): only
    # the blocks' check sees them
    difference = bad.weights()[0] - result.weights()[0]
    assert np.max(np.abs(difference)) < 0.15, np.max(np.abs(difference))


@pytest.mark.slow  # four nested fits: CI=true and make test-all
def test_a_second_structured_nested_fit_compiles_nothing():
    """A warm call (same shapes, a new key) reuses every program: the draws' shapes no longer
    depend on how many draws fall on each design point."""
    compiles = []

    def listener(name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    lm = _poisson_glmm_fit()
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for key in range(1, 4):  # the earlier per-point draws compiled 2 programs on the first
            lm.run(jax.random.PRNGKey(key), *lm._result.args, **lm._result.kwargs)
            jax.block_until_ready(lm.get_samples())
            lm.diagnostics()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == [], f"{len(compiles)} programs compiled on warm calls"


@pytest.mark.parametrize("coarse, twist, tilt, kind", [(True, 0.0, 0.0, "ccd"), (True, 0.3, 0.0, "lattice"),
                                                       (False, 0.0, 0.0, "lattice"), (True, 0.0, 0.6, "ccd")])
def test_a_large_models_three_hyperparameters_take_the_ccd_where_gaussian_enough(coarse, twist, tilt, kind,
                                                                                  monkeypatch):
    """Three hyperparameter coordinates of a large model (coarse) over a long field: the central
    composite design's 15 inner fits where the log marginal is Gaussian at its factorial points to within
    CCD_RESIDUAL_MAX nats; a marginal twisted by 0.3 t1 t2 t3 (0.44 nats there) takes the
    lattice, as a small model always does. A Gaussian marginal whose correlation (``tilt``)
    the mode search's curvature missed gets a second design around the quadratic through the
    first one's points, and keeps it."""
    import numpyro_lm.approximations.nested.design as design_module
    from numpyro_lm.approximations.nested.design import CCD_RESIDUAL_MAX, integrate
    from numpyro_lm.approximations.nested.search import ModeSearch

    monkeypatch.setattr(design_module, "CCD_FIRST_MIN", 1)  # the one conditional coordinate is a long field
    from numpyro_lm.marginal.conditional import PointFits

    def marginal(theta, x0, *_):
        theta = np.asarray(theta)
        logp = -0.5 * np.sum(theta**2, 1) + twist * np.prod(theta, 1) + tilt * theta[:, 0] * theta[:, 1]
        k = len(theta)
        return PointFits(logp, np.zeros((k, 1)), None, np.ones((k, 1)), np.ones((k, 1), bool), {},
                         np.zeros((k, 1)), np.ones((k, 1)))

    search = ModeSearch(np.zeros(3), np.eye(3), np.zeros(1), 0.0, 0.0, 0.0, 1, 1)
    design = integrate(marginal, search, np.arange(3), np.arange(3, 4), np.ones(1, bool), coarse=coarse)
    assert design.kind == kind
    assert 0.3 * 1.1**3 > CCD_RESIDUAL_MAX  # the twist at a factorial point, beyond the limit
    if kind == "ccd":
        assert len(design.z) == 15
        np.testing.assert_allclose(design.sigma, 1.0, rtol=1e-6)  # the split-normal of a Gaussian
        covariance = design.scale @ design.scale.T  # the marginal's own: the inverse of its precision
        np.testing.assert_allclose(covariance, np.linalg.inv(np.eye(3) - tilt * (np.eye(3, k=1) + np.eye(3, k=-1))
                                                             * np.outer([1, 1, 0], [1, 1, 0])), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("border", [False, True])
@pytest.mark.parametrize("whole", [True, False])
def test_a_banded_designs_mixture_block_is_the_mixture_covariance(border, whole):
    """``mixture_block`` over banded conditionals (a field, with or without a border) is the
    mixture's covariance :math:`\\sum_k w_k (H_k^{-1} + (\\bar x_k - \\bar x)(\\bar x_k - \\bar x)^\\top)`
    over the chosen coordinates, by the whole weighted inverse (most of the field) and by solves
    (two coordinates), to float64 round-off."""
    from numpyro_lm.approximations.nested.design import NestedDesign
    from numpyro_lm.approximations.nested.mixture import mixture_block
    from numpyro_lm.curvature.banded import BandedCurvature
    from numpyro_lm.curvature.banded_arrowhead import BandedArrowheadCurvature

    n, k, glob = 9, 4, np.array([4])
    dim = n + (1 if border else 0)
    field_index = np.setdiff1d(np.arange(dim), glob) if border else np.arange(n)
    rng = np.random.default_rng(0)
    bands, dense = [], []
    for _ in range(k):
        off = rng.normal(size=n - 1)
        h = np.diag(off, 1) + np.diag(off, -1)
        h += np.diag(np.abs(h).sum(1) + rng.uniform(0.5, 2.0, n))
        bands.append(np.stack([np.diag(h), np.concatenate([[0.0], off])], 1))
        dense.append(h)
    bands = jnp.asarray(np.stack(bands))
    if border:
        b, c = 0.2 * rng.normal(size=(k, n, 1)), np.full((k, 1, 1), 3.0 + n)
        curvature = jax.vmap(lambda band, b, c: BandedArrowheadCurvature.from_blocks(
            BandedCurvature.from_band(band, 1), field_index, glob, b, c))(bands, jnp.asarray(b), jnp.asarray(c))
        full = []
        for h, bk, ck in zip(dense, b, c):
            p = np.zeros((dim, dim))
            p[np.ix_(field_index, field_index)], p[np.ix_(field_index, glob)] = h, bk
            p[np.ix_(glob, field_index)], p[np.ix_(glob, glob)] = bk.T, ck
            full.append(p)
        dense = full
    else:
        curvature = jax.vmap(lambda band: BandedCurvature.from_band(band, 1))(bands)
    w = np.array([0.1, 0.2, 0.3, 0.4])
    x_mean = rng.normal(size=(k, dim))
    zeros = np.zeros((k, 1))
    design = NestedDesign("ccd", np.array([dim]), np.arange(dim), np.zeros(1), np.eye(1), 0.0, np.ones((1, 2)), zeros,
                          zeros, np.log(w), x_mean, x_mean, None, np.zeros((k, dim, 1)), zeros, zeros, {},
                          np.zeros(dim, bool), 0.0, 1, k, x_curvature=curvature)
    cols = np.arange(dim - 1) if whole else np.array([6, 2])
    got = mixture_block(design, cols)
    centred = x_mean - w @ x_mean
    want = sum(wk * (np.linalg.inv(p) + np.outer(d, d)) for wk, p, d in zip(w, dense, centred))[np.ix_(cols, cols)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)  # float64 round-off
