"""The Student-t second opinion (numpyro_lm/checks/wide.py): its proposal, its distance, its place
in the verdict, and a truncated-normal posterior whose accurate fit it confirms and whose off one
it refuses, against a long NUTS run."""

import os
import sys

import jax
import numpy as np
import pytest
from scipy import stats

from numpyro_lm import LaplaceMatching, NotTrustedWarning
from numpyro_lm.checks.verdict import judge, verdict_sentence
from numpyro_lm.checks.psis import psis
from numpyro_lm.checks.wide import WideCheck, student_t_draws, wide_shifts

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from third_party_models import case  # noqa: E402

REFERENCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "third_party_nuts.npz")


def test_student_t_draws_and_their_density_are_scipys():
    rng = np.random.default_rng(0)
    mean, a = np.array([1.0, -2.0, 0.5]), rng.normal(size=(3, 3))
    cov = a @ a.T + 0.5 * np.eye(3)
    flat, log_t = student_t_draws(rng, mean, cov, 20000, np.float32, df=4.0)
    assert flat.dtype == np.float32
    # the density at the rounded draws, to float64 round-off
    expected = stats.multivariate_t(loc=mean, shape=cov, df=4.0).logpdf(flat.astype(np.float64))
    np.testing.assert_allclose(log_t, expected, rtol=1e-10, atol=1e-10)
    # a t_4's covariance is df / (df - 2) = 2 times its scale matrix; the sample covariance of
    # 20000 draws of a heavy-tailed t is within ~15 % (its fourth moment is infinite: a loose bound)
    np.testing.assert_allclose(np.cov(flat.T), 2.0 * cov, rtol=0.25, atol=0.25)
    assert student_t_draws(rng, mean, -cov, 10, np.float32) is None  # not positive definite


def test_draws_that_overflow_are_left_out_only_where_they_weigh_nothing():
    rng = np.random.default_rng(2)
    q, p = rng.normal(size=(1000, 1)), rng.normal(size=(1000, 1))
    p[0] = np.inf
    log_w = np.zeros(1000)
    log_w[0] = -50.0  # a tail draw whose weight is negligible
    assert np.isfinite(wide_shifts(["x"], {"x": q}, {"x": p}, log_w)["x"])
    log_w[0] = 10.0  # ... or one that carries the estimate
    assert wide_shifts(["x"], {"x": q}, {"x": p}, log_w)["x"] == np.inf


def test_the_second_opinion_decides_only_where_it_is_reliable():
    close = WideCheck(khat=0.2, ess=3000.0, num_samples=4000, shift={"a": 0.03})
    verdict = judge(0.85, 4000, 40.0, {"a": float("nan")}, wide=close)
    assert verdict.trusted and verdict.wide_khat == 0.2
    assert "Student-t" in verdict_sentence(verdict, 0.85, 40.0)
    off = close._replace(shift={"a": 0.4})
    verdict = judge(0.85, 4000, 40.0, {"a": float("nan")}, wide=off)
    assert not verdict.trusted and "'a' by 0.40 SD" in verdict.reasons[0]
    unreliable = close._replace(khat=0.9)
    verdict = judge(0.85, 4000, 40.0, {"a": float("nan")}, wide=unreliable)
    assert not verdict.trusted and verdict.reasons[0].startswith("k-hat 0.85 > 0.70")
    # q's own weights pass: the second opinion is not looked at
    assert judge(0.3, 4000, 3000.0, {"a": 0.5}, wide=close).reasons[0].startswith("reweighting")


def _truncated_normal_gap(lm):
    """Worst |mean LM - mean NUTS| / sd NUTS and worst |log(sd LM / sd NUTS)| over loc and scale."""
    samples = lm.get_samples()
    with np.load(REFERENCE) as ref:
        gaps = [(abs(np.mean(samples[k]) - ref[f"truncated_normal/{k}/mean"]) / ref[f"truncated_normal/{k}/sd"],
                 abs(np.log(np.std(samples[k]) / ref[f"truncated_normal/{k}/sd"]))) for k in ("loc", "scale")]
    return max(g[0] for g in gaps), max(g[1] for g in gaps)


@pytest.mark.slow
def test_an_accurate_fit_beyond_its_own_weights_is_confirmed_and_an_off_one_is_not():
    # the truncation point inside the bulk: loc and scale trade off along a ridge whose tail the
    # fits' Gaussians do not reach (k-hat of their own weights 0.77-0.96 over three seeds)
    c = case("truncated_normal")
    nested = LaplaceMatching(c.model, progress_bar=False).run(jax.random.PRNGKey(0), *c.args, **c.kwargs)
    d = nested.diagnostics()
    assert d["pareto_k"] > 0.7 and d["trusted"], d["verdict"]
    mean_gap, sd_gap = _truncated_normal_gap(nested)
    # against 4000 NUTS draws: MC error of the means ~ 1/sqrt(1000 LM draws) = 0.03 SD, of log SD ~ 0.02
    assert mean_gap < 0.1 and sd_gap < 0.1
    # the joint Laplace fit of the same posterior is 0.35-0.39 SD off in loc: the second opinion says so
    with pytest.warns(NotTrustedWarning):
        joint = LaplaceMatching(c.model, progress_bar=False, strategy="laplace").run(
            jax.random.PRNGKey(0), *c.args, **c.kwargs)
    d = joint.diagnostics()
    assert _truncated_normal_gap(joint)[0] > 0.3
    # (its own k-hat is 0.65-0.83 over seeds: the second opinion or the first check names loc)
    assert not d["trusted"] and "'loc'" in d["reasons"][0]


def test_psis_of_the_t_proposal_is_light_tailed_on_a_gaussian_target():
    # p Gaussian, t_4 proposal with p's moments as its scale: p/t is bounded, so k-hat <= 0.5
    rng = np.random.default_rng(3)
    cov = np.array([[1.0, 0.6], [0.6, 2.0]])
    flat, log_t = student_t_draws(rng, np.zeros(2), cov, 4000, np.float64)
    log_p = stats.multivariate_normal(np.zeros(2), cov).logpdf(flat)
    assert psis(log_p, log_t).khat < 0.5
