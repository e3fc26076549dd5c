"""LaplaceNUTS against NUTS on the 1000-group logistic GLMM: warm wall-clock times taken in
turns (issue 23's "faster than NUTS, 1 chain, 500 + 500").

``benchmarks/laplace_nuts.py`` times each method once warm, one after the other; on a shared
machine whose speed drifts by 10-20% over minutes that order can decide a close race. Here
the two run in turns on the same data, each warm (its first, compiling run is made first and
not counted), ``PAIRS`` times, and the table gives each pair's times, their ratio and the
median ratio. A warm run includes compiling the sampling loop: NumPyro's ``MCMC.run``
compiles it again at every call (0.22).

``python benchmarks/laplace_nuts_timing.py`` writes ``benchmarks/results/laplace_nuts_timing.md``
and the table in ``docs/samplers.md``.
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import environment, write_results  # noqa: E402
from scale import glmm, glmm_data  # noqa: E402

from numpyro_lm import LaplaceNUTS  # noqa: E402

NUM_GROUPS, NUM_WARMUP, NUM_SAMPLES, PAIRS = 1000, 500, 500, 5


def _timed(mcmc, seed, args, kwargs):
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), *args, **kwargs)
    sigma = jax.block_until_ready(mcmc.get_samples()["sigma"])
    return time.perf_counter() - start, float(np.mean(sigma))


def main():
    args, kwargs, _ = glmm_data(NUM_GROUPS)
    args, kwargs = (jnp.asarray(args[0]), jnp.asarray(args[1]), args[2]), {"y": jnp.asarray(kwargs["y"])}
    runs = {name: MCMC(kernel, num_warmup=NUM_WARMUP, num_samples=NUM_SAMPLES, progress_bar=False)
            for name, kernel in (("NUTS", NUTS(glmm)), ("LaplaceNUTS", LaplaceNUTS(glmm)))}
    cold = {name: _timed(mcmc, 0, args, kwargs)[0] for name, mcmc in runs.items()}
    lines = [environment() + f". Logistic GLMM, {NUM_GROUPS} groups of 20 observations (benchmarks/scale.py), 1 "
             f"chain, {NUM_WARMUP} warm-up + {NUM_SAMPLES} draws; warm runs in turns (seed = pair), after one cold "
             f"run each (NUTS {cold['NUTS']:.1f} s, LaplaceNUTS {cold['LaplaceNUTS']:.1f} s).", "",
             "| pair | NUTS s | LaplaceNUTS s | LaplaceNUTS / NUTS | sigma mean NUTS | sigma mean LaplaceNUTS |",
             "|---|---|---|---|---|---|"]
    ratios = []
    for pair in range(1, PAIRS + 1):
        (nuts, nuts_sigma), (lnuts, lnuts_sigma) = (_timed(runs[n], pair, args, kwargs) for n in runs)
        ratios.append(lnuts / nuts)
        lines.append(f"| {pair} | {nuts:.1f} | {lnuts:.1f} | {ratios[-1]:.2f} | {nuts_sigma:.3f} | {lnuts_sigma:.3f} |")
        print(lines[-1], flush=True)
    lines += ["", f"Median LaplaceNUTS / NUTS warm time: {np.median(ratios):.2f} (range {min(ratios):.2f}-"
                  f"{max(ratios):.2f} over {PAIRS} pairs)."]
    table = "\n".join(lines)
    print(table)
    write_results("laplace_nuts_timing", table, "samplers.md")


if __name__ == "__main__":
    main()
