"""The third-party corpus's record of a case (:class:`Case`), and what of a model's draws can
be compared with NUTS (:func:`comparable`): the same quantities for the reference
(``tests/data/make_third_party_references.py``) and for LM (``test_third_party.py``).

Most sites compare as they are. Where the raw draws have no meaningful mean, a function of
them that does: a symmetric mixture's labels switch between NUTS chains (sorted locations);
an angle near the cut at +-pi averages to nonsense (its cosine and sine); the entries of an
``obs_mask`` site that the mask drops have no density and drift under NUTS (left out: the
deterministic ``y`` holds the missing values); a mixture with Dirichlet weights is ordered by
its locations, its weights with them.
"""

from collections.abc import Callable
from typing import NamedTuple

import numpy as np


class Case(NamedTuple):
    model: Callable
    args: tuple
    kwargs: dict  # observed data passed as keyword, as users do
    kind: str  # "continuous", "discrete", "circular", "no_latent" or "degenerate"
    note: str  # the pitfall the case exercises


def _angle(samples, site):
    angle = np.asarray(samples.pop(site), np.float64)
    samples[f"cos({site})"], samples[f"sin({site})"] = np.cos(angle), np.sin(angle)


def _by_location(samples):
    order = np.argsort(np.asarray(samples["locs"]), axis=-1)
    for site in ("locs", "weights"):
        samples[site] = np.take_along_axis(np.asarray(samples[site]), order, axis=-1)


COMPARABLE = {
    "mixture_marginal": lambda s: s.update(locs=np.sort(np.asarray(s["locs"]), axis=-1)),
    "mixture_dirichlet": _by_location,
    "von_mises_circular": lambda s: (_angle(s, "mu"), s.pop("mu_unwrapped", None)),
    "obs_mask": lambda s: s.pop("y_unobserved", None),
}


def comparable(name: str, samples: dict) -> dict:
    """``{quantity: draws (S, ...)}`` of case ``name`` to compare between LM and NUTS."""
    out = {site: np.asarray(value) for site, value in samples.items()}
    if name in COMPARABLE:
        COMPARABLE[name](out)
    return out
