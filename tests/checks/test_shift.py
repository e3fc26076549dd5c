"""The marginals' shifts under reweighting (numpyro_lm/checks/shift.py): Wasserstein-1 distances
in units of the posterior's SD, against closed forms."""

import numpy as np
import pytest

from numpyro_lm.checks.shift import importance_shift, two_sample_shift


def test_importance_shift_is_the_reweighted_wasserstein_distance():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20000, 2))
    # weights exp(0.5 x0) turn N(0, 1) into N(0.5, 1): W1 = 0.5 SD in column 0, 0 in column 1
    shift = importance_shift(x, 0.5 * x[:, 0])
    # Monte Carlo error of a W1 between samples of ESS ~ 15000: ~1/sqrt(ESS) = 0.008
    assert shift[0] == pytest.approx(0.5, abs=0.03) and shift[1] < 0.03
    assert np.all(importance_shift(x, np.zeros(20000)) == 0.0)  # equal weights move nothing



def test_two_sample_shift_is_the_wasserstein_distance_of_the_weighted_sample():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(20000, 2))
    p = rng.normal(size=(30000, 2))
    # weights exp(0.5 x0) turn p's N(0, 1) into N(0.5, 1): W1 to q's N(0, 1) is 0.5 SD in column 0
    shift = two_sample_shift(q, p, 0.5 * p[:, 0])
    # Monte Carlo error of a W1 between samples of 20000 and ESS ~ 23000 draws: ~ sqrt(1/2e4 + 1/2.3e4) = 0.01
    assert shift[0] == pytest.approx(0.5, abs=0.04) and shift[1] < 0.04
    same = two_sample_shift(q, p, np.zeros(30000))
    assert np.all(same < 0.04)


def test_shifts_are_in_units_of_the_posteriors_sd_not_qs():
    # q = N(0, 2^2) reweighted by exp(-3x^2/8) is p = N(0, 1): quantile coupling gives
    # W1 = (2 - 1) E|Z| = sqrt(2/pi) = 0.798 in p's SDs (0.399 in q's, what it once reported)
    rng = np.random.default_rng(3)
    q = 2.0 * rng.normal(size=(40000, 1))
    shift = importance_shift(q, -0.375 * q[:, 0] ** 2)
    # MC error: ESS ~ 0.8 * 40000 (weights bounded by 1), W1 noise ~ 1/sqrt(ESS) ~ 0.006 SD
    assert shift[0] == pytest.approx(np.sqrt(2 / np.pi), abs=0.03)
    t = 2.0 * rng.normal(size=(40000, 1))
    other = two_sample_shift(rng.normal(size=(40000, 1)) * 2.0, t, -0.375 * t[:, 0] ** 2)
    assert other[0] == pytest.approx(np.sqrt(2 / np.pi), abs=0.03)  # the same, two samples: ~0.01


def test_weights_on_one_draw_fall_back_to_qs_sd():
    x = np.arange(10.0)[:, None]
    log_w = np.full(10, -np.inf)
    log_w[9] = 0.0  # all the mass on x = 9: the weighted SD is 0
    # W1 between uniform {0..9} and a point at 9 is mean |x - 9| = 4.5; over q's SD sqrt(8.25)
    assert importance_shift(x, log_w)[0] == pytest.approx(4.5 / np.sqrt(8.25))
