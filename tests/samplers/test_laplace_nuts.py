"""numpyro_lm.samplers.laplace_nuts: NUTS over hyperparameters on the Laplace marginal of the latent
field; exact where the latent field is Gaussian given the hyperparameters."""

from functools import partial

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from numpyro_lm.samplers.laplace_nuts import LaplaceNUTS, default_marginalized
from numpyro_lm.samplers.tilted_nuts import retilted
from numpyro_lm.core.model import model_info
from shared_models import Y, exact_posterior, gaussian_hierarchy, whitened_field


@pytest.mark.parametrize("precision", ["x32", pytest.param("x64", marks=pytest.mark.slow)])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_gaussian_hierarchy_gives_the_exact_marginal_of_the_hyperparameter(precision, request):
    request.getfixturevalue(precision)
    kernel = LaplaceNUTS(gaussian_hierarchy)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), Y, extra_fields=("inner_failed",))
    s = mcmc.get_samples()
    mean, sd, theta_mean, theta_sd = exact_posterior(Y)
    assert "NUTS over ['mu'], Laplace over ['theta']" in repr(kernel)
    # MC error of a mean from ~500 effective draws: 0.045 sd; the bound is over 3 of them
    assert abs(float(s["mu"].mean()) - mean) < 0.15 * sd
    assert float(s["mu"].std()) == pytest.approx(sd, rel=0.1)  # sd of an sd estimate: ~3%
    # theta drawn from the conditional Laplace Gaussian (exact here) given each mu
    np.testing.assert_allclose(s["theta"].mean(0), theta_mean, atol=0.15 * theta_sd)
    np.testing.assert_allclose(s["theta"].std(0), theta_sd, rtol=0.1)
    assert int(mcmc.get_extra_fields()["inner_failed"].sum()) == 0


@pytest.mark.parametrize("chain_method", ["sequential", pytest.param("vectorized", marks=pytest.mark.slow)])
@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_chains_run_sequential_and_vectorized(chain_method):
    """Two chains as MCMC runs them: sequential (init outside any transform: the structure
    check and the compiled programs of the first chain serve the second) and vectorized (init
    under vmap: no check on traced values). Both hold every latent site for each chain and
    agree with the closed-form marginal of mu (200 draws a chain: MC error 0.1 sd, bound 4 of them)."""
    mcmc = MCMC(LaplaceNUTS(gaussian_hierarchy), num_warmup=100, num_samples=200, num_chains=2,
                chain_method=chain_method, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), Y)
    s = mcmc.get_samples(group_by_chain=True)
    assert s["mu"].shape == (2, 200) and s["theta"].shape == (2, 200, Y.shape[0])
    assert not np.allclose(s["mu"][0], s["mu"][1])  # two chains, not one copied
    mean, sd, _, _ = exact_posterior(Y)
    assert abs(float(s["mu"].mean()) - mean) < 0.4 * sd


PARALLEL_CHAINS = """
import json, jax, jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
from numpyro.infer import MCMC
from numpyro_lm.mode.hessian import DenseHessian
from numpyro_lm.samplers.laplace_nuts import LaplaceNUTS
from shared_models import Y, exact_posterior, gaussian_hierarchy, whitened_field

def run(kernel, *args, **kwargs):
    mcmc = MCMC(kernel, num_warmup=100, num_samples=200, num_chains=2, chain_method="parallel", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), *args, **kwargs)
    return mcmc

out = {"devices": jax.local_device_count()}
s = run(LaplaceNUTS(gaussian_hierarchy), Y).get_samples(group_by_chain=True)
out["shapes"] = [list(s["mu"].shape), list(s["theta"].shape)]
out["distinct"] = not bool(np.allclose(s["mu"][0], s["mu"][1]))
mean, sd, _, _ = exact_posterior(Y)
out["mu_error_sds"] = abs(float(s["mu"].mean()) - mean) / sd
x = jnp.linspace(-3, 3, 40)
kernel = LaplaceNUTS(whitened_field)
mcmc = run(kernel, x, (jnp.sin(2 * x) > 0).astype(jnp.float32))
out["dense"] = isinstance(kernel.inner_hessian, DenseHessian)
out["divergent"] = float(np.mean(mcmc.get_extra_fields()["diverging"]))

def no_mode():
    phi = numpyro.sample("phi", dist.Normal(0.0, 1.0))
    with numpyro.plate("one", 1):
        theta = numpyro.sample("theta", dist.ImproperUniform(dist.constraints.real, (), ()))
    numpyro.factor("f", 0.5 * jnp.sum(theta**2) + 0.0 * phi)

try:
    run(LaplaceNUTS(no_mode))
    out["no_mode"] = "ran"
except FloatingPointError as error:
    out["no_mode"] = str(error)
print(json.dumps(out))
"""


@pytest.mark.slow  # 20 s on two cores: runs where CI=true (Makefile)
def test_parallel_chains_check_the_start_as_the_other_chain_methods_do():
    """chain_method="parallel" runs each chain's init inside pmap, where no value can be read;
    the structure and the first mode are checked once, eagerly, at a start of the init strategy.
    Two host devices in a fresh interpreter (XLA reads the device count once): the chains hold
    every site and agree with the closed-form marginal of mu (MC error 0.1 sd, bound 4 of them),
    a plate whose entries interact gets the dense inner Hessian (before, the arrowhead's probe
    failed every inner search: every transition divergent), and a start with no mode is the
    clear error of the other methods."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"))
    done = subprocess.run([sys.executable, "-c", PARALLEL_CHAINS], capture_output=True, text=True, timeout=600,
                          env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: shared_models
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["devices"] == 2
    assert out["shapes"] == [[2, 200], [2, 200, Y.shape[0]]] and out["distinct"]
    assert out["mu_error_sds"] < 0.4
    assert out["dense"] and out["divergent"] < 0.05
    assert "conditional mode of the latent field" in out["no_mode"]


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_the_default_split_and_refusals():
    info = model_info(gaussian_hierarchy, (Y,))
    assert default_marginalized(info.layout) == ["theta"]
    kernel = LaplaceNUTS(gaussian_hierarchy)
    assert kernel.split is None and repr(kernel) == "LaplaceNUTS(marginalize=chosen at run())"
    MCMC(kernel, num_warmup=5, num_samples=5, progress_bar=False).run(jax.random.PRNGKey(0), Y)
    assert kernel.split == (["mu"], ["theta"])
    assert repr(kernel) == "LaplaceNUTS(NUTS over ['mu'], Laplace over ['theta'])"

    def globals_only(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(ValueError, match="no latent site to integrate out"):
        MCMC(LaplaceNUTS(globals_only), num_warmup=5, num_samples=5, progress_bar=False).run(
            jax.random.PRNGKey(0), Y)
    with pytest.raises(ValueError, match="leaving no hyperparameter"):
        MCMC(LaplaceNUTS(gaussian_hierarchy, marginalize=["mu", "theta"]), num_warmup=5, num_samples=5,
             progress_bar=False).run(jax.random.PRNGKey(0), Y)
    with pytest.raises(ValueError, match="not latent sites"):
        MCMC(LaplaceNUTS(gaussian_hierarchy, marginalize=["beta"]), num_warmup=5, num_samples=5,
             progress_bar=False).run(jax.random.PRNGKey(0), Y)
    with pytest.raises(TypeError, match="potential_fn"):
        LaplaceNUTS(gaussian_hierarchy, potential_fn=lambda z: 0.0)


@pytest.mark.slow
def test_a_failed_inner_solve_is_an_infinite_potential_never_a_silent_draw():
    # theta | phi has a mode only while phi < 0.5: beyond, the density grows without bound
    def model():
        phi = numpyro.sample("phi", dist.Normal(0.0, 1.0))
        with numpyro.plate("one", 1):
            theta = numpyro.sample("theta", dist.ImproperUniform(dist.constraints.real, (), ()))
        numpyro.factor("f", -0.5 * (0.5 - phi) * jnp.sum(theta**2))

    kernel = LaplaceNUTS(model)
    mcmc = MCMC(kernel, num_warmup=300, num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), extra_fields=("inner_failed", "diverging"))
    assert np.isinf(float(kernel.potential_energy(jnp.array([1.0]))))
    phi = np.asarray(mcmc.get_samples()["phi"])
    assert phi.max() < 0.5  # no draw where no mode exists
    fields = mcmc.get_extra_fields()
    assert int(fields["inner_failed"].sum()) == 0
    # the exact marginal p(phi) ~ N(phi; 0, 1) / sqrt(0.5 - phi) has 31% of the prior's mass
    # cut away: trajectories reach the boundary and are counted as divergent
    assert int(fields["diverging"].sum()) > 0


@pytest.mark.slow
def test_no_mode_at_the_start_is_a_clear_error():
    def model():
        phi = numpyro.sample("phi", dist.Normal(0.0, 1.0))
        with numpyro.plate("one", 1):
            theta = numpyro.sample("theta", dist.ImproperUniform(dist.constraints.real, (), ()))
        numpyro.factor("f", 0.5 * jnp.sum(theta**2) + 0.0 * phi)  # no mode for any phi

    with pytest.raises(FloatingPointError, match="conditional mode"):
        MCMC(LaplaceNUTS(model), num_warmup=5, num_samples=5, progress_bar=False).run(jax.random.PRNGKey(0))


def test_unknown_nuts_options_are_refused_by_name():
    with pytest.raises(TypeError, match="target_accept"):
        LaplaceNUTS(gaussian_hierarchy, target_accept=0.9)
    LaplaceNUTS(gaussian_hierarchy, target_accept_prob=0.9, max_tree_depth=8)  # NUTS's own names work
    with pytest.raises(ValueError, match="curvature"):
        LaplaceNUTS(gaussian_hierarchy, curvature="lowrank")
    with pytest.raises(ValueError, match="quadrature"):
        LaplaceNUTS(gaussian_hierarchy, quadrature="delayed")


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_model_that_uses_its_data_in_numpy_runs():
    # a plate size read with NumPy from the data, as models written for MCMC do
    def model(group, y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        with numpyro.plate("group", int(np.max(group)) + 1):
            theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(theta[group], 1.0), obs=y)

    group = np.array([0, 1, 2, 2, 1, 0])
    mcmc = MCMC(LaplaceNUTS(model), num_warmup=50, num_samples=50, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), group, Y)
    assert mcmc.get_samples()["theta"].shape == (50, 3)


def random_intercepts(group, num_groups, y=None):
    b0 = numpyro.sample("b0", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", group.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=b0 + sigma * z[group]), obs=y)


def exact_log_marginal(b0, sigma, group, y):
    """log p(y | b0, sigma): each group's integral over z on a fine grid, in float64."""
    z = np.linspace(-10, 10, 8001)
    eta = b0 + sigma * z[None, :]
    total = 0.0
    for j in range(group.max() + 1):
        yj = y[group == j][:, None]
        log_lik = np.sum(yj * eta - np.logaddexp(0.0, eta), axis=0) - 0.5 * z**2 - 0.5 * np.log(2 * np.pi)
        top = log_lik.max()
        total += top + np.log(np.trapezoid(np.exp(log_lik - top), z))
    return total


@pytest.mark.slow  # 40 s on one core: runs where CI=true (Makefile)
def test_gauss_hermite_makes_the_binary_groups_marginal_exact():
    """40 groups of 5 binary observations: Laplace misjudges each group's integral (Breslow and
    Lin 1995), adaptive Gauss-Hermite gets it to 1e-4 nats (nested.quadrature). The potential's
    differences in sigma and its gradient against the exact marginal on a grid."""
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(40), 5).astype(np.int32)
    y = (rng.uniform(size=200) < 1 / (1 + np.exp(-(0.3 + 1.5 * rng.normal(size=40)[group])))).astype(np.float32)
    args = (group, 40)
    sigmas = np.array([0.5, 1.0, 2.0])

    def exact(s):  # -log p(sigma | y) in the log basis: HalfNormal prior and its Jacobian, b0 = 0.3
        return -(exact_log_marginal(0.3, s, group, y) + np.log(2 / np.pi) / 2 - s**2 / 2 + np.log(s))

    truth = np.array([exact(s) for s in sigmas])
    found = {}
    for quadrature in (True, False):
        kernel = LaplaceNUTS(random_intercepts, quadrature=quadrature)
        kernel.init(jax.random.PRNGKey(0), 10, None, args, {"y": y})
        # the arrowhead held at the first point: the inner searches skip its probe from then on
        assert kernel.inner_hessian.structure.local_index.shape == (40, 1) and not kernel.inner_hessian.check
        phi = lambda s: jnp.array([0.3, np.log(s)], jnp.float32)  # noqa: E731 - b0, log sigma
        found[quadrature] = np.array([float(kernel.potential_energy(phi(s))) for s in sigmas])
        if quadrature:
            grad = float(jax.grad(kernel.potential_energy)(phi(1.0))[1])
            step = 1e-4  # central difference of the exact potential in log sigma: error O(step^2)
            expected = (exact(np.exp(step)) - exact(np.exp(-step))) / (2 * step)
            assert grad == pytest.approx(expected, abs=0.02)  # float32 sums of 200 terms and 9 nodes
    # differences (the normalising constant cancels); float32 potentials of ~130 nats round at 1e-5
    quad_error = np.abs(np.diff(found[True]) - np.diff(truth)).max()
    laplace_error = np.abs(np.diff(found[False]) - np.diff(truth)).max()
    assert quad_error < 0.01, (quad_error, laplace_error)
    assert laplace_error > 10 * quad_error  # the test can fail: Laplace alone is visibly off


def binary_pairs(group, num_groups, y=None):
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", group.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=0.3 + sigma * z[group]), obs=y)


@pytest.mark.slow  # 70 s on one core: runs where CI=true (Makefile)
def test_both_quadratures_sample_the_corrected_marginal():
    """100 groups of 2 binary observations: Laplace alone puts sigma's posterior mean 18
    standard errors low; NUTS on the Laplace marginal with the quadrature's correction, by
    tilted delayed acceptance (default) or in its potential, must match the exact marginal (a
    grid over sigma of per-group integrals) within Monte Carlo error."""
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(100), 2).astype(np.int32)
    y = (rng.uniform(size=200) < 1 / (1 + np.exp(-(0.3 + 1.5 * rng.normal(size=100)[group])))).astype(np.float32)
    s = np.linspace(0.01, 5, 500)
    log_post = np.array([exact_log_marginal(0.3, v, group, y) for v in s]) - s**2 / 2  # HalfNormal(1) prior
    w = np.exp(log_post - log_post.max())
    exact_mean = np.sum(w * s) / np.sum(w)
    means = {}
    for quadrature in (True, "potential", False):
        mcmc = MCMC(LaplaceNUTS(binary_pairs, quadrature=quadrature), num_warmup=500, num_samples=2000,
                    progress_bar=False)
        mcmc.run(jax.random.PRNGKey(1), group, 100, y=y, extra_fields=("correction_rejected", "tilt"))
        draws = np.asarray(mcmc.get_samples()["sigma"])
        se = draws.std() / np.sqrt(float(az.ess(draws[None])))  # Monte Carlo standard error of the mean
        means[quadrature] = (draws.mean(), se)
        rejected, tilt = (np.asarray(mcmc.get_extra_fields()[k]) for k in ("correction_rejected", "tilt"))
        if quadrature is True:  # the tilt took up the correction's slope, fixed for the draws
            assert np.all(tilt != 0) and np.all(tilt == tilt[0]) and rejected.mean() < 0.05
        else:
            assert not tilt.any() and not rejected.any()
    for quadrature in (True, "potential"):
        mean, se = means[quadrature]
        assert abs(mean - exact_mean) < 4 * se, (quadrature, mean, exact_mean, se)  # 4 SE: 1 in 15 000
    laplace_mean, laplace_se = means[False]
    assert abs(laplace_mean - exact_mean) > 4 * laplace_se  # the test can fail: Laplace alone is off


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_new_tilt_moves_nuts_potential_and_gradient_with_it():
    """Re-tilting mid-warm-up rewrites NUTS's cached potential and gradient; they must equal
    the tilted potential's own at the point (a sign slip would bias the warm-up's moves)."""
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(40), 2).astype(np.int32)  # 40 groups: the arrowhead, scalar blocks
    y = (rng.uniform(size=80) < 0.5).astype(np.float32)
    kernel = LaplaceNUTS(binary_pairs)
    state = kernel.init(jax.random.PRNGKey(0), 10, None, (group, 40), {"y": y})
    potential = lambda phi, tilt: kernel._programs["potential"](phi, state.theta_mode, tilt)  # noqa: E731
    assert not np.any(np.asarray(state.tilt))  # no moves yet: untilted
    moves = (jnp.eye(1), jnp.array([0.8]), jnp.asarray(5, jnp.int32))  # moves whose slope is 0.8
    tilt, hmc_state = retilted(state._replace(tilt_moves=moves))
    np.testing.assert_allclose(tilt, [0.8], rtol=1e-5)
    potential = partial(potential, tilt=tilt)
    np.testing.assert_allclose(hmc_state.potential_energy, potential(hmc_state.z), rtol=1e-5)
    np.testing.assert_allclose(hmc_state.z_grad, jax.grad(potential)(hmc_state.z), rtol=1e-4, atol=1e-4)


def test_the_tilt_is_the_least_squares_slope_of_the_moves():
    """tilt_from_moves against numpy's least squares on random moves (the closed form it
    computes through running sums), exact where the change is linear in the move; a direction
    no move took gets no slope instead of a NaN."""
    from numpyro_lm.samplers.tilted_nuts import moves_added, no_moves, tilt_from_moves

    rng = np.random.default_rng(0)
    steps, slope = rng.normal(size=(40, 3)), np.array([1.5, -2.0, 0.25])
    changes = steps @ slope + 0.1 * rng.normal(size=40)
    moves = no_moves(jnp.zeros(3, jnp.float32))
    for i, (step, change) in enumerate(zip(steps, changes)):  # the last, not counted, must not count
        moves = moves_added(moves, jnp.asarray(step, jnp.float32), jnp.float32(change if i < 39 else 1e6),
                             jnp.asarray(i < 39))
    assert int(moves[2]) == 39
    expected = np.linalg.lstsq(steps[:39], changes[:39], rcond=None)[0]
    np.testing.assert_allclose(tilt_from_moves(moves), expected, rtol=1e-4)  # float32 sums of 39 terms
    flat = moves_added(no_moves(jnp.zeros(2)), jnp.array([1.0, 0.0]), jnp.float32(3.0), jnp.asarray(True))
    np.testing.assert_allclose(tilt_from_moves(flat), [3.0, 0.0], rtol=1e-5)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_move_turned_down_keeps_the_chains_mode_and_inner_hessian():
    """Delayed acceptance turning NUTS's move down leaves the chain where it was: its point, and
    the conditional mode and inner Hessian its state keeps there (no second search)."""
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(40), 2).astype(np.int32)
    y = (rng.uniform(size=80) < 0.5).astype(np.float32)
    kernel = LaplaceNUTS(binary_pairs)
    state = kernel.init(jax.random.PRNGKey(0), 10, None, (group, 40), {"y": y})
    state = state._replace(log_correction=jnp.asarray(1e6, state.log_correction.dtype))  # r(phi') - r(phi) ~ -1e6
    new = kernel.sample(state, (group, 40), {"y": y})
    assert bool(new.correction_rejected)
    np.testing.assert_array_equal(new.hmc.z, state.hmc.z)
    np.testing.assert_array_equal(new.theta_mode, state.theta_mode)
    for kept, old in zip(jax.tree.leaves(new.theta_hess), jax.tree.leaves(state.theta_hess)):
        np.testing.assert_array_equal(kept, old)


@pytest.mark.slow  # 14 s on one core: runs where CI=true (Makefile)
def test_a_plate_whose_entries_interact_gets_the_dense_inner_hessian():
    from numpyro_lm.mode.hessian import ArrowheadHessian, DenseHessian

    x = jnp.linspace(-3, 3, 40)  # 40 field coordinates: above INNER_ARROWHEAD_MIN_DIM
    y = (jnp.sin(2 * x) > 0).astype(jnp.float32)
    kernel = LaplaceNUTS(whitened_field)
    kernel.init(jax.random.PRNGKey(0), 10, None, (x, y), {})
    assert isinstance(kernel.inner_hessian, DenseHessian)  # the arrowhead's probe failed at the start
    assert np.isfinite(float(kernel.potential_energy(jnp.zeros(1))))
    explicit = LaplaceNUTS(whitened_field, curvature="arrowhead")
    with pytest.raises(ValueError, match="plate entries interact.*curvature='dense'"):
        explicit.init(jax.random.PRNGKey(0), 10, None, (x, y), {})
    assert isinstance(explicit.inner_hessian, ArrowheadHessian)


def _short_run(y, **run_kwargs):
    mcmc = MCMC(LaplaceNUTS(gaussian_hierarchy), num_warmup=20, num_samples=20, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y, **run_kwargs)
    return mcmc


@pytest.mark.parametrize("init_params, message", [
    (jnp.zeros(2), r"init_params of shape \(2,\); .* a vector of 7 \(mu \(1\), theta \(6\)\)"),
    (jnp.zeros(1), r"init_params of shape \(1,\)"),
    ({"mu": 0.5, "sigma": 1.0}, r"init_params names \['sigma'\], which are not latent sites"),
    ({"mu": np.nan}, r"init_params\['mu'\] is not finite"),
])
def test_bad_init_params_are_refused_by_name(init_params, message):
    with pytest.raises(ValueError, match=message):
        _short_run(Y, init_params=init_params)


@pytest.mark.slow
def test_init_params_as_constrained_values_start_the_chain_there():
    """The form LaplaceMatching.run and MCMC users pass: a dict of named sites (partial: the rest
    from the init strategy); the chain's first warm-up state holds the given hyperparameter."""
    kernel = LaplaceNUTS(gaussian_hierarchy)
    state = kernel.init(jax.random.PRNGKey(0), 10, {"mu": 0.7}, (Y,), {})
    assert float(state.z[0] if state.z.ndim else state.z) == pytest.approx(0.7, abs=1e-6)


def test_nan_in_the_data_is_named_as_run_names_it():
    y = Y.at[3].set(jnp.nan)
    with pytest.raises(ValueError, match=r"observed site 'y': 1 of 6 values are NaN \(at y\[3\]\)"):
        _short_run(y)
