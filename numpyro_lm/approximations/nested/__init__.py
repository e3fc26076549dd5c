r"""Nested Laplace over hyperparameters (INLA, Rue, Martino and Chopin 2009) for any model.

A joint Laplace approximation fails on hierarchical models: the joint mode of a group
scale sits far from the bulk of its marginal posterior. Split the LM basis coordinates
into a few hyperparameters :math:`\theta` and the rest :math:`x`. For fixed
:math:`\theta` the conditional :math:`p(x \mid \theta, y)` is close to Gaussian, and

.. math:: \log \tilde p(\theta \mid y) = \log p(y, x^*(\theta), \theta)
          - \tfrac12 \log\det H(\theta) + \text{const},

with :math:`x^*(\theta)` the conditional mode (inner Newton, warm-started) and
:math:`H(\theta)` the negative Hessian in :math:`x` there, is the Laplace approximation of
the hyperparameters' marginal posterior. We find its mode :math:`\theta^*` and curvature
(Newton with central differences on a stencil of 0.5 posterior SDs, evaluated in one
vectorised call), standardise :math:`\theta = \theta^* + V\Lambda^{-1/2} z`, and integrate:

* **up to three coordinates, a lattice** in ``z`` (step 0.5 in 1-D, 0.75 in 2-D, 1 in
  3-D) explored outwards from the mode, as INLA's grid strategy does: the neighbours of a
  point are evaluated while the point's log density is within ``drop`` (8, 9, 10.5) of the
  mode's, so skewed marginals (a scale's log has a heavy tail towards zero) get the
  extent they need on each side, each inner fit warm-started from the conditional mode
  extrapolated from its neighbours. Inside the cell of each point :math:`\log\tilde p` is
  its local quadratic along each axis (central differences of the lattice values,
  :func:`cell_moments`): weights :math:`\propto \tilde p(\theta_k \mid y)\prod_a
  \int_{-h/2}^{h/2} e^{g_a u - c_a u^2/2}\,du`, exact for a Gaussian marginal.
  The *edge* is the set of points with a neighbour left out of the design; its share of
  the weight is small by construction (below 1e-3 for a Gaussian marginal) unless the
  lattice hit its extent (10 standardised units) or inner fits failed;
* **four to ten coordinates, a central composite design** (INLA's CCD): the centre,
  ``2d`` star points and the points of a two-level (full for four, half fraction beyond,
  resolution at least V) factorial, all at radius :math:`f_0\sqrt d`, :math:`f_0 = 1.1`,
  with volumes :math:`c_k/\phi(z_k)` that integrate a standard Gaussian's mass and
  second moments exactly (:math:`c = 1 - f_0^{-2}` at the centre, :math:`1/(K f_0^2)` at
  each of the ``K`` others): weights :math:`\propto c_k \tilde p(\theta_k\mid y)/\phi(z_k)`.

Draws. On a lattice: a cell by weight, :math:`z` inside it from the cell's density
(:func:`cell_draws`; a uniform :math:`z` would make the importance weights vary with the
marginal's slope across each cell: k-hat 0.72 on eight schools), and
:math:`x \mid z \sim N(m_k + S_k (z - z_k), H_k^{-1})`, the cell's conditional Gaussian
with its mean following :math:`z` along the slope :math:`S_k` of the conditional means
between the point's lattice neighbours. For a CCD, :math:`z` is drawn from a split normal
along each standardised axis (scales :math:`\sigma^\pm_i = r/\sqrt{2\,\text{drop}}`
from the star points' log density drop, INLA's skewness correction) and :math:`x` from
the conditional Gaussian of the nearest design point, its mean moved along the
least-squares slope of the conditional means over the design (exact for a
linear-Gaussian model). The conditional means :math:`m_k` are the modes moved by
:func:`mean_shift` (skewed conditionals, e.g. small Poisson counts). Coordinates of
sites matched one by one (Gamma, Beta...) are mapped from their conditional Gaussian
through that point's matched family with the Gaussian copula (no shift, no slope), so a
conjugate conditional (a Beta given the hyperparameters) is drawn exactly; coordinates
the conditional precision couples to nothing are drawn from the family directly. The
draws' density is exact, so PSIS applies.

The matched family of each site comes from the design's moments in the LM basis: the
first two moments of the mixture (conditional means and covariances weighted by the
design weights, plus the within-cell spread of :math:`z` and of the means that follow
it on a lattice), replaced by the draws' moments for sites drawn through per-point
matched families.
"""

from .design import CCD_F0, NestedDesign, ccd_points, integrate
from .lattice_design import LATTICE, cell_draws, cell_moments, lattice
from .fit import Coordinates, NestedResult, nested_coordinates, run_nested
from .inner import MarginalAtPoints
from .mixture import draw, mixture_moments
from .search import ModeSearch, NonFiniteStart, explore

__all__ = [
    "run_nested", "NestedResult", "Coordinates", "nested_coordinates", "MarginalAtPoints", "NestedDesign", "ModeSearch",
    "NonFiniteStart", "LATTICE", "CCD_F0", "explore", "lattice", "integrate", "ccd_points", "cell_moments",
    "cell_draws", "mixture_moments", "draw",
]
