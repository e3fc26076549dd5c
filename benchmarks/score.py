"""How far an approximation's draws are from a reference posterior: W1 / sd per coordinate.

For every coordinate of every latent site (event dimensions flattened, constrained
values: a simplex or a correlation Cholesky factor is scored entry by entry), the 1-D
Wasserstein-1 distance between the approximation's draws and the reference draws,
divided by the reference standard deviation. 0.1 means the marginal is off by a tenth
of a posterior sd (in location, spread or shape); a pure shift by 0.5 sd scores 0.5.
Coordinates with zero reference sd (e.g. the fixed entries of a correlation Cholesky
factor) are not scored (NaN).

``python benchmarks/score.py [name ...]`` prints the score's Monte Carlo noise floor:
W1/sd between two independent halves of each reference (chains 1-2 against 3-4), and
the check that a shift by 0.5 sd scores 0.5.
"""

import os
import sys

import numpy as np
from scipy.stats import wasserstein_distance

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import load_reference  # noqa: E402
from suite import SUITE  # noqa: E402


def w1_over_sd(draws: dict, reference: dict) -> dict:
    """``{site: array (k,)}``: W1 / reference sd of each of the site's k flattened coordinates
    (NaN where the reference sd is zero, inf where a draw is not finite). Only the
    reference's sites are scored."""
    scores = {}
    for site, ref in reference.items():
        ref = np.asarray(ref, np.float64).reshape(len(ref), -1)
        approx = np.asarray(draws[site], np.float64).reshape(len(draws[site]), -1)
        if approx.shape[1] != ref.shape[1]:
            raise ValueError(f"site {site!r}: {approx.shape[1]} coordinates in the draws, {ref.shape[1]} in the "
                             "reference")
        sd = ref.std(0)
        scores[site] = np.array([
            np.nan if sd[i] == 0 else
            np.inf if not np.all(np.isfinite(approx[:, i])) else
            wasserstein_distance(approx[:, i], ref[:, i]) / sd[i]
            for i in range(ref.shape[1])
        ])
    return scores


def worst(scores: dict) -> tuple:
    """``(site, flat index, value)`` of the largest score."""
    site = max(scores, key=lambda k: np.nanmax(scores[k], initial=-np.inf))
    index = int(np.nanargmax(scores[site]))
    return site, index, float(scores[site][index])


def halves(reference: dict) -> tuple:
    """Two independent halves of a reference: its first and last two chains (2000 draws each)."""
    n = len(next(iter(reference.values()))) // 2
    return {k: v[:n] for k, v in reference.items()}, {k: v[n:] for k, v in reference.items()}


def shifted(reference: dict, by: float) -> dict:
    """The reference moved by ``by`` reference sds in every coordinate."""
    return {k: v + by * v.std(0) for k, v in reference.items()}


def main(names):
    print("| model | W1/sd, halves: worst (site[i]) | median | W1/sd, shift by 0.5 sd: min, max |\n|---|---|---|---|")
    for name in names:
        ref = load_reference(name)
        first, second = halves(ref)
        noise = w1_over_sd(first, second)
        site, i, value = worst(noise)
        median = np.nanmedian(np.concatenate(list(noise.values())))
        shift = np.concatenate(list(w1_over_sd(shifted(ref, 0.5), ref).values()))
        print(f"| {name} | {value:.3f} ({site}[{i}]) | {median:.3f} | {np.nanmin(shift):.3f}, {np.nanmax(shift):.3f} |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(SUITE))
