"""MVI refinement on the benchmark models: its cost and what it buys.

For each model, side by side in one process (float32, 2-core CPU):
- time: a compiled (second) joint fit (``strategy="laplace"``) with ``refine=None`` and with
  each refinement (the MVI variants: 1000 fixed draws, up to 200 L-BFGS iterations;
  ``"dadvi"``: 300 fixed draws, Newton), draws included, as a multiple of the plain fit;
- accuracy: the 1-Wasserstein distance between each coordinate's LM draws and a long
  NUTS run (2 chains x 4000 draws, started from LM with its covariance as mass matrix),
  in units of the NUTS SD, averaged over the coordinates (lower is better).
Run with ``python benchmarks/refine.py [model ...]`` (part of ``make bench``); a run over
all the models writes ``benchmarks/results/refine.md`` and the table in ``docs/refine.md``.
"""

import os
import sys
import time
import warnings

import jax
import numpy as np
from numpyro.infer import MCMC
from scipy.stats import wasserstein_distance

sys.path.insert(0, os.path.dirname(__file__))
from models import MODELS  # noqa: E402
from report import environment, write_results  # noqa: E402

from numpyro_lm import LaplaceMatching, NotTrustedWarning  # noqa: E402
from numpyro_lm.samplers import warm_nuts  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)
METHODS = (None, "mean", "eig", "lowrank", "diag", "dadvi")


def flat(samples, names):
    return np.concatenate([np.asarray(samples[n]).reshape(len(samples[n]), -1) for n in names], axis=1)


def reference(model, args, kwargs):
    lm = LaplaceMatching(model, progress_bar=False).run(jax.random.PRNGKey(0), *args, **kwargs)
    warm = warm_nuts(lm)
    init = {k: np.broadcast_to(v, (2,) + v.shape) for k, v in warm.init_params.items()}
    mcmc = MCMC(warm.kernel, num_warmup=300, num_samples=4000, num_chains=2, chain_method="sequential",
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), *args, init_params=init, **kwargs)
    return mcmc.get_samples(), [s.name for s in lm.layout.sites]


def bench(name) -> str:
    model, args, kwargs = MODELS[name]()
    ref, names = reference(model, args, kwargs)
    ref_flat = flat(ref, names)
    sd = ref_flat.std(0)
    rows = {}
    for method in METHODS:
        # refine=None: the plain joint fit (the default call would choose its own candidate)
        lm = LaplaceMatching(model, refine=method, num_samples=4000, progress_bar=False, strategy="laplace")
        lm.run(jax.random.PRNGKey(2), *args, **kwargs)  # compiles
        times = []
        for i in range(5):
            t0 = time.perf_counter()
            jax.block_until_ready(lm.run(jax.random.PRNGKey(3 + i), *args, **kwargs).get_samples())
            times.append(time.perf_counter() - t0)
        draws = flat(lm.get_samples(), names)
        w1 = np.mean([wasserstein_distance(draws[:, j], ref_flat[:, j]) / sd[j] for j in range(sd.size)])
        rows[method] = (np.median(times), w1)
    base = rows[None][0]
    cells = [f"{rows[m][1]:.3f} ({rows[m][0] / base:.1f}x)" for m in METHODS]
    return f"| {name} | {1e3 * base:.1f} | " + " | ".join(cells) + " |"


def main(names):
    warnings.simplefilter("ignore", NotTrustedWarning)  # the plain fits are compared, whatever their verdict
    lines = [
        environment() + ". Mean 1-Wasserstein distance to NUTS per coordinate, in NUTS SDs (the compiled fit's time, "
        "draws included, as a multiple of the plain fit's). MVI variants: 1000 fixed draws, L-BFGS; DADVI: "
        "300 fixed draws, Newton.",
        "",
        "| model | plain fit ms | Laplace | MVI_mu | MVI_eig | MVI_lr | VI_diag | DADVI |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for name in names:
        lines.append(bench(name))
        print(lines[-1], flush=True)
    if set(names) == set(MODELS):  # a partial run does not replace the table
        write_results("refine", "\n".join(lines), "refine.md")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
