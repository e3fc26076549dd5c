"""Laplace Matching bases: the coordinates in which each constrained site is Gaussian.

Laplace Matching (Hobbhahn and Hennig, 2021) approximates a density on a constrained
domain by a Gaussian in a *basis* ``y`` with ``x = T(y)`` chosen for that domain, so that
the matched exponential family is (nearly) Gaussian in ``y``:

=====================  ========================================================  =========
constraint             basis ``x = T(y)``                                        family
=====================  ========================================================  =========
real                   identity                                                  normal
positive, > lb         log:  ``x = lb + exp(y)``                                 gamma
unit interval, (a, b)  logit: ``x = a + (b - a) sigmoid(y)``                     beta
simplex (K)            softmax over a zero-sum lift: ``x = softmax(V y)``        dirichlet
positive definite      matrix log: ``X = expm(sym(y))`` over the lower triangle  gaussian
anything else          numpyro's ``biject_to``                                   gaussian
=====================  ========================================================  =========

``V`` is numpyro's orthonormal zero-sum lift ``R^(K-1) -> {z : 1'z = 0}``; with it
``log|det dx_{1:K-1}/dy| = sum_k log x_k + log(K)/2``.

The registry here is our own. It never touches numpyro's global ``biject_to`` (which
would change NumPyro for everyone) and falls back to it for constraints without an LM
basis. A :class:`Basis` holds a *factory* that builds the transform from the constraint
seen in the current model run, so supports that depend on other sites (``Uniform(0, 1 -
a)``) are rebuilt from the current values every time.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
from numpyro.distributions import MultivariateNormal, constraints
from numpyro.distributions.transforms import (
    AffineTransform,
    ComposeTransform,
    ExpTransform,
    IndependentTransform,
    LowerCholeskyAffine,
    ParameterFreeTransform,
    SigmoidTransform,
    ZeroSumTransform,
    biject_to,
)
from numpyro.distributions.util import matrix_to_tril_vec, vec_to_tril_matrix

__all__ = [
    "Basis",
    "basis_for_prior",
    "ZeroSumSoftmaxTransform",
    "SymmetricMatrixExpTransform",
    "SymmetricMatrixSquareTransform",
    "SquareTransform",
    "register_basis",
    "basis_names",
    "get_basis",
    "basis_for_constraint",
]


# --------------------------------------------------------------------------- transforms


class ZeroSumSoftmaxTransform(ParameterFreeTransform):
    r"""``R^(K-1) -> simplex_K``: ``x = softmax(V y)`` with ``V`` the orthonormal zero-sum lift.

    This is the softmax basis of Laplace Matching for the Dirichlet (thesis section 3.4,
    LM paper Appendix B.4). Unlike numpyro's stick-breaking transform, the zero-sum
    logits ``z = V y = log x - mean(log x)`` are exactly the coordinates in which the
    Dirichlet's Laplace approximation has the closed form of the Laplace Bridge.

    :math:`\log|\det \partial x_{1:K-1} / \partial y| = \sum_k \log x_k + \tfrac12 \log K`.
    """

    domain = constraints.real_vector
    codomain = constraints.simplex

    def __call__(self, y):
        return jax.nn.softmax(ZeroSumTransform()(y), axis=-1)

    def _inverse(self, x):
        log_x = jnp.log(x)
        z = log_x - jnp.mean(log_x, axis=-1, keepdims=True)
        return ZeroSumTransform().inv(z)

    def log_abs_det_jacobian(self, y, x, intermediates=None):
        log_x = jax.nn.log_softmax(ZeroSumTransform()(y), axis=-1)
        return jnp.sum(log_x, axis=-1) + 0.5 * jnp.log(y.shape[-1] + 1.0)

    def forward_shape(self, shape):
        return shape[:-1] + (shape[-1] + 1,)

    def inverse_shape(self, shape):
        return shape[:-1] + (shape[-1] - 1,)


def _symmetric_from_tril_vec(v):
    lower = vec_to_tril_matrix(v)
    return lower + jnp.swapaxes(lower, -1, -2) - lower * jnp.eye(lower.shape[-1])


def _expm_symmetric(s, squarings=10, order=12):
    """Matrix exponential by Taylor series and a *fixed* number of squarings.

    jax.scipy.linalg.expm chooses its number of squarings at run time, which breaks the
    third derivatives the Newton optimiser needs (the Jacobian log-determinant enters the
    potential). With eigenvalues of ``s`` below ~100 in magnitude the truncation error of
    order 12 on ``s / 2**10`` is below float64 rounding (order 8 on ``s / 2**6`` for
    spreads below ~20, used inside the log-Jacobian).
    """
    a = s / (2.0**squarings)
    eye = jnp.broadcast_to(jnp.eye(s.shape[-1], dtype=s.dtype), s.shape)
    term, total = eye, eye
    for k in range(1, order + 1):
        term = term @ a / k
        total = total + term
    return lax.fori_loop(0, squarings, lambda _, m: m @ m, total)


def _batch_over_leading(fn, y):
    flat = y.reshape((-1, y.shape[-1]))
    return jax.vmap(fn)(flat).reshape(y.shape[:-1])


def _logm_log_abs_det(y):
    """``log|det d vech(expm(S)) / d vech(S)|`` without an eigen-decomposition.

    On ``vec(S)`` the derivative of ``expm`` is ``(I (x) e^S) phi(K)`` with the Kronecker
    sum ``K = S (x) I - I (x) S`` and ``phi(z) = (e^z - 1)/z``, so
    ``log det = p tr S + log det phi(K)``; ``phi(K)`` is the corner block of the
    exponential of ``[[K, I], [0, 0]]``. The symmetric (vech) subspace keeps one copy of
    each off-diagonal pair: ``log|J_vech| = (log det J_vec + tr S) / 2``.
    """
    s = _symmetric_from_tril_vec(y)
    p = s.shape[-1]
    eye, q = jnp.eye(p, dtype=s.dtype), p * p
    k = jnp.kron(s, eye) - jnp.kron(eye, s)
    augmented = jnp.zeros((2 * q, 2 * q), s.dtype).at[:q, :q].set(k).at[:q, q:].set(jnp.eye(q, dtype=s.dtype))
    phi = _expm_symmetric(augmented, squarings=6, order=8)[:q, q:]
    return 0.5 * ((p + 1) * jnp.trace(s) + jnp.linalg.slogdet(phi)[1])


def _sqrtm_log_abs_det(y):
    """``log|det d vech(R R) / d vech(R)|``: on ``vec(R)`` the derivative is the Kronecker
    sum ``R (x) I + I (x) R`` (eigenvalues ``r_i + r_j``); the vech subspace keeps
    ``sum_{i<=j} log|r_i + r_j| = (log|det J_vec| + p log 2 + log|det R|) / 2``."""
    r = _symmetric_from_tril_vec(y)
    p = r.shape[-1]
    eye = jnp.eye(p, dtype=r.dtype)
    log_det_vec = jnp.linalg.slogdet(jnp.kron(r, eye) + jnp.kron(eye, r))[1]
    return 0.5 * (log_det_vec + p * jnp.log(2.0) + jnp.linalg.slogdet(r)[1])


def _vech_forward_shape(self, shape):
    p = round(((8 * shape[-1] + 1) ** 0.5 - 1) / 2)
    return shape[:-1] + (p, p)


def _vech_inverse_shape(self, shape):
    p = shape[-1]
    return shape[:-2] + (p * (p + 1) // 2,)


class SymmetricMatrixExpTransform(ParameterFreeTransform):
    r"""``R^(p(p+1)/2) -> positive definite``: ``X = expm(S)``, ``S`` symmetric from its lower triangle.

    The matrix-log basis of Laplace Matching for Wishart-type sites (LM paper Appendix
    B.7-B.8). Both sides are measured in lower-triangle (vech) coordinates, the measure
    of numpyro's positive-definite densities. In closed form (Daleckii-Krein) the
    log-Jacobian is
    :math:`\sum_i \lambda_i + \sum_{i<j} \log\frac{e^{\lambda_i} - e^{\lambda_j}}{\lambda_i - \lambda_j}`
    over the eigenvalues of ``S``; it is computed from the same quantity written with a
    Kronecker sum (:func:`_logm_log_abs_det`), which stays differentiable where
    eigenvalues coincide (at ``X = I``), unlike an eigen-decomposition.
    """

    domain = constraints.real_vector
    codomain = constraints.positive_definite

    def __call__(self, y):
        return _expm_symmetric(_symmetric_from_tril_vec(y))

    def _inverse(self, x):
        eigval, eigvec = jnp.linalg.eigh(x)
        log_x = (eigvec * jnp.log(eigval)[..., None, :]) @ jnp.swapaxes(eigvec, -1, -2)
        return matrix_to_tril_vec(log_x)

    def log_abs_det_jacobian(self, y, x, intermediates=None):
        return _batch_over_leading(_logm_log_abs_det, y)

    forward_shape = _vech_forward_shape
    inverse_shape = _vech_inverse_shape


class SymmetricMatrixSquareTransform(ParameterFreeTransform):
    r"""``R^(p(p+1)/2) -> positive definite``: ``X = R R``, ``R`` symmetric from its lower triangle.

    The matrix-sqrt basis of Laplace Matching (LM paper Appendix B.7-B.8). Like the
    scalar sqrt basis it is two-to-one (``R`` and ``-R``); the inverse returns the positive
    definite root. :math:`\log|\det J| = \sum_{i \le j} \log|r_i + r_j|` over the
    eigenvalues of ``R``, computed without eigen-decomposition (:func:`_sqrtm_log_abs_det`).
    """

    domain = constraints.real_vector
    codomain = constraints.positive_definite

    def __call__(self, y):
        r = _symmetric_from_tril_vec(y)
        return r @ r

    def _inverse(self, x):
        eigval, eigvec = jnp.linalg.eigh(x)
        root = (eigvec * jnp.sqrt(eigval)[..., None, :]) @ jnp.swapaxes(eigvec, -1, -2)
        return matrix_to_tril_vec(root)

    def log_abs_det_jacobian(self, y, x, intermediates=None):
        return _batch_over_leading(_sqrtm_log_abs_det, y)

    forward_shape = _vech_forward_shape
    inverse_shape = _vech_inverse_shape


class SquareTransform(ParameterFreeTransform):
    r"""``x = y**2``: the square-root basis of Laplace Matching for positive sites.

    Not a bijection of the real line (``y`` and ``-y`` give the same ``x``); the inverse
    returns the positive root. The Laplace approximation is valid when the mode of ``y``
    lies many standard deviations from zero, which is the regime the sqrt-basis formulas
    of the seeds (thesis Table 3.2) assume. :math:`\log|dx/dy| = \log 2|y|`.
    """

    domain = constraints.real
    codomain = constraints.positive

    def __call__(self, y):
        return jnp.square(y)

    def _inverse(self, x):
        return jnp.sqrt(x)

    def log_abs_det_jacobian(self, y, x, intermediates=None):
        return jnp.log(2.0 * jnp.abs(y))


# ------------------------------------------------------------------------------ registry


class Basis(NamedTuple):
    """A named Laplace Matching basis.

    :param name: what users pass in ``bases={site: name}``.
    :param transform: ``constraint -> numpyro Transform`` from basis coordinates to the
        support; called on every model run so that dependent supports stay right.
    :param family: the default matched family (see :mod:`numpyro_lm.families`).
    :param one_to_one: ``False`` for a two-to-one basis (``sqrt``: ``y`` and ``-y`` give the
        same value), whose coordinates multi-start searches leave at the initial point.
    :param from_distribution: ``distribution -> Transform`` for a basis built from the site's
        prior itself rather than its support (``whiten``), else ``None``.
    """

    name: str
    transform: Callable[[constraints.Constraint], object]
    family: str
    one_to_one: bool = True
    from_distribution: Optional[Callable] = None

    def transform_for(self, distribution):
        """The basis transform of a site with this prior (from its support, or from the prior)."""
        if self.from_distribution is not None:
            return self.from_distribution(distribution)
        return self.transform(distribution.support)


_BASES: dict[str, Basis] = {}
_DEFAULT_BASIS: dict[type, str] = {}


def register_basis(
    name: str,
    transform: Callable[[constraints.Constraint], object],
    family: str = "gaussian",
    constraint_types: tuple = (),
    one_to_one: bool = True,
    from_distribution: Optional[Callable] = None,
) -> Basis:
    """Register a basis under ``name``; make it the default for ``constraint_types``.

    Example: ``register_basis("softplus", lambda c: SoftplusTransform(), "gaussian")``
    lets a user write ``LaplaceMatching(model, bases={"sigma": "softplus"})``.
    """
    basis = Basis(name, transform, family, one_to_one, from_distribution)
    _BASES[name] = basis
    for ctype in constraint_types:
        _DEFAULT_BASIS[ctype if isinstance(ctype, type) else type(ctype)] = name
    return basis


def basis_names() -> list[str]:
    return sorted(_BASES)


def get_basis(name: str) -> Basis:
    try:
        return _BASES[name]
    except KeyError:
        raise ValueError(
            f"unknown basis {name!r}; registered bases are {basis_names()}. "
            "Register a new one with numpyro_lm.register_basis."
        ) from None


def _base_constraint(constraint):
    """Strip ``independent(...)`` wrappers: ``(base constraint, reinterpreted ndims)``."""
    ndims = 0
    while isinstance(constraint, constraints._IndependentConstraint):
        ndims += constraint.reinterpreted_batch_ndims
        constraint = constraint.base_constraint
    return constraint, ndims


def basis_for_constraint(constraint) -> Basis:
    """The default basis of a support constraint (``biject_to`` where LM has none)."""
    base, _ = _base_constraint(constraint)
    if type(constraint) in _DEFAULT_BASIS:  # real_vector etc. are themselves independent
        return _BASES[_DEFAULT_BASIS[type(constraint)]]
    return _BASES[_DEFAULT_BASIS.get(type(base), "biject_to")]


def with_independent(make_transform):
    """Lift an elementwise transform factory to ``independent(constraint, n)`` supports."""

    def factory(constraint):
        base, ndims = _base_constraint(constraint)
        t = make_transform(base)
        return IndependentTransform(t, ndims) if ndims else t

    return factory


def _log(base):
    lower = getattr(base, "lower_bound", 0.0)
    if isinstance(base, constraints._Positive):
        return ExpTransform()
    return ComposeTransform([ExpTransform(), AffineTransform(lower, 1.0, domain=constraints.positive)])


def _logit(base):
    if isinstance(base, constraints._UnitInterval):
        return SigmoidTransform()
    lower, upper = base.lower_bound, base.upper_bound
    return ComposeTransform(
        [SigmoidTransform(), AffineTransform(lower, upper - lower, domain=constraints.unit_interval)]
    )


def _sqrt(base):
    if not isinstance(base, constraints._Positive):
        raise ValueError("the sqrt basis is defined for positive supports only")
    return SquareTransform()


register_basis(
    "identity",
    lambda c: biject_to(c),
    "normal",
    (constraints.real, constraints.real_vector, constraints.real_matrix),
)
register_basis(
    "log",
    with_independent(_log),
    "gamma",
    (constraints.positive, constraints.greater_than, constraints.greater_than_eq,
     constraints.softplus_positive, constraints.nonnegative),
)
register_basis(
    "logit",
    with_independent(_logit),
    "beta",
    (constraints.unit_interval, constraints.interval, constraints.open_interval),
)
register_basis("sqrt", with_independent(_sqrt), "gamma", one_to_one=False)
register_basis("softmax", lambda c: ZeroSumSoftmaxTransform(), "dirichlet", (constraints.simplex,))
register_basis(
    "logm", lambda c: SymmetricMatrixExpTransform(), "gaussian", (constraints.positive_definite,)
)
register_basis("sqrtm", lambda c: SymmetricMatrixSquareTransform(), "gaussian", one_to_one=False)
register_basis("biject_to", lambda c: biject_to(c), "gaussian")


def _whitening(distribution):
    r"""``f = loc + L z``: a ``MultivariateNormal`` site in whitened coordinates ``z``.

    The prior of ``z`` is :math:`N(0, I)` whatever the covariance (with the log-Jacobian
    :math:`\log|\det L|` it cancels the prior's normaliser), so the curvature of a latent GP
    is :math:`I + L^\top W L` instead of :math:`K^{-1} + W`: well conditioned in float32
    where ``K`` (an RBF kernel with a small jitter) has a condition number of 10^6 or more
    (Murray and Adams 2010, "Slice sampling covariance hyperparameters of latent Gaussian
    models", on whitening; ``L`` is rebuilt from the prior in every run, so a kernel with
    latent hyperparameters is followed)."""
    if not isinstance(distribution, MultivariateNormal):
        raise ValueError(f"the whiten basis is for MultivariateNormal priors, not {type(distribution).__name__}")
    return LowerCholeskyAffine(distribution.loc, distribution.scale_tril)


def _no_support_transform(constraint):
    raise ValueError("the whiten basis is built from the site's MultivariateNormal prior, not from its support")


register_basis("whiten", _no_support_transform, "gaussian", from_distribution=_whitening)


def basis_for_prior(distribution) -> Basis:
    """The default basis of a site with this prior: ``whiten`` for a ``MultivariateNormal``,
    else that of its support (:func:`basis_for_constraint`)."""
    if type(distribution) is MultivariateNormal:
        return _BASES["whiten"]
    return basis_for_constraint(distribution.support)
