"""LaplaceNUTS against blackjax's ``laplace_hmc`` over several seeds, where one seed is not enough
to rank them (issue 23).

Both sample the same Laplace marginal of the latent GP classification's lengthscale and
amplitude (``benchmarks/suite.py``; its dense field takes no quadrature), so a difference in
one run's W1/sd (``benchmarks/laplace_nuts.py``) can be Monte Carlo error. Here each runs with
``SEEDS`` seeds (1 chain, 500 warm-up + 1000 draws, as there), scored as there: the worst W1 /
reference SD over the hyperparameters' coordinates. The table gives each method's mean over
the seeds with its standard error, and the seeds' values.
``python benchmarks/laplace_nuts_seeds.py`` writes ``benchmarks/results/laplace_nuts_seeds.md``
and the table in ``docs/samplers.md``.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from laplace_nuts import NUM_SAMPLES, _blackjax, _mcmc, _problem, _scores, _split_sites  # noqa: E402
from report import environment, write_results  # noqa: E402

from numpyro_lm import LaplaceNUTS  # noqa: E402

MODEL = "gp_classification_hyper"
SEEDS = 5


def main():
    model, args, kwargs, reference = _problem(MODEL)
    info, theta, hyper = _split_sites(model, args, kwargs)
    scores = {}
    for method in ("LaplaceNUTS", "blackjax"):
        scores[method] = []
        for seed in range(SEEDS):
            if method == "LaplaceNUTS":
                draws, _ = _mcmc(LaplaceNUTS(model), args, kwargs, NUM_SAMPLES, seeds=(seed,))
            else:
                draws, _ = _blackjax(info, theta, args, kwargs, NUM_SAMPLES, seeds=(seed,))
            scores[method].append(_scores(draws, reference, hyper, ())[0])
            print(method, seed, scores[method][-1], flush=True)
    lines = [environment() + f". {MODEL} ({', '.join(hyper)} / {', '.join(theta)}): W1/sd of the hyperparameters "
             f"(worst coordinate) against the long-NUTS reference, {SEEDS} seeds of 1 chain each.", "",
             "| method | mean W1/sd | standard error | seeds |", "|---|---|---|---|"]
    for method, values in scores.items():
        values = np.asarray(values)
        lines.append(f"| {method} | {values.mean():.3f} | {values.std(ddof=1) / np.sqrt(len(values)):.3f} | "
                     f"{', '.join(f'{v:.2f}' for v in values)} |")
    table = "\n".join(lines)
    print(table)
    write_results("laplace_nuts_seeds", table, "samplers.md")


if __name__ == "__main__":
    main()
