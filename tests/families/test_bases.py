"""Each LM basis: round trip, codomain, and log|det J| against autodiff."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.distributions import constraints
from numpyro.distributions.util import matrix_to_tril_vec

import numpyro_lm
from numpyro_lm.families.bases import (
    SymmetricMatrixExpTransform,
    ZeroSumSoftmaxTransform,
    basis_for_constraint,
    get_basis,
    register_basis,
)

pytestmark = pytest.mark.usefixtures("x64")

# (basis name, constraint, shape of basis coordinates, coordinates of x that are free)
CASES = [
    ("identity", constraints.real, (3,), None),
    ("identity", constraints.real_vector, (4,), None),
    ("log", constraints.positive, (3,), None),
    ("log", constraints.greater_than(-2.5), (3,), None),
    ("log", constraints.independent(constraints.positive, 1), (3,), None),
    ("logit", constraints.unit_interval, (3,), None),
    ("logit", constraints.interval(-1.0, 4.0), (3,), None),
    ("sqrt", constraints.positive, (3,), None),
    ("softmax", constraints.simplex, (4,), "simplex"),
    ("logm", constraints.positive_definite, (6,), "tril"),
    ("sqrtm", constraints.positive_definite, (6,), "tril"),
    ("biject_to", constraints.corr_cholesky, (3,), "corr"),
    ("biject_to", constraints.ordered_vector, (4,), None),
]


def _free(kind, x):
    """The coordinates of ``x`` in which numpyro measures densities on its support."""
    if kind == "simplex":
        return x[..., :-1]
    if kind == "tril":
        return matrix_to_tril_vec(x)
    if kind == "corr":
        return matrix_to_tril_vec(x, diagonal=-1)
    return x


def _transform(name, constraint):
    return get_basis(name).transform(constraint)


@pytest.mark.parametrize("name,constraint,shape,kind", CASES)
def test_round_trip_and_codomain(name, constraint, shape, kind):
    t = _transform(name, constraint)
    y = jax.random.normal(jax.random.PRNGKey(0), shape)
    if name == "sqrt":
        y = jnp.abs(y) + 0.5  # the sqrt basis inverts to the positive root
    if name == "sqrtm":
        y = jnp.array([1.5, 0.2, 1.2, -0.1, 0.3, 2.0])  # a positive definite root
    x = t(y)
    assert bool(jnp.all(constraint.check(x)))
    np.testing.assert_allclose(t.inv(x), y, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name,constraint,shape,kind", CASES)
def test_log_abs_det_jacobian_matches_autodiff(name, constraint, shape, kind):
    t = _transform(name, constraint)
    y = 0.7 * jax.random.normal(jax.random.PRNGKey(1), shape)
    if name == "sqrt":
        y = jnp.abs(y) + 0.5
    event_dim = t.domain.event_dim
    if event_dim == 0:  # elementwise: the Jacobian is diagonal
        expected = jnp.log(jnp.abs(jax.vmap(jax.grad(lambda v: t(v)))(y)))
    else:
        jac = jax.jacobian(lambda v: _free(kind, t(v)))(y)
        expected = jnp.linalg.slogdet(jac)[1]
    np.testing.assert_allclose(t.log_abs_det_jacobian(y, t(y)), expected, rtol=1e-8, atol=1e-8)


def test_softmax_basis_is_zero_sum_softmax():
    y = jnp.array([0.3, -1.2, 2.0])
    x = ZeroSumSoftmaxTransform()(y)
    z = jnp.log(x) - jnp.mean(jnp.log(x))
    # V is orthonormal: |z| = |y| and z sums to zero
    np.testing.assert_allclose(jnp.sum(z), 0.0, atol=1e-12)
    np.testing.assert_allclose(jnp.linalg.norm(z), jnp.linalg.norm(y), rtol=1e-12)


def test_matrix_exp_log_det_matches_daleckii_krein():
    """Closed form: sum_i l_i + sum_{i<j} log((e^l_i - e^l_j) / (l_i - l_j))."""
    y = jnp.array([0.4, -0.3, 1.1, 0.2, 0.5, -0.9])
    t = SymmetricMatrixExpTransform()
    s = jnp.zeros((3, 3)).at[jnp.tril_indices(3)].set(y)
    s = s + s.T - jnp.diag(jnp.diag(s))
    lam = jnp.linalg.eigvalsh(s)
    i, j = jnp.triu_indices(3, 1)
    closed = jnp.sum(lam) + jnp.sum(jnp.log((jnp.exp(lam[i]) - jnp.exp(lam[j])) / (lam[i] - lam[j])))
    np.testing.assert_allclose(t.log_abs_det_jacobian(y, t(y)), closed, rtol=1e-10)
    np.testing.assert_allclose(t(y), jax.scipy.linalg.expm(s), rtol=1e-10)


def test_matrix_square_log_det_matches_closed_form():
    """sum_{i<=j} log|r_i + r_j| over the eigenvalues of R."""
    from numpyro_lm.families.bases import SymmetricMatrixSquareTransform

    y = jnp.array([1.5, 0.2, 1.2, -0.1, 0.3, 2.0])
    t = SymmetricMatrixSquareTransform()
    r = jnp.zeros((3, 3)).at[jnp.tril_indices(3)].set(y)
    r = r + r.T - jnp.diag(jnp.diag(r))
    lam = jnp.linalg.eigvalsh(r)
    i, j = jnp.triu_indices(3)
    np.testing.assert_allclose(t.log_abs_det_jacobian(y, t(y)), jnp.sum(jnp.log(jnp.abs(lam[i] + lam[j]))), rtol=1e-10)


@pytest.mark.slow  # 8 s on one core: runs where CI=true (Makefile)
def test_matrix_exp_log_det_has_finite_hessian_at_identity():
    # eigh-based formulas have no derivative where eigenvalues coincide (at X = I)
    t = SymmetricMatrixExpTransform()
    h = jax.hessian(lambda y: t.log_abs_det_jacobian(y, t(y)))(jnp.zeros(6))
    assert bool(jnp.all(jnp.isfinite(h)))


@pytest.mark.parametrize(
    "constraint,expected",
    [
        (constraints.real, "identity"),
        (constraints.real_vector, "identity"),
        (constraints.positive, "log"),
        (constraints.greater_than(1.0), "log"),
        (constraints.softplus_positive, "log"),
        (constraints.independent(constraints.positive, 1), "log"),
        (constraints.unit_interval, "logit"),
        (constraints.interval(0.0, 2.0), "logit"),
        (constraints.simplex, "softmax"),
        (constraints.positive_definite, "logm"),
        (constraints.corr_cholesky, "biject_to"),
        (constraints.lower_cholesky, "biject_to"),
    ],
)
def test_default_basis_by_constraint(constraint, expected):
    assert basis_for_constraint(constraint).name == expected


def test_registry_does_not_touch_numpyro_biject_to():
    from numpyro.distributions.transforms import StickBreakingTransform, biject_to

    assert isinstance(biject_to(constraints.simplex), StickBreakingTransform)


def test_register_new_basis_and_unknown_name():
    from numpyro.distributions.transforms import SoftplusTransform

    register_basis("softplus_test", lambda c: SoftplusTransform(), "gaussian")
    assert "softplus_test" in numpyro_lm.families.bases.basis_names()
    with pytest.raises(ValueError, match="unknown basis 'nope'"):
        get_basis("nope")
