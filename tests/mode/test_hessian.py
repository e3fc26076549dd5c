"""Hessian strategies (numpyro_lm.mode.hessian): the block-arrowhead structure read from a plate,
its coloured Hessian-vector products against the dense Hessian, the probe that catches a
plate whose entries interact, the low-rank update (exact and numerical). The choice among
them and the memory guards: tests/core/test_curvature_choice.py."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching
from numpyro_lm.checks.verdict import NotTrustedWarning
from numpyro_lm.curvature import ArrowheadCurvature, DenseCurvature, LowRankUpdateCurvature
from numpyro_lm.core.curvature_choice import StructureError, choose_curvature, hessian_for
from numpyro_lm.mode.hessian import (LOWRANK_MARGIN, LOWRANK_NUMERICAL, NUMERICAL_TOL, ArrowheadHessian,
                                DenseHessian, PlateStructure, plate_structure, structure_tol)
from numpyro_lm.core.starts import origin_point
from numpyro_lm.core.model import model_info
from numpyro_lm.mode.newton import newton, newton_init
from numpyro_lm.mode.derivatives import value_grad_hessian
from shared_models import coupled, glmm, glmm_data, wide_data, wide_regression


def test_plate_structure_partitions_the_coordinates():
    args, kwargs = glmm_data(7)
    layout = model_info(glmm, args, kwargs).layout
    structure = plate_structure(layout)
    assert structure.plate == "groups"
    assert structure.sizes == (7, 2, 3)  # (z_j, w_j) per group; beta (2) and sigma global
    everything = np.sort(np.concatenate([structure.local_index.ravel(), structure.global_index]))
    np.testing.assert_array_equal(everything, np.arange(layout.size))
    z, w = layout.site("z"), layout.site("w")
    np.testing.assert_array_equal(structure.local_index[3], [z.offset + 3, w.offset + 3])


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_coloured_hessian_equals_the_dense_one():
    """b + G + 1 = 6 Hessian-vector products give every entry of the 3 + 2 x 9 coordinates'
    Hessian (float64: the comparison is about exactness, up to rounding)."""
    with jax.enable_x64(True):
        args, kwargs = glmm_data(9, dtype=np.float64)
        info = model_info(glmm, args, kwargs)
        fn = lambda x: -info.log_density(x, args, kwargs)  # noqa: E731
        x = jnp.asarray(np.random.default_rng(1).normal(size=info.size) * 0.3)
        hessian = ArrowheadHessian(plate_structure(info.layout))
        value, grad, blocks, error = hessian.evaluate(fn, x)
        dense_value, dense_grad, dense = value_grad_hessian(fn, x)
        structured = hessian.curvature(blocks).precision
        np.testing.assert_allclose(structured, dense, atol=1e-12)
        np.testing.assert_allclose(grad, dense_grad, atol=1e-12)
        assert float(error) < 1e-12
        # without the probe (LaplaceNUTS, once the structure has held): the same blocks, no error measured
        unchecked = hessian._replace(check=False).evaluate(fn, x)
        for checked_block, unchecked_block in zip(blocks, unchecked[2]):
            np.testing.assert_allclose(unchecked_block, checked_block, atol=1e-12)
        assert float(unchecked[3]) == 0.0


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_probe_catches_entries_that_interact():
    with jax.enable_x64(True):
        y = np.random.default_rng(0).normal(size=12)
        info = model_info(coupled, (12,), {"y": y})
        hessian = ArrowheadHessian(plate_structure(info.layout, "steps"))
        _, _, _, error = hessian.evaluate(lambda x: -info.log_density(x, (12,), {"y": y}), jnp.zeros(12))
        assert float(error) > 0.1  # cumsum couples every pair of steps: far from the 1.5e-8 limit


def test_a_plate_whose_entries_interact_is_refused():
    y = np.random.default_rng(0).normal(size=12).astype(np.float32)
    lm = LaplaceMatching(coupled, curvature="arrowhead", strategy="laplace", progress_bar=False)
    with pytest.raises(ValueError, match="plate 'steps' does not hold"):
        lm.run(jax.random.PRNGKey(0), 12, y=y)
    assert lm._result is None  # a failed call leaves the object as it was


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_arrowhead_newton_finds_the_dense_mode_and_curvature():
    with jax.enable_x64(True):
        args, kwargs = glmm_data(15, dtype=np.float64)
        info = model_info(glmm, args, kwargs)
        fn = lambda x: -info.log_density(x, args, kwargs)  # noqa: E731
        x0 = jnp.asarray(origin_point(info.layout))  # not 0: numpyro's Bernoulli gradient at logits 0 is wrong
        arrow = ArrowheadHessian(plate_structure(info.layout))
        s_arrow = newton(fn, newton_init(x0, arrow), 1e-9, 100, arrow)
        s_dense = newton(fn, newton_init(x0), 1e-9, 100)
        assert bool(s_arrow.converged) and bool(s_dense.converged)
        np.testing.assert_allclose(s_arrow.x, s_dense.x, atol=1e-8)
        c_arrow = arrow.curvature(s_arrow.hess)
        c_dense = DenseHessian().curvature(s_dense.hess)
        np.testing.assert_allclose(c_arrow.variance(), c_dense.variance(), rtol=1e-8)
        np.testing.assert_allclose(c_arrow.logdet(), c_dense.logdet(), rtol=1e-10)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_saddle_step_is_a_descent_direction():
    """Where H is not positive definite the step comes from |A_j| and |S| (module docstring of
    curvature.arrowhead): still a descent direction."""
    rng = np.random.default_rng(2)
    j, b, g = 6, 2, 2
    a = rng.normal(size=(j, b, b))
    a = a + np.swapaxes(a, 1, 2)  # indefinite blocks
    blocks = (jnp.asarray(a), jnp.asarray(rng.normal(size=(j, b, g))), jnp.asarray(np.diag([-1.0, 2.0])))
    hessian = ArrowheadHessian(PlateStructure("p", np.arange(j * b).reshape(j, b).astype(np.int32),
                                              np.arange(j * b, j * b + g).astype(np.int32)))
    grad = jnp.asarray(rng.normal(size=j * b + g))
    step, decrement, _, positive = hessian.step(grad, blocks)
    assert not bool(positive)
    assert float(grad @ step) < 0 and float(decrement) > 0


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_large_fit_uses_the_arrowhead_and_agrees_with_dense():
    """J = 260 groups (D = 523): the default picks the arrowhead; the joint Laplace Gaussian
    equals the dense fit's to float32 rounding (the same mode and precision)."""
    args, kwargs = glmm_data(260, per_group=4)
    fits = {}
    for curvature in ("auto", "dense"):
        lm = LaplaceMatching(glmm, strategy="laplace", curvature=curvature, progress_bar=False)
        with pytest.warns(Warning):  # joint PSIS over 523 coordinates: not trusted
            lm.run(jax.random.PRNGKey(0), *args, **kwargs)
        fits[curvature] = lm
    assert isinstance(fits["auto"].state.curvature, ArrowheadCurvature)
    assert isinstance(fits["dense"].state.curvature, DenseCurvature)
    g_auto, g_dense = fits["auto"].gaussian, fits["dense"].gaussian
    sd = np.sqrt(np.asarray(g_dense.curvature.variance()))
    # float32: both searches stop within 1e-3 posterior SDs of the mode (default_tol)
    np.testing.assert_array_less(np.abs(np.asarray(g_auto.mean - g_dense.mean)) / sd, 5e-3)
    np.testing.assert_allclose(np.sqrt(g_auto.curvature.variance()), sd, rtol=1e-3)


def test_structure_tolerance_follows_the_precision():
    assert structure_tol(np.float32) == pytest.approx(np.sqrt(np.finfo(np.float32).eps))
    assert structure_tol(np.float64) < 1e-7


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_an_unidentified_local_block_is_named():
    """Two local coordinates that only enter as a sum: each group's block is singular; the
    error names plate entries instead of decomposing 3 x 300 coordinates."""
    def model(group, y=None):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("groups", 300):
            a = numpyro.sample("a", dist.ImproperUniform(dist.constraints.real, (), ()))
            b = numpyro.sample("b", dist.ImproperUniform(dist.constraints.real, (), ()))
        with numpyro.plate("obs", group.size):
            numpyro.sample("y", dist.Normal(mu + a[group] + b[group], 1.0), obs=y)

    group = np.repeat(np.arange(300), 2).astype(np.int32)
    y = np.random.default_rng(0).normal(size=group.size).astype(np.float32)
    lm = LaplaceMatching(model, strategy="laplace", curvature="arrowhead", progress_bar=False)
    with pytest.raises(ValueError, match="local blocks of .* plate entries"):
        lm.run(jax.random.PRNGKey(0), group, y=y)


def nested_fits_agree(model, args, kwargs, structured: str) -> dict:
    """Nested Laplace over sigma with ``structured`` and with dense inner fits: the structured
    fit keeps its conditionals structured, and the two agree to 0.1 posterior SD on every mean
    and 10 % on every SD (the design's and the mean shift's approximations differ). Returns both."""
    fits = {}
    for curvature in (structured, "dense"):
        lm = LaplaceMatching(model, hyper=["sigma"], curvature=curvature, progress_bar=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotTrustedWarning)
            lm.run(jax.random.PRNGKey(0), *args, **kwargs)
        fits[curvature] = lm
    assert fits[structured].design.x_cov is None and fits["dense"].design.x_cov is not None
    mean_s, mean_d = (np.asarray(fits[c].gaussian.mean) for c in (structured, "dense"))
    sd_s, sd_d = (np.sqrt(np.asarray(fits[c].gaussian.curvature.variance())) for c in (structured, "dense"))
    np.testing.assert_array_less(np.abs(mean_s - mean_d) / sd_d, 0.1)
    np.testing.assert_allclose(sd_s, sd_d, rtol=0.1)
    return fits


@pytest.mark.slow  # 10 s on one core: runs where CI=true (Makefile)
def test_nested_fit_with_the_arrowhead_agrees_with_the_dense_one():
    """Nested Laplace over sigma, inner fits structured (float64, exact log-determinant gradient
    for the mean shift, coarser lattice, per-coordinate summary) against the dense inner fits
    (sigma points, the package's small-model lattice): the same method, so the same answer up to
    the design's and the mean shift's approximations (0.1 posterior SD on means, 10 % on SDs)."""
    args, kwargs = glmm_data(40, per_group=8, seed=3)
    fits = nested_fits_agree(glmm, args, kwargs, "arrowhead")
    beta = fits["arrowhead"].layout.site("beta")
    block_a = fits["arrowhead"].site_gaussian("beta")[1]
    block_d = fits["dense"].site_gaussian("beta")[1]
    assert beta.size == 2
    np.testing.assert_allclose(block_a, block_d, atol=0.1 * float(np.max(np.diag(block_d))))


# ------------------------------------------------------------ low-rank update


def lowrank_at(rank=None, seed=1):
    """The low-rank strategy of the wide regression, bound, and a point where several prior
    blocks are not positive definite (|beta| beyond the Student-t's inflection, 0.5 sqrt(3))."""
    x, y = wide_data()
    info = model_info(wide_regression, (x,), {"y": y})
    strategy = hessian_for(info.layout, "lowrank")
    if rank is not None:
        strategy = strategy._replace(rank=rank)
    strategy = strategy.bind(lambda z: -info.log_prior(z, (x,), {"y": y}))
    point = jnp.asarray(np.random.default_rng(seed).normal(size=info.size), jnp.float32)
    return info, strategy, (lambda z: -info.log_density(z, (x,), {"y": y})), point


@pytest.mark.slow  # 11 s on one core: runs where CI=true (Makefile)
def test_lowrank_hessian_equals_the_dense_one():
    info, strategy, neg, point = lowrank_at()
    assert strategy.rank == 30 + 1 + LOWRANK_MARGIN  # observed numbers, one global, the margin
    assert np.sum(np.abs(np.asarray(point)) > 0.5 * np.sqrt(3)) > 10  # prior blocks not positive definite
    value, grad, hess, error = strategy.evaluate(neg, point)
    dense = np.asarray(value_grad_hessian(neg, point)[2])
    structured = np.asarray(strategy.curvature(hess).precision)
    # float32 Hessian-vector products: rounding of 1e-6 of the largest entries
    np.testing.assert_allclose(structured, dense, atol=1e-4 * np.abs(dense).max())
    assert float(error) <= structure_tol(np.float32)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_lowrank_hessian_reuses_the_previous_range():
    """Given the previous evaluation's range (a regression's likelihood keeps it), the update is
    as exact from ``rank`` products as from a fresh range finder."""
    info, strategy, neg, point = lowrank_at()
    first = strategy.evaluate(neg, point)[2]
    moved = point + 0.01
    again = strategy.evaluate(neg, moved, first)
    dense = np.asarray(value_grad_hessian(neg, moved)[2])
    np.testing.assert_allclose(np.asarray(strategy.curvature(again[2]).precision), dense,
                               atol=1e-4 * np.abs(dense).max())
    assert float(again[3]) <= structure_tol(np.float32)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_lowrank_probe_catches_a_rank_too_small():
    info, strategy, neg, point = lowrank_at(rank=10)
    assert float(strategy.evaluate(neg, point)[3]) > 100 * structure_tol(np.float32)


def conjugate_wide(x, y=None):
    with numpyro.plate("coefficients", x.shape[1]):
        beta = numpyro.sample("beta", dist.Normal(0.0, 0.5))
    numpyro.sample("y", dist.Normal(x @ beta, 0.5).to_event(1), obs=y)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_auto_fits_a_wide_regression_with_the_lowrank_update_exactly():
    """p = 600 coefficients, n = 40: the plate's block-arrowhead structure does not hold (every
    coefficient meets every other through X beta), the low-rank update does; the posterior is
    Gaussian and known in closed form."""
    x, y = wide_data(n=40, p=600, seed=2)
    lm = LaplaceMatching(conjugate_wide, progress_bar=False).run(jax.random.PRNGKey(0), x, y=y)
    assert isinstance(lm.state.curvature, LowRankUpdateCurvature)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    precision = xd.T @ xd / 0.25 + np.eye(600) / 0.25
    cov = np.linalg.inv(precision)
    mean = cov @ xd.T @ yd / 0.25
    sd = np.sqrt(np.diag(cov))
    # float32: the search stops within 1e-3 posterior SDs (default_tol); variances to rounding
    np.testing.assert_array_less(np.abs(np.asarray(lm.gaussian.mean) - mean) / sd, 5e-3)
    np.testing.assert_allclose(np.sqrt(np.asarray(lm.gaussian.curvature.variance())), sd, rtol=1e-3)
    np.testing.assert_allclose(float(lm.gaussian.curvature.logdet()), np.linalg.slogdet(precision)[1], rtol=1e-5)
    assert lm.diagnostics()["trusted"]  # exact: constant importance weights


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_nested_fit_with_the_lowrank_update_agrees_with_the_dense_one():
    """Nested Laplace over sigma with low-rank inner fits (float64 inner fits, the mean shift
    by the log-determinant's gradient through the structured Hessian) against dense inner fits:
    the same method, so the same answer up to the design's and mean shift's approximations.
    More observations than coefficients (the update then has full rank, exact all the same):
    with fewer, sigma's marginal has a long tail towards zero (the data can be fitted exactly),
    which the structured fit's coarser lattice summarises less finely."""
    x, y = wide_data(n=60, p=40, seed=4)
    nested_fits_agree(wide_regression, (x,), {"y": y}, "lowrank")


def test_run_many_refuses_the_lowrank_update():
    x, y = wide_data()
    lm = LaplaceMatching(wide_regression, curvature="lowrank", progress_bar=False)
    with pytest.raises(ValueError, match="lowrank.*one data set at a time"):
        lm.run_many(jax.random.PRNGKey(0), np.stack([x, x]), y=np.stack([y, y]))


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_lowrank_error_names_the_collapsing_scale():
    """p > n with an unknown noise scale: the joint mode lets sigma collapse (the data are fitted
    exactly); the error says so without a dense spectrum."""
    x, y = wide_data(n=30, p=600, seed=5)
    lm = LaplaceMatching(wide_regression, strategy="laplace", curvature="lowrank", progress_bar=False)
    with pytest.raises(ValueError, match="sigma|noise scale"):
        lm.run(jax.random.PRNGKey(0), x, y=y)
    with pytest.raises(RuntimeError):
        lm.get_samples()  # a failed first call leaves no result


def whitened_gp_regression(x, y=None, jitter=1e-3):
    """A whitened GP with a fixed RBF kernel and Gaussian noise 2: the likelihood's Hessian in z,
    L'L / 4, has full rank n (the jitter) but the spectrum of the kernel: numerically low rank."""
    k = jnp.exp(-((x[:, None] - x[None, :]) ** 2) / 2) + jitter * jnp.eye(x.shape[0])
    with numpyro.plate("n", x.shape[0]):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(jnp.linalg.cholesky(k) @ z, 2.0).to_event(1), obs=y)


def gp_regression_data(n=600, seed=0):
    rng = np.random.default_rng(seed)
    x = np.linspace(-3, 3, n).astype(np.float32)
    return x, (np.sin(2 * x) + 2.0 * rng.normal(size=n)).astype(np.float32)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_numerical_lowrank_holds_a_smooth_kernels_hessian():
    """n = 600 observations are too many for an exact low-rank update (rank n + margin > D / 4);
    the numerical one of rank LOWRANK_NUMERICAL holds the GP's L'WL up to its jitter's tail
    (1e-3 / 4 per whitened direction, below NUMERICAL_TOL), checked against the dense Hessian."""
    x, y = gp_regression_data()
    info = model_info(whitened_gp_regression, (x, y))
    strategy = hessian_for(info.layout, "lowrank")
    assert strategy.numerical and strategy.rank == LOWRANK_NUMERICAL and strategy.structure_final
    strategy = strategy.bind(lambda z: -info.log_prior(z, (x, y)))
    neg = lambda z: -info.log_density(z, (x, y))  # noqa: E731
    point = jnp.asarray(np.random.default_rng(1).normal(size=info.size), jnp.float32)
    value, grad, hess, error = strategy.evaluate(neg, point)
    assert float(error) <= structure_tol(np.float32)
    dense = np.asarray(value_grad_hessian(neg, point)[2], np.float64)
    structured = np.asarray(strategy.curvature(hess).precision, np.float64)
    # the prior's precision is I, so entries are whitened already: the missed tail is 2.5e-4
    # per direction, and float32 products round at 1e-6 of the largest entries (about 40)
    assert np.abs(structured - dense).max() <= NUMERICAL_TOL
    np.testing.assert_allclose(float(strategy.curvature(hess).logdet()), np.linalg.slogdet(dense)[1],
                               atol=info.size * 2.5e-4 + 1e-3)  # log(1 + 2.5e-4) per missed direction


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_auto_fits_a_whitened_gp_with_the_numerical_lowrank_update():
    """The default on n = 600: the plate's arrowhead is refused (L couples every z), the numerical
    low-rank update holds; the posterior is Gaussian, known in closed form."""
    x, y = gp_regression_data()
    lm = LaplaceMatching(whitened_gp_regression, progress_bar=False).run(jax.random.PRNGKey(0), x, y)
    assert isinstance(lm.state.curvature, LowRankUpdateCurvature)
    xd = x.astype(np.float64)
    chol = np.linalg.cholesky(np.exp(-((xd[:, None] - xd[None, :]) ** 2) / 2) + 1e-3 * np.eye(x.size))
    precision = np.eye(x.size) + chol.T @ chol / 4.0
    cov = np.linalg.inv(precision)
    mean, sd = cov @ chol.T @ y.astype(np.float64) / 4.0, np.sqrt(np.diag(cov))
    # float32: the search stops within 1e-3 posterior SDs (default_tol); the missed tail moves a
    # variance by at most 2.5e-4 of the prior's, i.e. the SD by 1.25e-4 / sd^2 of itself
    np.testing.assert_array_less(np.abs(np.asarray(lm.gaussian.mean) - mean) / sd, 5e-3)
    np.testing.assert_allclose(np.sqrt(np.asarray(lm.gaussian.curvature.variance())), sd, rtol=2e-3)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_numerical_lowrank_is_refused_where_the_spectrum_does_not_fall_off():
    """A random n x n design: A'A has no small numerical rank. curvature='lowrank' is refused at
    the first point (not approximated), naming the cause."""
    def full_rank_likelihood(a, y=None):
        with numpyro.plate("n", a.shape[1]):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(a @ z, 1.0).to_event(1), obs=y)

    rng = np.random.default_rng(0)
    a = (rng.normal(size=(600, 600)) / np.sqrt(600)).astype(np.float32)
    y = rng.normal(size=600).astype(np.float32)
    lm = LaplaceMatching(full_rank_likelihood, curvature="lowrank", progress_bar=False)
    with pytest.raises(StructureError, match="not close to rank 128"):
        lm.run(jax.random.PRNGKey(0), a, y)
    assert choose_curvature(model_info(full_rank_likelihood, (a, y)).layout) == "arrowhead"
