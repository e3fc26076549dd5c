r"""Wishart(n, V) and InverseWishart(nu, Psi) in the matrix-log and matrix-sqrt bases.

Coordinates: the lower triangle (``vech``) of the symmetric matrix ``S`` with
``X = expm(S)`` (``logm`` basis) or ``R`` with ``X = R R`` (``sqrtm`` basis); the
Gaussian is over those ``p(p+1)/2`` numbers, the measure of numpyro's matrix densities.

**Gaussian from the family** (``to_gaussian``) is the *exact* Laplace approximation in
the basis, computed numerically: Newton's method on
``log p(X(y)) + log|det dX/dy|`` (the Jacobian by autodiff, exact) from the closed-form
mode below, and the inverse negative Hessian there. It runs under ``jit`` and ``vmap``.

**Family from a Gaussian** (``from_gaussian``) is closed form. It treats the Jacobian
as that of a scalar map applied to the eigenvalues (``|J| ~ det(X)^((p+1)/2)`` for
``logm``, ``det(R)^((p+1)/2)`` for ``sqrtm``), which is exact when ``X`` is a multiple
of the identity and for ``p = 1`` (where every map reduces to the Gamma / inverse Gamma
maps). With ``tau = sum_i Var(y_ii) + 2 sum_{i<j} Var(y_ij)``:

==================  =========================================  ==========================================
family, basis       mode of the approximation                   Gaussian -> family
==================  =========================================  ==========================================
Wishart, logm       ``S = logm(n V)``                           ``n = p(p+1)/tau``, ``V = expm(mu)/n``
Wishart, sqrtm      ``R = sqrtm(m V)``, ``m = n - (p+1)/2``     ``m = tr(R^2)(p+1)/(4 tau)``, ``V = R^2/m``
InvWishart, logm    ``S = logm(Psi / nu)``                      ``nu = p(p+1)/tau``, ``Psi = nu expm(mu)``
InvWishart, sqrtm   ``R = sqrtm(Psi / m)``, ``m = nu + (p+1)/2``  ``m = tr(R^2)(p+1)/(4 tau)``, ``Psi = m R^2``
==================  =========================================  ==========================================

Differences to the seeds (LM paper Table 2, Appendix B.7-B.8): they use the Jacobian
``det X`` in the logm basis, which gives the mode ``logm((n-p+1)V)`` and the precision
``(n-p+1)/2`` (our exact map has ``n`` for ``V`` a multiple of the identity); the
inverse Wishart row of their Table 2 prints ``log(1/((nu+p-1) Psi))`` and
``nu = tr(Sigma)/(2 pi^2) - p + 1`` (typos of ``logm(Psi/(nu+p-1))`` and
``nu = 2p^2/tr(Sigma) - p + 1``). :func:`wishart_logm_seeds` and
:func:`inverse_wishart_logm_seeds` keep their (corrected) closed forms;
``tests/families/test_wishart.py`` measures how far each closed form is from the exact map.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions.util import matrix_to_tril_vec, vec_to_tril_matrix

from ..curvature import covariance
from ..mode.laplace_state import laplace
from ..runtime.precision import precise_jit
from ..runtime.random import log_gamma, normal_rows
from .bases import SymmetricMatrixExpTransform, SymmetricMatrixSquareTransform
from .registry import MatchedFamily, register_family, register_prior_family

__all__ = [
    "wishart_logm",
    "wishart_sqrtm",
    "inverse_wishart_logm",
    "inverse_wishart_sqrtm",
    "wishart_logm_seeds",
    "inverse_wishart_logm_seeds",
    "vech_trace",
]


def _sym(v):
    lower = vec_to_tril_matrix(v)
    return lower + jnp.swapaxes(lower, -1, -2) - lower * jnp.eye(lower.shape[-1])


def _eig_apply(x, fn):
    w, q = jnp.linalg.eigh(x)
    return (q * fn(w)[..., None, :]) @ jnp.swapaxes(q, -1, -2)


def _p_of(d):
    return round(((8 * d + 1) ** 0.5 - 1) / 2)


def vech_trace(cov):
    """``tau = sum_i Var(y_ii) + 2 sum_{i<j} Var(y_ij)``: the trace of the covariance of the
    full symmetric matrix ``vec(Y)``, from the covariance of its lower triangle."""
    d = cov.shape[-1]
    p = _p_of(d)
    rows, cols = np.tril_indices(p)
    weight = jnp.where(rows == cols, 1.0, 2.0)
    return jnp.sum(weight * jnp.diagonal(cov, axis1=-2, axis2=-1), axis=-1)


def _exact_laplace(log_prob, transform, y0):
    """The Laplace fit of ``log_prob(T(y)) + log|J|`` from ``y0``: ``(mode, covariance)``."""

    def log_density(y):
        x = transform(y)
        return log_prob(x) + transform.log_abs_det_jacobian(y, x)

    state = laplace(log_density, y0, max_iter=100)
    return state.mode, covariance(state.curvature)


def _batched(fn):
    """Apply ``fn`` to params with arbitrary batch dims (vmap over the flattened batch)."""

    def wrapped(params):
        n, m = params["concentration"], params["scale_matrix"]
        batch = jnp.broadcast_shapes(jnp.shape(n), m.shape[:-2])
        n = jnp.broadcast_to(n, batch).reshape(-1)
        m = jnp.broadcast_to(m, batch + m.shape[-2:]).reshape((-1,) + m.shape[-2:])
        mean, cov = jax.vmap(fn)(n, m)
        return mean.reshape(batch + mean.shape[1:]), cov.reshape(batch + cov.shape[1:])

    return wrapped


# ------------------------------------------------------------------------ the four maps


def _wishart_logm_exact(n, v):
    y0 = matrix_to_tril_vec(_eig_apply(n * v, jnp.log))
    log_prob = lambda x: dist.Wishart(n, scale_matrix=v).log_prob(x)  # noqa: E731
    return _exact_laplace(log_prob, SymmetricMatrixExpTransform(), y0)


def _wishart_sqrtm_exact(n, v):
    p = v.shape[-1]
    y0 = matrix_to_tril_vec(_eig_apply((n - 0.5 * (p + 1)) * v, jnp.sqrt))
    log_prob = lambda x: dist.Wishart(n, scale_matrix=v).log_prob(x)  # noqa: E731
    return _exact_laplace(log_prob, SymmetricMatrixSquareTransform(), y0)


def _inverse_wishart_logm_exact(nu, psi):
    y0 = matrix_to_tril_vec(_eig_apply(psi / nu, jnp.log))
    log_prob = lambda x: dist.InverseWishart(nu, scale_matrix=psi).log_prob(x)  # noqa: E731
    return _exact_laplace(log_prob, SymmetricMatrixExpTransform(), y0)


def _inverse_wishart_sqrtm_exact(nu, psi):
    p = psi.shape[-1]
    y0 = matrix_to_tril_vec(_eig_apply(psi / (nu + 0.5 * (p + 1)), jnp.sqrt))
    log_prob = lambda x: dist.InverseWishart(nu, scale_matrix=psi).log_prob(x)  # noqa: E731
    return _exact_laplace(log_prob, SymmetricMatrixSquareTransform(), y0)


class _MatrixDensity(NamedTuple):
    """A Wishart-type log density in basis coordinates ``y``:

    ``log p(y) = a logdet X(y) - tr(A g(y)) / 2 + log|J(y)| + const``

    with ``a`` affine in the degrees of freedom and ``A`` built from the scale matrix.
    """

    transform: object
    logdet: Callable  # y -> log det X(y)
    g: Callable  # y -> the matrix that multiplies A in the trace
    count_from_a: Callable  # (a, p) -> degrees of freedom
    scale_from_a_matrix: Callable  # A -> scale matrix


def _exact_inverse(density: _MatrixDensity):
    """The inverse of the exact Laplace map, in closed form up to autodiff and a solve.

    At the mode ``mu`` the gradient vanishes: ``a grad logdet + grad log|J| = grad tr(A g)/2``,
    which is linear in ``A``, so ``A = a A1 + A0``. The precision is then affine in ``a``:
    ``P = a M1 + M0``. Given a Gaussian ``(mu, Sigma)``, ``a`` is the least-squares fit of
    ``P`` to ``Sigma^-1`` (exact when the Gaussian is the Laplace approximation of a member
    of the family) and ``A`` follows. For ``p = 1`` this is the Gamma / inverse Gamma map.
    """

    def one(mean, cov):
        p = _p_of(mean.shape[-1])

        def trace_term(a_vech, y):
            return 0.5 * jnp.trace(_sym(a_vech) @ density.g(y))

        def log_jac(y):
            return density.transform.log_abs_det_jacobian(y, density.transform(y))

        def hess_trace(a_vech):
            return jax.hessian(lambda y: trace_term(a_vech, y))(mean)

        # grad_y tr(A g)/2 at mu is linear in vech(A): its matrix is k
        k = jax.jacfwd(lambda a: jax.grad(trace_term, argnums=1)(a, mean))(jnp.zeros_like(mean))
        a1 = jnp.linalg.solve(k, jax.grad(density.logdet)(mean))
        a0 = jnp.linalg.solve(k, jax.grad(log_jac)(mean))
        m1 = hess_trace(a1) - jax.hessian(density.logdet)(mean)
        m0 = hess_trace(a0) - jax.hessian(log_jac)(mean)
        a = jnp.sum((jnp.linalg.inv(cov) - m0) * m1) / jnp.sum(m1 * m1)
        return density.count_from_a(a, p), density.scale_from_a_matrix(_sym(a * a1 + a0))

    def from_gaussian(mean, cov):
        batch = mean.shape[:-1]
        flat_mean = mean.reshape((-1,) + mean.shape[-1:])
        count, scale = jax.vmap(one)(flat_mean, cov.reshape((-1,) + cov.shape[-2:]))
        return {"concentration": count.reshape(batch), "scale_matrix": scale.reshape(batch + scale.shape[-2:])}

    return from_gaussian


def _logdet_logm(y):
    return jnp.trace(_sym(y))


def _logdet_sqrtm(y):
    return 2.0 * jnp.linalg.slogdet(_sym(y))[1]


def _wishart_count(a, p):  # a = (n - p - 1) / 2
    return 2.0 * a + p + 1


def _inverse_wishart_count(a, p):  # a = -(nu + p + 1) / 2
    return -2.0 * a - p - 1


_EXP, _SQUARE = SymmetricMatrixExpTransform(), SymmetricMatrixSquareTransform()
WISHART_LOGM = _MatrixDensity(_EXP, _logdet_logm, _EXP, _wishart_count, jnp.linalg.inv)
WISHART_SQRTM = _MatrixDensity(_SQUARE, _logdet_sqrtm, _SQUARE, _wishart_count, jnp.linalg.inv)
INVERSE_WISHART_LOGM = _MatrixDensity(_EXP, _logdet_logm, lambda y: _EXP(-y), _inverse_wishart_count, lambda a: a)
INVERSE_WISHART_SQRTM = _MatrixDensity(
    _SQUARE, _logdet_sqrtm, lambda y: jnp.linalg.inv(_SQUARE(y)), _inverse_wishart_count, lambda a: a
)


def _seeds_cov(count, p, dtype):
    rows, cols = np.tril_indices(p)
    var = jnp.where(rows == cols, 2.0, 1.0).astype(dtype)
    return var * jnp.eye(len(rows), dtype=dtype) / jnp.asarray(count)[..., None, None]


def wishart_logm_seeds(params):
    """The seeds' closed form: ``mu = logm((n-p+1) V)``, ``vec`` covariance ``2/(n-p+1) I``.

    In ``vech`` coordinates the ``vec`` covariance ``c I`` is ``c`` on the diagonal
    entries and ``c/2`` on the off-diagonal ones (each appears twice in ``vec``).
    """
    n, v = params["concentration"], params["scale_matrix"]
    p = v.shape[-1]
    k = n - p + 1
    return matrix_to_tril_vec(_eig_apply(k[..., None, None] * v, jnp.log)), _seeds_cov(k, p, v.dtype)


def inverse_wishart_logm_seeds(params):
    """The seeds' closed form (typos fixed): ``mu = logm(Psi/(nu+p-1))``, ``2/(nu+p-1) I``."""
    nu, psi = params["concentration"], params["scale_matrix"]
    p = psi.shape[-1]
    k = nu + p - 1
    return matrix_to_tril_vec(_eig_apply(psi / k[..., None, None], jnp.log)), _seeds_cov(k, p, psi.dtype)


# ----------------------------------------------------------------------------- draws


def _wishart_draws(rng_key, concentration, scale_matrix, num_samples: int):
    r"""``(num_samples,) + batch + (p, p)`` Wishart draws by Bartlett's decomposition:
    :math:`X = L A A^\top L^\top`, ``L L' = scale``, ``A`` lower triangular with
    :math:`A_{ii}^2 \sim \chi^2_{n - i}` and standard normal entries below the diagonal."""
    p = scale_matrix.shape[-1]
    batch = jnp.broadcast_shapes(jnp.shape(concentration), scale_matrix.shape[:-2])
    half_df = 0.5 * (jnp.asarray(concentration)[..., None] - jnp.arange(p))
    log_g = log_gamma(jax.random.fold_in(rng_key, 0), jnp.broadcast_to(half_df, batch + (p,)), num_samples)
    diagonal = jnp.exp(0.5 * (log_g + jnp.log(2.0)))  # sqrt of chi2 = 2 Gamma(df / 2)
    below = normal_rows(jax.random.fold_in(rng_key, 1), num_samples, batch + (p, p), diagonal.dtype)
    a = jnp.tril(below, -1) + diagonal[..., None] * jnp.eye(p, dtype=diagonal.dtype)
    la = jnp.linalg.cholesky(scale_matrix) @ a
    return la @ jnp.swapaxes(la, -1, -2)


def _sampler(kind):
    """Exact draws of the family (numpyro's parameters) from a JAX key."""

    def sample(rng_key, params, num_samples):
        n, m = params["concentration"], params["scale_matrix"]
        if kind == "wishart":
            return _wishart_draws(rng_key, n, m, num_samples)
        # X ~ InverseWishart(nu, Psi)  <=>  X^-1 ~ Wishart(nu, Psi^-1)
        return jnp.linalg.inv(_wishart_draws(rng_key, n, jnp.linalg.inv(m), num_samples))

    return sample


def _family(name, basis, transform, exact, from_gaussian, distribution, kind):
    sample_matrix = _sampler(kind)

    def sample_basis(rng_key, params, num_samples):
        return transform.inv(sample_matrix(rng_key, params, num_samples))

    return register_family(
        MatchedFamily(
            name=name,
            basis=basis,
            event_dim=1,
            # jitted: the Newton loop and the autodiff Hessians compile once per shape
            # (no compiler_options: JAX allows them on top-level jits only)
            from_gaussian=precise_jit(from_gaussian),
            to_gaussian=precise_jit(_batched(exact)),
            distribution=distribution,
            copula="independent",
            sample_basis=sample_basis,
        )
    )


def _wishart(params):
    return dist.Wishart(params["concentration"], scale_matrix=params["scale_matrix"])


def _inverse_wishart(params):
    return dist.InverseWishart(params["concentration"], scale_matrix=params["scale_matrix"])


wishart_logm = _family("wishart", "logm", _EXP, _wishart_logm_exact,
                       _exact_inverse(WISHART_LOGM), _wishart, "wishart")
wishart_sqrtm = _family("wishart", "sqrtm", _SQUARE, _wishart_sqrtm_exact,
                        _exact_inverse(WISHART_SQRTM), _wishart, "wishart")
inverse_wishart_logm = _family("inverse_wishart", "logm", _EXP, _inverse_wishart_logm_exact,
                               _exact_inverse(INVERSE_WISHART_LOGM), _inverse_wishart, "inverse_wishart")
inverse_wishart_sqrtm = _family("inverse_wishart", "sqrtm", _SQUARE, _inverse_wishart_sqrtm_exact,
                                _exact_inverse(INVERSE_WISHART_SQRTM), _inverse_wishart, "inverse_wishart")

register_prior_family("Wishart", "wishart")
register_prior_family("InverseWishart", "inverse_wishart")
