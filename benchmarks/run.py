"""LM against NUTS, side by side in one process: wall-time ratios and accuracy.

For each model:
- cold: the first call, compilation included (LM ``run`` + ``get_samples`` against the
  first ``MCMC.run`` of NUTS, 1 chain, 1000 warmup + 1000 draws);
- warm: a second call with the same shapes (median of repeats for LM);
- accuracy: per coordinate, |LM mean - NUTS mean| / NUTS sd and LM sd / NUTS sd, the
  worst coordinate shown (NUTS has ~0.03 sd Monte Carlo error in its means here).

LM runs first in the process, so it pays JAX's one-off start-up costs: the cold ratio
is conservative. Run with ``make bench`` (or ``python benchmarks/run.py [model ...]``).
"""

import os
import sys
import time

import jax
import numpy as np
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, os.path.dirname(__file__))
from models import MODELS  # noqa: E402
from report import environment, write_results  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - t0, out


def flat_draws(samples, names):
    return np.concatenate([np.asarray(samples[k]).reshape(len(samples[k]), -1) for k in names], axis=1)


def bench(name, repeats=20):
    model, args, kwargs = MODELS[name]()
    lm = LaplaceMatching(model, progress_bar=False)
    lm_cold, _ = timed(lambda: lm.run(jax.random.PRNGKey(0), *args, **kwargs).get_samples())
    lm_warm = np.median([
        timed(lambda i=i: lm.run(jax.random.PRNGKey(i), *args, **kwargs).get_samples())[0]
        for i in range(1, repeats + 1)
    ])

    mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, progress_bar=False, jit_model_args=True)
    nuts_cold, _ = timed(lambda: (mcmc.run(jax.random.PRNGKey(0), *args, **kwargs), mcmc.get_samples())[1])
    nuts_warm, ref = timed(lambda: (mcmc.run(jax.random.PRNGKey(1), *args, **kwargs), mcmc.get_samples())[1])

    names = [s.name for s in lm.layout.sites]
    ref_flat = flat_draws(ref, names)
    lm_flat = flat_draws(lm.get_samples(), names)
    ref_sd = ref_flat.std(0)
    mean_err = np.max(np.abs(lm_flat.mean(0) - ref_flat.mean(0)) / ref_sd)
    sd_ratio = lm_flat.std(0) / ref_sd
    worst_sd = sd_ratio[np.argmax(np.abs(np.log(sd_ratio)))]
    return {
        "model": name,
        "dim": lm.layout.size,
        "lm_cold_s": lm_cold,
        "nuts_cold_s": nuts_cold,
        "cold_ratio": nuts_cold / lm_cold,
        "lm_warm_ms": 1e3 * lm_warm,
        "nuts_warm_s": nuts_warm,
        "warm_ratio": nuts_warm / lm_warm,
        "worst_mean_err_sd": mean_err,
        "worst_sd_ratio": worst_sd,
    }


def main(names):
    lines = [
        environment(),
        "",
        "| model | D | LM cold s | NUTS cold s | cold x | LM warm ms | NUTS warm s | warm x | worst mean err / sd | "
        "worst sd ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for name in names:
        r = bench(name)
        lines.append(f"| {r['model']} | {r['dim']} | {r['lm_cold_s']:.2f} | {r['nuts_cold_s']:.2f} | "
                     f"{r['cold_ratio']:.1f} | {r['lm_warm_ms']:.2f} | {r['nuts_warm_s']:.2f} | "
                     f"{r['warm_ratio']:.0f} | {r['worst_mean_err_sd']:.2f} | {r['worst_sd_ratio']:.2f} |")
        print(lines[-1], flush=True)
    if set(names) == set(MODELS):  # a partial run does not replace the table
        write_results("run", "\n".join(lines), "benchmarks.md")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
