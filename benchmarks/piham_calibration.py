"""Calibration of PIHAM's membership intervals by three methods on networks drawn from
PIHAM's own prior (``prior_network``, N = 20 directed nodes, K = 3; Bernoulli, Poisson and
Gaussian layers, a categorical attribute; three draws), where the exact posterior's 90%
intervals cover the truth 90% of the time on average:

- **LM**: ``fit_piham`` (joint Laplace at the MAP, logistic-normal intervals per node);
- **NUTS**: ``MCMC(NUTS(piham_model))``, 300 warm-up, 700 draws, started at the MAP;
- **LaplaceNUTS**: ``LaplaceNUTS(piham_model, marginalize=["U", "V"])``: NUTS over the layer
  affinities ``W`` and attribute loadings ``H`` on the Laplace marginal, the memberships
  drawn from their conditional Gaussian; 150 warm-up, 250 draws, started at the MAP (about one
  second per iteration on two cores: its inner Hessian over the 120 memberships is dense and
  differentiated once more for the log-determinant's gradient).

The joint Gaussian misses the ridge along which memberships and affinities trade off
(``benchmarks/piham.py``, calibration (c): given the true ``W`` and ``H`` the per-node
intervals are calibrated); sampling ``W`` and ``H`` exactly puts it back. ``U`` and ``V``
pooled; columns relabelled to the truth once, by the LM medians.

``python benchmarks/piham_calibration.py`` writes ``benchmarks/results/piham_calibration.md``
and the table in ``docs/networks.md``.
"""

import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import environment, write_results  # noqa: E402

from numpyro.infer import MCMC, NUTS, init_to_value  # noqa: E402

from numpyro_lm import LaplaceNUTS  # noqa: E402
from numpyro_lm.contrib.networks import fit_piham, piham_model, prior_network  # noqa: E402
from numpyro_lm.contrib.networks import metrics as M  # noqa: E402
from numpyro_lm.contrib.networks.model import as_arrays  # noqa: E402

NUM_NODES, DRAWS, CREDIBILITY = 20, (0, 1, 2), 0.9


def _coverage_of_draws(samples, fit, g):
    out = []
    for site, mem, truth in (("U", fit.U, g.u), ("V", fit.V, g.v)):
        p = np.asarray(jax.nn.softmax(samples[site], -1))
        tail = (1 - CREDIBILITY) / 2
        lo, hi = np.quantile(p, tail, 0), np.quantile(p, 1 - tail, 0)
        out.append(M.coverage(lo, hi, truth, M.align(mem.median, truth)))
    return float(np.mean(out))


def one_draw(seed):
    g, _ = prior_network(NUM_NODES, 3, seed=seed)
    net = as_arrays(g.network)
    start = time.perf_counter()
    fit = fit_piham(g.network, 3, seed=seed)
    row = dict(seed=seed, lm_seconds=time.perf_counter() - start)
    row["lm"] = float(np.mean([M.coverage(m.lower, m.upper, truth, M.align(m.median, truth))
                               for m, truth in ((fit.U, g.u), (fit.V, g.v))]))
    runs = (("nuts", NUTS(piham_model, init_strategy=init_to_value(values=fit.params)), 300, 700),
            ("lnuts", LaplaceNUTS(piham_model, marginalize=["U", "V"], init_strategy=init_to_value(values=fit.params)),
             150, 250))
    for name, kernel, warmup, samples in runs:
        mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, progress_bar=False)
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed), net, 3)
        draws = jax.block_until_ready(mcmc.get_samples())
        row[f"{name}_seconds"] = time.perf_counter() - start
        row[name] = _coverage_of_draws(draws, fit, g)
        print(seed, name, row[name], f"{row[f'{name}_seconds']:.0f} s", flush=True)
    print(row, flush=True)
    return row


def write(rows):
    """The table of the draws done so far (written after each: a draw takes minutes)."""
    lines = [environment() + f". Prior draws, N = {NUM_NODES}, K = 3; coverage of the true memberships by the "
             f"{CREDIBILITY:.0%} intervals (`U` and `V` pooled, {2 * NUM_NODES * 3} entries per draw).", "",
             "| prior draw | LM (joint Laplace) | NUTS | LaplaceNUTS | s LM | s NUTS | s LaplaceNUTS |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['lm']:.3f} | {r['nuts']:.3f} | {r['lnuts']:.3f} | {r['lm_seconds']:.0f} | "
                     f"{r['nuts_seconds']:.0f} | {r['lnuts_seconds']:.0f} |")
    mean = {k: np.mean([r[k] for r in rows]) for k in ("lm", "nuts", "lnuts")}
    lines.append(f"| mean | {mean['lm']:.3f} | {mean['nuts']:.3f} | {mean['lnuts']:.3f} | | | |")
    table = "\n".join(lines)
    print(table, flush=True)
    write_results("piham_calibration", table, "networks.md")


def main():
    rows = []
    for seed in DRAWS:
        rows.append(one_draw(seed))
        write(rows)


if __name__ == "__main__":
    main()
