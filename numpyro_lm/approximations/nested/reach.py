"""What a lattice over every coordinate does not reach.

With every latent site a hyperparameter (:func:`~.coordinates.nested_coordinates`) the lattice
integrates the posterior itself, and its draws' importance weights can only judge what the
lattice covers: a second mode beyond it is invisible to them. On NumPyro's double well
(``-4 (x^2 - 1)^2``, wells 11 of the Laplace fit's SDs apart) the lattice stopped at its extent
(:data:`~.lattice_design.MAX_HALF` SDs) inside the valley, one well covered, and the weights
called it trusted with the mean 0.9 SD off. :func:`unreached` looks past the lattice before the
auto-pilot trusts such a fit: the mass on its edge, and the density on a coarse grid twice as
wide.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..joint_fit import log_densities
from .lattice_design import MAX_HALF

__all__ = ["EDGE_MASS_MAX", "SCAN_HALF", "unreached"]

EDGE_MASS_MAX = 1e-3
"""Most of the lattice's weight on points whose neighbours were not fitted (the design's edge), and
most of the mass the scan may find beyond the lattice."""

SCAN_HALF = {1: 2 * MAX_HALF, 2: 2 * MAX_HALF, 3: 12.0}
"""Half-width of the grid (standardised units, step 1) scanned beyond the lattice, by dimension
(41, 1681 and 15 625 model evaluations)."""


def unreached(result) -> list:
    """Reasons for distrust of a nested fit over every coordinate (``result.design`` without
    conditional coordinates): its edge holds more than :data:`EDGE_MASS_MAX` of the weight, or
    the scanned grid's cells outside the lattice more than that share of the mass."""
    design = result.design
    d = design.z.shape[1]
    reasons = []
    if design.edge_mass > EDGE_MASS_MAX:
        reasons.append(f"{design.edge_mass:.1%} of the posterior's mass lies on the edge of the lattice that "
                       "integrates it: the density goes on beyond the lattice's reach")
    half = SCAN_HALF[d]
    axis = np.arange(-half, half + 1.0)
    z = np.array(list(itertools.product(axis, repeat=d)), np.float64)
    covered = {tuple(p) for p in np.rint(design.z / design.step).astype(np.int64).tolist()}
    outside = np.array([tuple(p) not in covered for p in np.rint(z / design.step).astype(np.int64).tolist()])
    # the whole grid evaluated (a shape fixed by the dimension: a warm call compiles nothing), the
    # lattice's own cells masked after
    flat = np.zeros((len(z), result.info.size))
    flat[:, design.theta_index] = design.mode + z @ design.scale.T
    log_p = np.asarray(result.call(log_densities, (result.info,), (flat.astype(np.float32),), float64=True,
                                   points=len(z)), np.float64)
    z, log_p = z[outside], log_p[outside]
    top = float(result.search.log_density)  # the density's maximum: the lattice is centred on it
    # the scanned cells' share of the mass (unit cells; the mass near the top is about (2 pi)^(d/2)
    # exp(top) in these units, the mode's curvature being the identity in them)
    weights = np.where(np.isfinite(log_p), np.exp(np.minimum(log_p - top, 50.0)), 0.0)
    share = float(np.sum(weights)) / (2 * np.pi) ** (d / 2)
    if share > EDGE_MASS_MAX:
        far = z[np.argmax(weights)]
        reasons.append(f"about {min(share, 1.0):.1%} of the posterior's mass lies beyond the lattice that integrates it "
                       f"(its densest point found at {np.round(far, 1).tolist()}, standardised units from the mode, "
                       f"{float(np.max(log_p) - top):+.1f} nats from the top): another mode or a tail the lattice "
                       "does not reach")
    return reasons

