"""The one Newton method, its convergence rule, and the L-BFGS warm start."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.mode.derivatives import hvp, value_grad_hessian
from numpyro_lm.mode.lbfgs import lbfgs
from numpyro_lm.mode.newton import newton, newton_init
from numpyro_lm.mode.steps import newton_step

pytestmark = pytest.mark.usefixtures("x64")


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def saddle(v):
    return v[0] ** 2 - v[1] ** 2 + 0.25 * v[1] ** 4


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_value_grad_hessian_matches_jax():
    x = jnp.array([0.3, -1.2, 0.8])
    value, grad, hess = value_grad_hessian(rosenbrock, x)
    np.testing.assert_allclose(value, rosenbrock(x))
    np.testing.assert_allclose(grad, jax.grad(rosenbrock)(x), rtol=1e-12)
    np.testing.assert_allclose(hess, jax.hessian(rosenbrock)(x), rtol=1e-12)


@jax.custom_vjp
def _square(x):
    return x**2


_square.defvjp(lambda x: (x**2, x), lambda x, g: (2.0 * g * x,))


@jax.custom_vjp
def _cube_sum(x):
    """sum(x^3) whose reverse rule calls another custom_vjp, as odeint's adjoint calls odeint:
    the gradient exists, forward mode through it is refused."""
    return jnp.sum(x**3)


_cube_sum.defvjp(lambda x: (jnp.sum(x**3), x), lambda x, g: (3.0 * g * _square(x),))


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_curvature_of_a_custom_vjp_goes_reverse_over_reverse():
    # the Hessian of sum(x^3) + rosenbrock is diag(6 x) + rosenbrock's: a closed form to compare with
    def fn(x):
        return _cube_sum(x) + rosenbrock(x)

    x, v = jnp.array([0.3, -1.2, 0.8]), jnp.array([1.0, 0.5, -2.0])
    with pytest.raises(TypeError, match="forward-mode"):
        jax.jvp(jax.grad(fn), (x,), (v,))
    exact = jnp.diag(6.0 * x) + jax.hessian(rosenbrock)(x)
    np.testing.assert_allclose(hvp(fn, x, v), exact @ v, rtol=1e-12)
    value, grad, hess = value_grad_hessian(fn, x)
    np.testing.assert_allclose(value, fn(x), rtol=1e-12)
    np.testing.assert_allclose(hess, exact, rtol=1e-12)
    # the forward-over-reverse path stays for everything else
    np.testing.assert_allclose(hvp(rosenbrock, x, v), jax.hessian(rosenbrock)(x) @ v, rtol=1e-12)


def test_newton_solves_a_quadratic_in_one_step():
    a = jnp.array([[3.0, 1.0], [1.0, 2.0]])
    b = jnp.array([1.0, -4.0])
    state = newton(lambda x: 0.5 * x @ a @ x - b @ x, newton_init(jnp.zeros(2)), 1e-9, 20)
    # one evaluation at the start, one at the exact solution (which certifies it)
    assert bool(state.converged) and int(state.num_iter) == 2
    np.testing.assert_allclose(state.x, jnp.linalg.solve(a, b), rtol=1e-12)
    # the curvature at the mode comes with the convergence check
    np.testing.assert_allclose(state.hess, a, rtol=1e-12)
    np.testing.assert_allclose(state.chol @ state.chol.T, a, rtol=1e-12)


@pytest.mark.slow
def test_newton_converges_on_rosenbrock_through_indefinite_hessians():
    state = newton(rosenbrock, newton_init(jnp.array([-1.2, 1.0, 0.5])), 1e-9, 500)
    assert bool(state.converged) and bool(state.positive)
    np.testing.assert_allclose(state.x, jnp.ones(3), rtol=1e-8)
    np.testing.assert_allclose(state.hess, jax.hessian(rosenbrock)(state.x), rtol=1e-10)


def test_newton_escapes_a_saddle():
    """Saddle-free steps (|eigenvalues|) move away from the saddle at y = 0."""
    state = newton(saddle, newton_init(jnp.array([1.0, 1e-3])), 1e-9, 200)
    assert bool(state.converged)
    np.testing.assert_allclose(jnp.abs(state.x), jnp.array([0.0, jnp.sqrt(2.0)]), atol=1e-8)
    assert float(jnp.min(jnp.linalg.eigvalsh(state.hess))) > 0


def test_newton_in_chunks_gives_the_same_iterates():
    run = jax.jit(lambda state, until: newton(rosenbrock, state, 1e-9, until))
    one = run(newton_init(jnp.array([-1.2, 1.0, 0.5])), 500)
    state = newton_init(jnp.array([-1.2, 1.0, 0.5]))
    for until in range(5, 505, 5):
        state = run(state, until)
    assert int(state.num_iter) == int(one.num_iter)
    np.testing.assert_array_equal(state.x, one.x)


def test_newton_reports_instead_of_raising():
    # an unbounded objective: the search runs out of budget, flags say so
    state = newton(lambda x: -jnp.sum(x**2), newton_init(jnp.ones(2)), 1e-9, 30)
    assert not bool(state.converged) and int(state.num_iter) <= 30
    # a start outside the support: the line search stalls at the start
    state = newton(lambda x: jnp.where(x[0] > 0, jnp.inf, x[0] ** 2), newton_init(jnp.ones(1)), 1e-9, 100)
    assert not bool(state.converged) and not bool(jnp.isfinite(state.value))


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_newton_under_vmap_matches_one_by_one():
    targets = jnp.array([0.5, -2.0, 3.0])

    def solve(t):
        return newton(lambda x: jnp.sum((x - t) ** 4) + jnp.sum((x - t) ** 2), newton_init(jnp.zeros(2)), 1e-9, 100)

    batched = jax.vmap(solve)(targets)
    for i, t in enumerate(targets):
        np.testing.assert_array_equal(batched.x[i], solve(t).x)
        np.testing.assert_allclose(batched.x[i], jnp.full(2, t), rtol=1e-8)


@pytest.mark.parametrize("eigenvalues", [[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0], [-2.0, -1.0, -0.5]])
def test_newton_step_is_newton_or_saddle_free(eigenvalues):
    q = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(0), (3, 3)))[0]
    hess = (q * jnp.array(eigenvalues)) @ q.T
    grad = jnp.array([0.3, -1.0, 2.0])
    step, decrement, chol, positive = newton_step(grad, hess)
    # |H| has the eigenvalues' magnitudes: equal to H where it is positive definite
    abs_hess = (q * jnp.abs(jnp.array(eigenvalues))) @ q.T
    assert bool(positive) == (min(eigenvalues) > 0)
    np.testing.assert_allclose(step, -jnp.linalg.solve(abs_hess, grad), rtol=1e-10)
    np.testing.assert_allclose(decrement, jnp.sqrt(grad @ jnp.linalg.solve(abs_hess, grad)), rtol=1e-10)
    assert float(grad @ step) < 0  # a descent direction either way
    if positive:
        np.testing.assert_allclose(chol @ chol.T, hess, atol=1e-12)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_lbfgs_then_newton():
    x, num_iter, grad_norm = lbfgs(rosenbrock, jnp.array([-1.2, 1.0, 0.5]), 1e-6, 500)
    assert int(num_iter) < 500
    assert float(jnp.max(jnp.abs(jax.grad(rosenbrock)(x)))) < 1e-4
    state = newton(rosenbrock, newton_init(x), 1e-9, 20)
    assert bool(state.converged)
    np.testing.assert_allclose(state.x, jnp.ones(3), rtol=1e-8)


def _gp_log_density():
    """A whitened latent GP's log density over (log amp, log ls, z): the kernel's Cholesky
    factor depends on the first run only."""
    import numpyro
    import numpyro.distributions as dist

    from numpyro_lm.core.model import model_info

    x = jnp.linspace(-3.0, 3.0, 24)
    y = (jnp.sin(2 * x) > 0).astype(x.dtype)

    def model():
        amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
        ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
        k = amp**2 * jnp.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * ls**2)) + 1e-2 * jnp.eye(24)
        with numpyro.plate("n", 24):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
            numpyro.sample("y", dist.Bernoulli(logits=jnp.linalg.cholesky(k) @ z), obs=y)

    info = model_info(model)
    return info, (lambda flat: info.log_density(flat))


@pytest.mark.slow  # 15 s on one core: runs where CI=true (Makefile)
def test_hessian_by_runs_of_sites_equals_the_whole(x64):
    # float64: the two orders of summation agree to its round-off
    from numpyro_lm.core.trace import site_runs

    info, fn = _gp_log_density()
    runs = site_runs(info.layout)
    assert runs == ((0, 2), (2, 26))  # amp and ls together, then z alone
    x = jax.random.normal(jax.random.PRNGKey(0), (info.size,), jnp.float64) * 0.5
    whole = value_grad_hessian(fn, x)
    by_runs = value_grad_hessian(fn, x, runs)
    for a, b in zip(whole, by_runs):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-10)


def test_hessian_by_runs_leaves_the_kernel_undifferentiated_for_the_field():
    # the z run must not differentiate the Cholesky factor: count the cholesky derivatives
    # (their jvp is a triangular solve) in each program
    from numpyro_lm.core.trace import site_runs

    info, fn = _gp_log_density()
    x = jnp.zeros(info.size)
    whole = str(jax.make_jaxpr(lambda x: value_grad_hessian(fn, x))(x))
    by_runs = str(jax.make_jaxpr(lambda x: value_grad_hessian(fn, x, site_runs(info.layout)))(x))
    # whole: the solves are batched over all 26 directions; by runs: over the 2 hyperparameters'
    assert "triangular_solve" in whole and "[26,24,24]" in whole
    assert "[26,24,24]" not in by_runs and "[2,24,24]" in by_runs
