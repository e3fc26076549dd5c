"""What a fit says of itself: the diagnostics dictionary and the printed summary of a
:class:`~.result.Result` (one data set, or a batch: per-data-set arrays and a short line)."""

from __future__ import annotations

import numpy as np
from numpyro.diagnostics import print_summary as numpyro_print_summary

from ..checks.verdict import verdict_sentence

__all__ = ["diagnostics_of", "print_summary"]


def diagnostics_of(result) -> dict:
    """How far the fit can be trusted: the mode search (the result's own entries), the curvature's
    spectrum, PSIS of the draws and the verdict, with the auto-pilot's trail; entries are numbers
    for one data set and arrays over the data sets of a batch."""
    one = result.batch is None
    low, high = result.spectrum_range()
    weights = result.weights()[2]
    rows = [weights] if one else weights
    verdicts = result.verdicts()

    def per_row(values):
        values = np.asarray(values)
        return values[0].item() if one else values

    def each(values):
        return values[0] if one else values

    tried = () if result.trail is None else {a.candidate for a in result.trail}
    design = getattr(result, "design", None)
    if design is not None:
        tried = {*tried, "nested"}  # a nested fit: hyper= was given
    # a model of at most three coordinates not yet integrated on a lattice over all of them
    small = (one and result.info.size <= 3 and "lattice" not in tried
             and (design is None or design.x_mode.shape[1] > 0))
    lattice_sites = [s.name for s in result.info.layout.sites] if small else None
    return {
        **result.fit_diagnostics(),
        "trusted": per_row([v.trusted for v in verdicts]),
        "reasons": each([list(v.reasons) for v in verdicts]),
        "importance_shift": each([v.shift for v in verdicts]),
        "khat_threshold": per_row([v.khat_threshold for v in verdicts]),
        "num_diagnostic_samples": int(result.num_diagnostic_samples),
        "dimension": int(result.info.size),
        "hessian_min_eigenvalue": per_row(low),
        "hessian_max_eigenvalue": per_row(high),
        "hessian_condition_number": per_row(result.condition_numbers()),
        "pareto_k": per_row([w.khat for w in rows]),
        "psis_ess": per_row([w.ess for w in rows]),
        "elbo": per_row([w.elbo for w in rows]),
        "log_evidence": per_row([w.log_evidence for w in rows]),
        "num_samples": int(result.num_samples),
        "verdict": each([verdict_sentence(v, w.khat, w.ess, tried, lattice_sites) for v, w in zip(verdicts, rows)]),
        "trail": None if result.trail is None else [a._asdict() for a in result.trail],
    }


def print_summary(result, prob: float = 0.9, exclude_deterministic: bool = True):
    """Mean, sd, quantiles, n_eff and r_hat per site as MCMC prints them, then the fit's
    diagnostics; for a batch, one paragraph over the data sets."""
    d = result.diagnostics()
    sites = result.info.layout.sites
    families = "Matched families: " + ", ".join(f"{s.name} ~ {s.family} ({s.basis} basis)" for s in sites)
    if result.batch is not None:
        khat = np.asarray(d["pareto_k"])
        print(f"{result.batch.size} data sets. {result.search_summary(d)}\n{families}\nPareto k-hat over "
              f"the data sets: median {np.median(khat):.2f}, max {np.max(khat):.2f}; "
              f"{int(np.sum(~np.asarray(d['trusted'])))} not trusted (see diagnostics()['verdict']).")
        return
    samples = result.get_samples()
    if result.num_samples < 2:  # numpyro's summary asserts at least two draws
        raise ValueError(f"print_summary needs at least 2 draws, and this fit has num_samples={result.num_samples}: "
                         "pass num_samples >= 2 to LaplaceMatching (each site's matched family is in "
                         "lm.posterior without draws).")
    if exclude_deterministic:
        samples = {s.name: samples[s.name] for s in sites}
    empty = sorted(k for k, v in samples.items() if np.size(v) == 0)  # numpyro's summary cannot reshape them
    numpyro_print_summary({k: v for k, v in samples.items() if k not in empty}, prob=prob, group_by_chain=False)
    if empty:
        print(f"No entries (zero-size sites, left out above): {', '.join(empty)}.")
    print(f"n_eff and r_hat describe the {result.num_samples} draws, which are independent (about "
          f"{result.num_samples} and 1 by construction), not the approximation: see 'Did it work?' below.")
    if result.trail is not None:
        print("Auto-pilot: " + " -> ".join(a.line() for a in result.trail))
    print(
        f"{result.search_summary(d)}\nNegative Hessian eigenvalues in [{d['hessian_min_eigenvalue']:.3g}, "
        f"{d['hessian_max_eigenvalue']:.3g}], condition number {d['hessian_condition_number']:.3g}.\n"
        f"{families}\nDid it work? Pareto smoothed importance sampling of log p - log q over "
        f"{d['num_diagnostic_samples']} draws (importance ESS {d['psis_ess']:.0f}): {d['verdict']}"
    )
