"""The mode search and the Gaussian at the mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.laplace import (
    FAST_COMPILE,
    evaluate,
    gaussian_from_eigh,
    initial_state,
    lbfgs_minimize,
    modified_cholesky,
    newton_minimize,
    trial_newton_minimize,
    usable_compiler_options,
    value_grad_hessian,
)

pytestmark = pytest.mark.usefixtures("x64")


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def test_value_grad_hessian_matches_jax():
    x = jnp.array([0.3, -1.2, 0.8])
    value, grad, hess = value_grad_hessian(rosenbrock, x)
    np.testing.assert_allclose(value, rosenbrock(x))
    np.testing.assert_allclose(grad, jax.grad(rosenbrock)(x), rtol=1e-12)
    np.testing.assert_allclose(hess, jax.hessian(rosenbrock)(x), rtol=1e-12)


def test_newton_solves_a_quadratic_in_one_step():
    a = jnp.array([[3.0, 1.0], [1.0, 2.0]])
    b = jnp.array([1.0, -4.0])
    fn = lambda x: 0.5 * x @ a @ x - b @ x
    state = newton_minimize(fn, initial_state(jnp.zeros(2)), 1e-9, 20)
    assert bool(state.converged) and int(state.num_iter) == 1
    np.testing.assert_allclose(state.x, jnp.linalg.solve(a, b), rtol=1e-12)
    # the curvature at the mode comes with the convergence check
    assert bool(state.fresh)
    np.testing.assert_allclose(state.hess, a, rtol=1e-12)


def test_newton_converges_on_rosenbrock():
    state = newton_minimize(rosenbrock, initial_state(jnp.array([-1.2, 1.0, 0.5])), 1e-9, 200)
    assert bool(state.converged)
    np.testing.assert_allclose(state.x, jnp.ones(3), rtol=1e-8)


def test_newton_escapes_a_saddle():
    """Saddle-free steps (|eigenvalues|) move away from the saddle at y = 0."""
    fn = lambda v: v[0] ** 2 - v[1] ** 2 + 0.25 * v[1] ** 4
    state = newton_minimize(fn, initial_state(jnp.array([1.0, 1e-3])), 1e-9, 100)
    assert bool(state.converged)
    np.testing.assert_allclose(jnp.abs(state.x), jnp.array([0.0, jnp.sqrt(2.0)]), atol=1e-8)
    assert float(jnp.min(state.eigenvalues)) > 0


def test_trial_newton_converges_from_a_non_convex_start():
    # Rosenbrock from (-1.2, 1, 0.5): indefinite Hessians on the way (modified Cholesky steps)
    state = trial_newton_minimize(rosenbrock, jnp.array([-1.2, 1.0, 0.5]), 1e-9, 500)
    assert bool(state.converged) and bool(state.positive) and bool(state.fresh)
    np.testing.assert_allclose(state.x, jnp.ones(3), rtol=1e-8)
    np.testing.assert_allclose(state.chol @ state.chol.T, jax.hessian(rosenbrock)(state.x), rtol=1e-10)
    # and on the saddle function: the shifted factor moves away from y = 0
    fn = lambda v: v[0] ** 2 - v[1] ** 2 + 0.25 * v[1] ** 4
    state = trial_newton_minimize(fn, jnp.array([1.0, 1e-3]), 1e-9, 200)
    assert bool(state.converged)
    np.testing.assert_allclose(jnp.abs(state.x), jnp.array([0.0, jnp.sqrt(2.0)]), atol=1e-8)


@pytest.mark.parametrize("eigenvalues", [[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0], [-2.0, -1.0, -0.5]])
def test_modified_cholesky_is_exact_or_positive_definite(eigenvalues):
    q = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(0), (3, 3)))[0]
    hess = (q * jnp.array(eigenvalues)) @ q.T
    chol, positive = modified_cholesky(hess)
    assert bool(positive) == (min(eigenvalues) > 0)
    if positive:
        np.testing.assert_allclose(chol @ chol.T, hess, atol=1e-12)
    else:  # hess + mu I with mu past Gershgorin's bound: a positive definite factor
        shift = chol @ chol.T - hess
        np.testing.assert_allclose(shift, shift[0, 0] * jnp.eye(3), atol=1e-12)
        assert float(shift[0, 0]) + min(eigenvalues) > 0


def test_lbfgs_then_newton():
    state = lbfgs_minimize(rosenbrock, initial_state(jnp.array([-1.2, 1.0, 0.5])), 1e-6, 500)
    assert float(state.grad_norm) < 1e-6
    state = newton_minimize(rosenbrock, state, 1e-9, 510)
    assert bool(state.converged)
    np.testing.assert_allclose(state.x, jnp.ones(3), rtol=1e-8)


def test_gaussian_from_eigh_and_sampling():
    precision = jnp.array([[2.0, 0.9], [0.9, 1.0]])
    state = evaluate(lambda x: 0.5 * x @ precision @ x, initial_state(jnp.zeros(2)))
    g = gaussian_from_eigh(state.x, state.hess, state.eigenvalues, state.eigenvectors)
    np.testing.assert_allclose(g.cov, jnp.linalg.inv(precision), rtol=1e-12)
    n = 40000
    draws = g.sample(jax.random.PRNGKey(0), n)
    # covariance entries have MC standard error ~ sqrt(2/n) * scale ~ 0.007
    np.testing.assert_allclose(jnp.cov(draws.T), g.cov, atol=0.05)
    np.testing.assert_allclose(draws.mean(0), 0.0, atol=0.03)


def test_not_positive_definite_gives_nan_covariance():
    g = gaussian_from_eigh(jnp.zeros(2), jnp.diag(jnp.array([1.0, -1.0])), jnp.array([-1.0, 1.0]), jnp.eye(2))
    assert not bool(jnp.all(jnp.isfinite(g.cov)))


def test_fast_compile_options_unknown_to_this_jaxlib_are_dropped(monkeypatch):
    import numpyro_lm.laplace as laplace

    # this jaxlib knows both of FAST_COMPILE's options: they are kept and compile
    assert usable_compiler_options(FAST_COMPILE) == FAST_COMPILE
    assert float(jax.jit(lambda x: 2 * x, compiler_options=usable_compiler_options(FAST_COMPILE))(1.0)) == 2.0
    # one it does not know (as on an older jaxlib) is dropped; a user's own is passed on
    fast = dict(FAST_COMPILE, xla_no_such_option=True)
    monkeypatch.setattr(laplace, "FAST_COMPILE", fast)
    assert usable_compiler_options(fast) == FAST_COMPILE
    assert "xla_user_option" in usable_compiler_options({"xla_user_option": 1})
    assert usable_compiler_options(None) is None
