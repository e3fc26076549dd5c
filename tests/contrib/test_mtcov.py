"""MTCOV baseline (numpyro_lm/contrib/networks/mtcov.py): EM monotonicity, recovery of a planted
partition, the gamma = 0 / 1 limits, and input validation."""

import itertools

import numpy as np
import pytest
from scipy.stats import poisson, rankdata

from numpyro_lm.contrib.networks import mtcov
from numpyro_lm.contrib.networks.mtcov import attribute_probabilities, expected_edges, fit_mtcov


def _planted(seed, N=90, K=3, degree=10.0, ratio=0.1, agree=0.8):
    """Hard groups; layer 0 assortative, layer 1 disassortative, each with expected out-degree
    ``degree`` (so about 20 edges in + out per node and layer) and rates ``hi`` vs ``ratio * hi``
    as in the thesis (p2 = 0.1 p1). ``x_i`` is the group for ``agree`` of the nodes, uniform
    otherwise. Returns the counts, attributes, true memberships and true rates."""
    rng = np.random.default_rng(seed)
    groups = np.arange(N) * K // N
    truth = np.eye(K)[groups]
    n_in, n_out = N // K - 1, N - N // K
    hi = degree / (n_in + ratio * n_out)
    same = np.eye(K, dtype=bool)
    w = np.stack([np.where(same, hi, ratio * hi),
                  np.where(same, ratio * hi, (degree - n_in * ratio * hi) / n_out)])
    lam = np.einsum("ik,lkq,jq->lij", truth, w, truth)
    lam[:, np.arange(N), np.arange(N)] = 0.0
    x = np.where(rng.random(N) < agree, groups, rng.integers(0, K, N))
    return rng.poisson(lam), x, truth, lam


def _auc(score, positive):
    ranks = rankdata(score)  # ties get their mean rank, i.e. count one half
    n_pos = positive.sum()
    return (ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * (len(score) - n_pos))


def _cosine(u, v, truth):
    """Mean over nodes of the cosines between membership rows and the truth (the same for u and
    v here), under the best permutation of communities, one for u and v together."""
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)
    return max(np.mean(np.sum((unit(u[:, p]) + unit(v[:, p])) * unit(truth), axis=1)) / 2
               for p in map(list, itertools.permutations(range(truth.shape[1]))))


def _random_instance(seed, N=40, L=2, Z=4):
    rng = np.random.default_rng(seed)
    edges = rng.poisson(rng.gamma(0.3, 2.0, (L, N, N)))  # sparse, heterogeneous counts
    return edges, rng.integers(0, Z, N), rng.random((L, N, N)) < 0.8, rng.random(N) < 0.8


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_objective_never_decreases(gamma, seed):
    edges, x, mask_e, mask_a = _random_instance(seed)
    d = mtcov._prepare(edges, x, 3, 4, gamma, mask_e, mask_a)
    start = mtcov._initial(np.random.default_rng(seed), 40, 2, 3, 4)
    u, v, w, beta, trace = mtcov._em(d, *start, max_iter=300, tol=0.0)
    scale = np.abs(trace).max()
    assert np.all(np.diff(trace) >= -1e-10 * scale), np.diff(trace).min()
    # the cached log P(A) of the sweep agrees with a fresh evaluation
    assert trace[-1] == pytest.approx(mtcov._objective(d, u, v, w, beta), rel=1e-10)
    for rows in (u, v, beta):
        np.testing.assert_allclose(rows.sum(axis=1), 1.0)


@pytest.mark.parametrize("a, b, old", [
    # a tiny a_k next to a cheap b_k: Newton on f = 1 / psi stalled here and lowered F
    ([5.2, 12.3, 16.5, 4e-17], [31.7, 27.4, 34.5, 6.9], [0.15, 0.41, 0.44, 1e-17]),
    # a subnormal a_k with the cheapest b_k: a_k / x^2 overflowed and Newton stopped
    ([14.0, 4.4e-25, 3.7e-310, 3.0], [41.3, 27.05, 2e-13, 4.38], [0.34, 2.6e-26, 1.8e-297, 0.66]),
])
def test_simplex_step_near_a_pole(a, b, old):
    a, b, old = (np.array([row]) for row in (a, b, old))
    new = mtcov._simplex_argmax(a, b, old)
    q = lambda u: np.sum(a * np.log(np.maximum(u, 1e-300)) - b * u)
    assert q(new) >= q(old)
    np.testing.assert_allclose(new.sum(), 1.0)
    # stationarity: u_k (mu + b_k) = a_k with one mu for all k that carry weight
    keep = a > 1e-10
    mu = a[keep] / new[keep] - b[keep]
    np.testing.assert_allclose(mu, mu[0], rtol=1e-8)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_recovers_planted_partition():
    edges, x, truth, lam_true = _planted(seed=0)
    N = len(x)
    rng = np.random.default_rng(100)
    mask_e = rng.random(edges.shape) < 0.8  # 20% of the entries and 25% of the nodes held out
    mask_a = rng.random(N) < 0.75
    fit = fit_mtcov(edges, x, 3, mask_edges=mask_e, mask_attributes=mask_a, num_restarts=10)

    # Measured 0.977. With 10 restarts, 8 of 10 seeds of this generator give 0.97-0.985; the
    # other two end in an optimum whose v communities are a relabelling of u's (the network
    # likelihood cannot tell; only the attributes, through pi = (u + v) beta / 2, can), which
    # scores 0.68 here, as does merging two groups. 0.9 separates the two kinds.
    assert _cosine(fit.u, fit.v, truth) > 0.9

    # AUC of lambda on the held-out entries (positives: A > 0). Its ceiling is the AUC of the
    # true rates, 0.73-0.76 on these networks: entries inside one block tie, and a 10:1
    # contrast at this degree leaves most in-block entries zero and some edges between blocks
    # (even 100:1 only reaches ~0.81, so the 0.8 first asked for is out of reach). Measured
    # 0.737 against 0.732 for the truth; over 10 seeds the fit was within 0.01 of the truth.
    held = ~mask_e & ~np.eye(N, dtype=bool)
    auc = _auc(expected_edges(fit)[held], edges[held] > 0)
    oracle = _auc(lam_true[held], edges[held] > 0)
    assert auc > 0.7 and auc > oracle - 0.02

    # Held-out attributes (20 nodes): predicting each node's true group scores 0.90 here (0.87
    # on average: 0.8 + 0.2 / 3) and the fit does the same, measured 0.90. An aligned fit matched
    # that oracle exactly on all 8 seeds above; the misaligned ones fell to 0.53-0.68.
    accuracy = np.mean(attribute_probabilities(fit).argmax(axis=1)[~mask_a] == x[~mask_a])
    assert accuracy > 0.7


@pytest.mark.parametrize("gamma", [0.0, 1.0])
def test_gamma_limits_use_one_source(gamma):
    edges, x, mask_e, mask_a = _random_instance(3, N=30)
    other_edges, other_x, _, _ = _random_instance(4, N=30)
    kw = dict(num_categories=4, gamma=gamma, mask_edges=mask_e, mask_attributes=mask_a,
              num_restarts=2, max_iter=60)
    fit = fit_mtcov(edges, x, 3, **kw)
    if gamma == 0.0:  # the attributes are ignored and F is the Poisson log-likelihood
        same = fit_mtcov(edges, other_x, 3, **kw)
        train = mask_e & ~np.eye(30, dtype=bool)
        loglik = poisson.logpmf(edges, expected_edges(fit))[train].sum()
        assert fit.objective == pytest.approx(loglik, rel=1e-10)
        np.testing.assert_allclose(fit.beta, 0.25)
    else:  # the network is ignored and F is the categorical log-likelihood
        same = fit_mtcov(other_edges, x, 3, **kw)
        pi = attribute_probabilities(fit)
        assert fit.objective == pytest.approx(np.log(pi[np.arange(30), x])[mask_a].sum(), rel=1e-10)
        np.testing.assert_array_equal(fit.w, 0.0)
    for a, b in zip(fit[:4], same[:4]):
        np.testing.assert_array_equal(a, b)


def test_restarts_keep_the_best():
    edges, x, _, _ = _random_instance(5, N=30)
    fit = fit_mtcov(edges, x, 2, num_categories=4, num_restarts=4, max_iter=50, seed=7)
    d = mtcov._prepare(edges, x, 2, 4, 0.5, None, None)
    rng = np.random.default_rng(7)  # the same stream of starts
    finals = [mtcov._em(d, *mtcov._initial(rng, 30, 2, 2, 4), 50)[-1][-1] for _ in range(4)]
    assert fit.objective == max(finals) and len(set(finals)) > 1
    assert 1 <= fit.num_iterations <= 50


_EDGES = np.ones((2, 5, 5), int)
_X = np.array([0, 1, 2, 0, 1])


@pytest.mark.parametrize("change, name", [
    (dict(edges=np.ones((5, 5), int)), "edges"),
    (dict(edges=np.ones((2, 5, 4), int)), "edges"),
    (dict(edges=-_EDGES), "edges"),
    (dict(edges=_EDGES * 0.5), "edges"),
    (dict(edges=np.full((2, 5, 5), np.nan)), "edges"),
    (dict(attributes=_X[:4]), "attributes"),
    (dict(attributes=_X + 0.5), "attributes"),
    (dict(attributes=_X - 1), "attributes"),
    (dict(attributes=_X, num_categories=2), "attributes"),
    (dict(num_categories=0), "num_categories"),
    (dict(gamma=1.5), "gamma"),
    (dict(gamma=-0.1), "gamma"),
    (dict(gamma=float("nan")), "gamma"),
    (dict(num_communities=0), "num_communities"),
    (dict(num_communities=2.5), "num_communities"),
    (dict(mask_edges=np.ones((2, 5, 4), bool)), "mask_edges"),
    (dict(mask_edges=np.ones((2, 5, 5), int)), "mask_edges"),
    (dict(mask_attributes=np.ones(4, bool)), "mask_attributes"),
    (dict(num_restarts=0), "num_restarts"),
    (dict(max_iter=0), "max_iter"),
    (dict(tol=-1.0), "tol"),
])
def test_bad_input_names_the_argument(change, name):
    args = dict(edges=_EDGES, attributes=_X, num_communities=2) | change
    with pytest.raises(ValueError, match=name):
        fit_mtcov(args.pop("edges"), args.pop("attributes"), args.pop("num_communities"), **args)
