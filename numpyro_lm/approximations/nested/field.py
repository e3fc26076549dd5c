r"""A long Markov field's verdict with the field integrated out.

The importance weights over a whole latent field sum the small errors of its Gaussian
conditionals, coordinate by coordinate: over an AR(1) trend of 200 Poisson counts their
log-weights spread by 1.9 nats (k-hat 0.3-0.5), over 2000 by several (k-hat 0.76-0.97) however
good the fit, as the joint weights of a model with 10^4 random effects did before their blocks
were integrated out (:mod:`.blocks`). For a field of at least :data:`FIELD_MIN` coordinates whose
inner fits are banded and corrected to second order
(:mod:`numpyro_lm.marginal.field_correction`), the verdict integrates the field out instead:

- **the hyperparameters' weights**: at each of :data:`FIELD_DRAWS` draws of the design's
  mixture, the inner fit at the draw's hyperparameters (from its design point's mode moved
  along its slope) gives the corrected Laplace value :math:`\log \hat p(y, \theta)`, against
  the mixture's density of :math:`\theta` alone. Their k-hat and the hyperparameters' shifts
  are judged as the blocks' collapsed weights are (few coordinates:
  :data:`~numpyro_lm.checks.verdict.NEAR_UNIFORM_ESS`);
- **the field's sites**: each coordinate's conditional at the design's heaviest point is a
  Gaussian whose skewness to leading order is :math:`\gamma_i`
  (:func:`~numpyro_lm.marginal.field_correction.field_skewness`; its mean is moved already:
  the design's mean shift); a distribution whose density is the Gaussian's times
  :math:`1 + \tfrac{\gamma}{6} He_3` (Edgeworth) lies at a Wasserstein-1 distance of
  :math:`\tfrac{|\gamma|}{6} E|Z^2 - 1| = 0.161 |\gamma|` of its SDs from it: the sites' shifts.

What this verdict cannot see it does not claim: where the field's higher derivatives are not
diagonal (the correction's check), the joint weights judge the fit as before.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...core.starts import origin_point
from ...core.trace import site_values
from ...marginal.conditional import banded_inner_hessian
from ...marginal.field_correction import field_skewness
from ...mode.banded_hessian import BandedHessian
from ...runtime.programs import in_float64, program
from .coordinates import Coordinates, nested_coordinates

__all__ = ["FIELD_MIN", "FIELD_DRAWS", "EDGEWORTH_W1", "Field", "find_field", "field_weights", "BORDER_HYPER_DIM",
           "border_joins_hyper"]

FIELD_MIN = 100
"""Field coordinates from which the verdict integrates the field out. The joint weights judge a
shorter one. They held over an AR(1) trend of 200 Poisson counts (k-hat 0.3-0.5), but over 800
steps the shifts they estimated from k-hat 0.56 weights reached 0.16-0.17 SD, and over a random
walk under 200 binary observations their k-hat was 0.70-0.84 where every marginal was within
0.02 SD of a long NUTS run."""
LONG_FIELD = 500
"""Field coordinates from which a border may bring the hyperparameters to
:data:`BORDER_HYPER_DIM` coordinates (:func:`border_joins_hyper`)."""
SHORT_BORDER_HYPER_DIM = 2
"""Most hyperparameter coordinates a shorter field's border may bring them to."""
FIELD_DRAWS = 200
"""Draws behind the field's verdict: each costs an inner fit (a k-hat from 200 draws is judged
against 0.57)."""
EDGEWORTH_W1 = 4 * 0.24197072451914337 / 6
r""":math:`E|Z^2 - 1| / 6 = 4\varphi(1) / 6`: the Wasserstein-1 distance (SDs) per unit of skewness
between a Gaussian and its first Edgeworth correction (the CDFs differ by
:math:`\tfrac{\gamma}{6} He_2(z)\varphi(z)`)."""


class Field(NamedTuple):
    """A nested fit's field, integrated out in its verdict: the hyperparameters' flat coordinates
    (``theta_index``), the inner fits at any points (``marginal``:
    :class:`~.inner.MarginalAtPoints`) and the field's sites' shifts (``shift``: module docstring)."""

    theta_index: np.ndarray
    marginal: object
    shift: dict


def _skewness(info, theta_index: tuple, hessian: BandedHessian, theta, x, args, kwargs):
    """The float64 program of :func:`find_field`: :func:`field_skewness` at ``(theta, x)``, the band
    read as the inner fits' ``hessian`` reads it (its random probe left out)."""
    theta_index = np.asarray(theta_index)

    def neg(z):
        return -info.log_density(site_values(info.layout, theta_index, theta, z), args, kwargs)

    band = hessian.evaluate(neg, x)[2][0]
    return field_skewness(neg, x, band, hessian.half_width)


def find_field(info, hessian, design, x_index, gaussian_cols, marginal, args, kwargs, compiler_options=None):
    """The :class:`Field` of a nested fit whose inner fits read a band with no border over at least
    :data:`FIELD_MIN` coordinates, all drawn from their Gaussian conditionals, and whose higher
    derivatives are diagonal at the design's heaviest point; else ``None`` (the joint weights judge it)."""
    if (not isinstance(hessian, BandedHessian) or hessian.glob or len(x_index) < FIELD_MIN
            or not np.all(gaussian_cols)):
        return None
    k = int(np.argmax(design.log_weights))
    run = program(_skewness, info, tuple(int(i) for i in design.theta_index), hessian._replace(check=False),
                  compiler_options=compiler_options)
    gamma = np.asarray(in_float64(run, (design.theta[k], design.x_mode[k]), args, kwargs), np.float64)
    if not np.all(np.isfinite(gamma)):
        return None
    bound = np.zeros(info.layout.size)
    bound[np.asarray(x_index)] = EDGEWORTH_W1 * np.abs(gamma)
    shift = {s.name: float(np.max(bound[s.offset:s.offset + s.size], initial=0.0)) for s in info.layout.sites
             if np.isin(np.arange(s.offset, s.offset + s.size), x_index).all()}
    return Field(np.asarray(design.theta_index), marginal, shift)


def field_weights(field: Field, design, made, flat):
    """``(log p, log q)`` of the draws ``flat`` (``made`` their mixture's record) over the
    hyperparameters with the field integrated out: the corrected Laplace value of an inner fit at
    each draw's hyperparameters, from its design point's mode moved along its slope, against the
    mixture's density of the hyperparameters alone."""
    # the hyperparameters' columns alone to the host (the draws over 10^5 coordinates: 0.8 GB)
    theta = np.asarray(flat[:, np.asarray(field.theta_index)], np.float64)
    # each inner fit starts from its point's mode moved along the point's slope: a Newton step
    # or two fewer than from the point's mode itself (point by point: no n x Dx x d gather)
    start = np.empty((len(theta), design.x_mode.shape[1]), design.x_mode.dtype)
    for k in np.unique(made.point):
        rows = made.point == k
        start[rows] = design.x_mode[k] + made.offset[rows] @ design.x_slope[k].T
    fits = field.marginal(theta, start, keep=("log_density",))
    return np.asarray(fits.log_density, np.float64), np.asarray(made.log_q_hyper, np.float64)


BORDER_HYPER_DIM = 3
"""Most hyperparameter coordinates a field's border may bring them to (:func:`border_joins_hyper`):
the lattice's (:data:`~numpyro_lm.approximations.nested.lattice_design.LATTICE`)."""


def border_joins_hyper(info, split: Coordinates, banded, args, kwargs):
    """``(split, band)``: a field's border (its level, ``mu`` of an AR(1) trend) joins the
    hyperparameters where its sites are whole and the hyperparameters stay within
    :data:`BORDER_HYPER_DIM` coordinates (:data:`SHORT_BORDER_HYPER_DIM` below
    :data:`LONG_FIELD` field coordinates), and the field's band then has no border. Integrated over
    by the design, it leaves the inner fits a band alone, whose verdict integrates the field out
    (:mod:`.field`); a border couples every coordinate's higher derivatives (the inner fits'
    second-order correction takes it, over the linear predictors:
    :mod:`numpyro_lm.marginal.field_correction`; this verdict does not). Fields shorter than
    :data:`FIELD_MIN` keep their border, as do shorter than :data:`LONG_FIELD` whose border would
    make a third hyperparameter: the joint weights judge them, and a third hyperparameter multiplies
    the design's points (an AR(1) over 200 steps: 721 points instead of 106, a warm call of 0.77 s
    instead of 0.28 s). Else unchanged."""
    length = len(split.x_index) - len(banded.glob)
    most = BORDER_HYPER_DIM if length >= LONG_FIELD else SHORT_BORDER_HYPER_DIM if length >= FIELD_MIN else 0
    layout = info.layout
    border = set(np.asarray(split.x_index)[np.asarray(banded.glob)].tolist())
    sites = [s for s in layout.sites if border & set(range(s.offset, s.offset + s.size))]
    whole = all(set(range(s.offset, s.offset + s.size)) <= border for s in sites)
    if not whole or split.theta_index.size + len(border) > most:
        return split, banded
    joined = nested_coordinates(layout, list(split.hyper) + [s.name for s in sites])
    key = tuple(int(i) for i in joined.theta_index)
    alone = banded_inner_hessian(info, key, origin_point(layout), args, kwargs)
    return (joined, alone) if alone is not None and not alone.glob else (split, banded)
