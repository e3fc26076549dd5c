r"""MTCOV (Contisciani, Power and De Bacco 2020, "Community detection with node attributes in
multilayer networks", Sci. Rep. 10, 15736): the EM baseline PIHAM is compared with (thesis C.3).

A directed multilayer network ``A^l_ij in {0, 1, 2, ...}`` (``l < L``, ``i != j``) and one
categorical attribute ``x_i in {0..Z-1}`` are modelled as

.. math:: A^l_{ij} \sim \mathrm{Pois}(\lambda^l_{ij}), \quad
          \lambda^l_{ij} = \textstyle\sum_{kq} u_{ik} w^l_{kq} v_{jq}, \qquad
          P(x_i = z) = \pi_{iz} = \textstyle\sum_k \tfrac12 (u_{ik} + v_{ik}) \beta_{kz},

with ``u, v, w, beta >= 0`` and ``sum_k u_ik = sum_k v_ik = sum_z beta_kz = 1``. MTCOV maximises
``F = (1 - gamma) log P(A) + gamma log P(X)`` over the training entries (edge mask ``M^l_ij``,
always 0 on self-loops; attribute mask ``m_i``) by EM. Responsibilities at the current values:

- ``rho^l_ijkq = u_ik w^l_kq v_jq / lambda^l_ij``;
- ``h^u_ik = u_ik beta_{k x_i} / (2 pi_{i x_i})`` and ``h^v_ik = v_ik beta_{k x_i} / (2 pi_{i x_i})``
  (``pi_{i x_i}`` is a mixture of the ``2K`` terms ``u_ik beta_kx / 2`` and ``v_ik beta_kx / 2``).

Updates, one block at a time (``w``, ``beta``, ``u``, ``v``; responsibilities refreshed in between):

- ``w^l_kq <- sum_ij M^l_ij A^l_ij rho^l_ijkq / sum_ij M^l_ij u_ik v_jq``;
- ``beta_kz <- sum_i m_i [x_i = z] (h^u_ik + h^v_ik)``, rows renormalised;
- ``u_ik <- a_ik / (mu_i + b_ik)`` with ``a_ik = (1 - gamma) sum_jlq M A rho + gamma m_i h^u_ik``,
  ``b_ik = (1 - gamma) sum_jlq M^l_ij w^l_kq v_jq`` and the Lagrange multiplier ``mu_i`` of
  ``sum_k u_ik = 1`` (``v`` likewise with ``h^v`` and the transposed layers).

``w`` and ``beta`` are the updates of the authors' code (github.com/mcontisc/MTCOV, ``MTCOV.py``,
``_update_W`` and ``_update_beta``), here restricted to the training entries. For ``u`` that
code takes ``u_ik ∝ (1-gamma) sum A rho + gamma (u_ik + v_ik) beta_kx / (2 pi_ix)``: it drops
``b_ik`` (exact only if ``b_ik`` does not depend on ``k``) and uses ``u + v`` in the attribute
term, so it does not maximise the EM lower bound (dropping ``b_ik`` alone lowered ``F`` within
300 steps on 25 of 30 small random instances). Here each block is the exact maximiser
(``mu_i`` by Newton's method), so ``F`` never decreases (a test checks it).

Stopping: the original evaluates ``F`` every 10 steps and stops once ``|Delta F| < 0.001`` on more
than ``decision = 10`` successive checks, or after ``maxit = 500`` steps; here the relative change
is checked every step (``tol``, ``decision``). The best of ``num_restarts`` random starts is kept
(the thesis runs 50 with 500 steps and ``gamma = 0.5``). Initialisation as in the original:
uniform rows normalised, ``w`` diagonal ``U(0, 1)`` and symmetric off-diagonal ``0.1 U(0, 1)``.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple, Optional

import numpy as np
from scipy.special import gammaln

__all__ = ["MTCOVFit", "fit_mtcov", "expected_edges", "attribute_probabilities"]

_TINY = np.finfo(float).tiny


class MTCOVFit(NamedTuple):
    u: np.ndarray  # (N, K) out-going memberships, rows sum to 1
    v: np.ndarray  # (N, K) in-coming memberships, rows sum to 1
    w: np.ndarray  # (L, K, K) affinities (zeros when gamma = 1: the network is not used)
    beta: np.ndarray  # (K, Z), rows sum to 1 (uniform when gamma = 0: attributes not used)
    objective: float  # (1 - gamma) log P(A) + gamma log P(X) on the training entries
    num_iterations: int


class _Data(NamedTuple):
    layer: np.ndarray  # the nonzero training entries A^l_ij = count: (layer, row, col, count)
    row: np.ndarray
    col: np.ndarray
    count: np.ndarray
    log_fact: float  # sum of log A! over them, so that F is a proper log-likelihood
    mask: np.ndarray  # (L, N, N) float training mask M^l_ij, zero on self-loops
    x: np.ndarray  # (N,) categories
    m: np.ndarray  # (N,) float attribute mask
    num_categories: int
    gamma: float


def _check_int(name, val, low):
    if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {val!r}")


def _prepare(edges, attributes, K, Z, gamma, mask_edges, mask_attributes) -> _Data:
    _check_int("num_communities", K, 1)
    if not isinstance(gamma, (int, float, np.number)) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma!r}")
    edges = np.asarray(edges)
    edges = edges.astype(int) if edges.dtype == bool else edges
    if edges.ndim != 3 or edges.shape[1] != edges.shape[2] or edges.shape[1] < 2:
        raise ValueError(f"edges must have shape (L, N, N) with N >= 2, got {edges.shape}")
    if (not np.issubdtype(edges.dtype, np.number) or not np.all(np.isfinite(edges))
            or np.any(edges < 0) or np.any(edges != np.round(edges))):
        raise ValueError("edges must be finite nonnegative integers (Poisson counts)")
    L, N, _ = edges.shape
    x = np.asarray(attributes)
    if x.shape != (N,) or not np.issubdtype(x.dtype, np.number) or np.any(x != np.round(x)):
        raise ValueError(f"attributes must be {N} integer categories, got shape {x.shape}")
    x = x.astype(int)
    Z = max(int(x.max()) + 1, 1) if Z is None else Z
    _check_int("num_categories", Z, 1)
    if np.any(x < 0) or np.any(x >= Z):
        raise ValueError(f"attributes must lie in 0..{Z - 1}")
    me = np.ones((L, N, N), bool) if mask_edges is None else np.asarray(mask_edges)
    if me.shape != (L, N, N) or me.dtype != bool:
        raise ValueError(f"mask_edges must be a boolean array of shape {(L, N, N)}")
    ma = np.ones(N, bool) if mask_attributes is None else np.asarray(mask_attributes)
    if ma.shape != (N,) or ma.dtype != bool:
        raise ValueError(f"mask_attributes must be a boolean array of shape {(N,)}")
    me = me & ~np.eye(N, dtype=bool)  # self-loops are not modelled
    lay, row, col = np.nonzero(me & (edges > 0))
    count = edges[lay, row, col].astype(float)
    return _Data(lay, row, col, count, float(gammaln(count + 1).sum()), me.astype(float), x,
                 ma.astype(float), int(Z), float(gamma))


def _simplex_argmax(a, b, old):
    """Row-wise argmax of ``sum_k a_k log u_k - b_k u_k`` over the simplex (``a, b >= 0``).

    KKT: ``u_k = a_k / (mu + b_k)`` with ``mu >= -min_k b_k``; any mass left at that bound goes
    to the cheapest ``k``. ``psi(mu) = 1 / sum_k a_k / (mu + b_k)`` is increasing and concave
    (a parallel sum of affine functions) and ``psi <= 1`` at ``mu_0 = max_k (a_k - b_k)``, so
    Newton on ``psi = 1`` climbs to the root without overshooting, in one step when one term
    dominates (Newton on ``f = 1/psi`` crawls away from a pole with a tiny ``a_k``).
    Rows with ``a = 0`` carry no evidence and are left as they were; an ``a_k`` below
    ``1e-100`` of the row's largest is set to 0 (a negligible change of the bound) so that
    ``a_k / x^2`` stays finite.
    """
    a = np.where(a > 1e-100 * a.max(axis=1, keepdims=True), a, 0.0)
    pos = a > 0
    safe_a = np.where(pos, a, 1.0)
    top = np.where(pos, a - b, -np.inf).argmax(axis=1)
    # x = mu + b_top, so that x is exact near that pole even when a_top << b_top
    shift = b - b[np.arange(len(b)), top][:, None]
    x = np.maximum(a[np.arange(len(a)), top], -shift.min(axis=1))
    for _ in range(100):  # x + shift_k >= a_k holds exactly; the max() guards against round-off
        t = a / np.maximum(x[:, None] + shift, safe_a)
        f = t.sum(axis=1)
        if np.all(f - 1.0 <= 1e-12):  # f < 1 only where mu stays at its lower bound
            break
        x = x + np.maximum(f * (f - 1.0), 0.0) / np.maximum((t * t / safe_a).sum(axis=1), _TINY)
    t[np.arange(len(t)), b.argmin(axis=1)] += np.maximum(1.0 - t.sum(axis=1), 0.0)
    return np.where(pos.any(axis=1, keepdims=True), t / t.sum(axis=1, keepdims=True), old)


def _scatter(index, values, n):
    """``out[index[e], k] += values[e, k]`` in one bincount."""
    K = values.shape[1]
    flat = (index[:, None] * K + np.arange(K)).ravel()
    return np.bincount(flat, weights=values.ravel(), minlength=n * K).reshape(n, K)


def _em(d: _Data, u, v, w, beta, max_iter=500, tol=1e-6, decision=15):
    """EM from the given start; returns ``(u, v, w, beta, trace)`` with ``F`` after each sweep."""
    g, (N, K) = d.gamma, u.shape
    use_net, use_attr = g < 1.0, g > 0.0
    trace, calm, net = [], 0, None
    for _ in range(max_iter):
        if use_net:  # w: A / lambda on the nonzero training entries, sum of lambda through the mask
            ue, ve = u[d.row], v[d.col]
            r = d.count / np.maximum(np.einsum("ek,ekq,eq->e", ue, w[d.layer], ve), _TINY)
            num = _scatter(d.layer, np.einsum("e,ek,eq->ekq", r, ue, ve).reshape(len(r), -1), len(w))
            mv = d.mask @ v  # (L, N, K); sum_ij M u_ik w_kq v_jq = sum u_ik w_kq mv_iq
            den = np.einsum("ik,liq->lkq", u, mv)
            w = np.where(den > 0, w * num.reshape(w.shape) / np.maximum(den, _TINY), w)
        if use_attr:  # beta: the u- and v-halves of h together
            share = (u + v) * beta[:, d.x].T
            h = share * (d.m / np.maximum(share.sum(1), _TINY))[:, None]
            num = _scatter(d.x, h, beta.shape[1]).T
            total = num.sum(1, keepdims=True)
            beta = np.where(total > 0, num / np.maximum(total, _TINY), beta)
        for side in (0, 1):  # u (out-going, rows i), then v (in-coming, rows j)
            own, other = (u, v) if side == 0 else (v, u)
            # proj[l, j, k] = sum_q w^l_kq v_jq (u side); proj[l, i, q] = sum_k u_ik w^l_kq (v side)
            proj = np.einsum("jq,lkq->ljk" if side == 0 else "ik,lkq->liq", other, w)
            mine, theirs = (d.row, d.col) if side == 0 else (d.col, d.row)
            a, b = np.zeros_like(own), np.zeros_like(own)
            if use_net:
                y = proj[d.layer, theirs]
                r = d.count / np.maximum(np.einsum("ek,ek->e", own[mine], y), _TINY)
                a += (1 - g) * own * _scatter(mine, r[:, None] * y, N)
                if side == 0:  # b_ik = sum_jlq M^l_ij w^l_kq v_jq
                    b += (1 - g) * np.einsum("liq,lkq->ik", mv, w)
                else:  # b_jq = sum_ilk M^l_ij u_ik w^l_kq, through (u' M^l)_kj
                    b += (1 - g) * np.einsum("lkj,lkq->jq", u.T @ d.mask, w)
            if use_attr:
                share = own * beta[:, d.x].T
                a += g * share * (d.m / np.maximum(((u + v) * beta[:, d.x].T).sum(1), _TINY))[:, None]
            new = _simplex_argmax(a, b, own)
            u, v = (new, v) if side == 0 else (u, new)
        if use_net:  # the v side's y and b give log P(A) at the new v without another pass over M
            lam = np.einsum("eq,eq->e", v[d.col], y)
            net = d.count @ np.log(np.maximum(lam, _TINY)) - np.sum(v * b) / (1 - g) - d.log_fact
        trace.append(_objective(d, u, v, w, beta, net))
        if len(trace) > 1 and abs(trace[-1] - trace[-2]) <= tol * abs(trace[-2]):
            calm += 1
            if calm >= decision:
                break
        else:
            calm = 0
    return u, v, w, beta, np.array(trace)


def _objective(d: _Data, u, v, w, beta, net=None) -> float:
    """``(1 - gamma) log P(A) + gamma log P(X)`` on the training entries (``net``: log P(A) if
    known). A term with weight 0 is skipped, so ``w = 0`` at ``gamma = 1`` gives no ``0 * -inf``."""
    out = 0.0
    if d.gamma < 1.0:
        if net is None:
            lam = np.einsum("ek,ekq,eq->e", u[d.row], w[d.layer], v[d.col])
            total = np.einsum("ik,liq,lkq->", u, d.mask @ v, w)
            net = d.count @ np.log(np.maximum(lam, _TINY)) - total - d.log_fact
        out += (1 - d.gamma) * net
    if d.gamma > 0.0:
        pi = 0.5 * ((u + v) * beta[:, d.x].T).sum(1)
        out += d.gamma * float(d.m @ np.log(np.maximum(pi, _TINY)))
    return float(out)


def _initial(rng, N, L, K, Z):
    u, v, beta = rng.random((N, K)), rng.random((N, K)), rng.random((K, Z))
    off = 0.1 * rng.random((L, K, K))
    w = np.triu(off, 1) + np.triu(off, 1).transpose(0, 2, 1)
    w[:, np.arange(K), np.arange(K)] = rng.random((L, K))
    norm = lambda p: p / p.sum(axis=1, keepdims=True)
    return norm(u), norm(v), w, norm(beta)


def _one_blas_thread():
    """The (N, N) x (N, K) products are too small for BLAS threads, which then only contend with
    other work (on a busy machine with few cores, many times slower); ``threadpoolctl`` is optional."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1)


def fit_mtcov(edges, attributes, num_communities, *, num_categories: Optional[int] = None,
              gamma: float = 0.5, mask_edges=None, mask_attributes=None, num_restarts: int = 10,
              max_iter: int = 500, tol: float = 1e-6, decision: int = 15, seed: int = 0) -> MTCOVFit:
    """Fit MTCOV by EM from ``num_restarts`` random starts; return the one with the highest ``F``.

    ``edges``: (L, N, N) nonnegative integer counts; ``attributes``: (N,) categories in
    ``0..num_categories-1`` (default: the largest one + 1); masks: True = training entry.
    """
    K = num_communities  # all inputs are checked before any work
    d = _prepare(edges, attributes, K, num_categories, gamma, mask_edges, mask_attributes)
    for name, val in (("num_restarts", num_restarts), ("max_iter", max_iter), ("decision", decision)):
        _check_int(name, val, 1)
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    (L, N, _), Z = d.mask.shape, d.num_categories
    rng = np.random.default_rng(seed)
    best = None
    with _one_blas_thread():
        for _ in range(num_restarts):
            u, v, w, beta, trace = _em(d, *_initial(rng, N, L, K, Z), max_iter, tol, decision)
            if best is None or trace[-1] > best.objective:
                best = MTCOVFit(u, v, w, beta, float(trace[-1]), len(trace))
    if gamma == 0.0:  # the attributes play no part: report a flat beta rather than the random start
        best = best._replace(beta=np.full((K, Z), 1.0 / Z))
    if gamma == 1.0:
        best = best._replace(w=np.zeros((L, K, K)))
    return best


def expected_edges(fit: MTCOVFit) -> np.ndarray:
    """``lambda^l_ij = u_i' W^l v_j``, shape (L, N, N), zero on the (unmodelled) self-loops."""
    lam = np.einsum("ik,lkq,jq->lij", fit.u, fit.w, fit.v)
    lam[:, np.arange(lam.shape[1]), np.arange(lam.shape[1])] = 0.0
    return lam


def attribute_probabilities(fit: MTCOVFit) -> np.ndarray:
    """``pi_iz = sum_k (u_ik + v_ik) / 2 beta_kz``, shape (N, Z); rows sum to 1."""
    return 0.5 * (fit.u + fit.v) @ fit.beta
