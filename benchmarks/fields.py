"""Latent Markov fields (issue 43): an AR(1) trend under Poisson counts, written with ``scan``.

``y_t ~ Poisson(exp(mu + f_t))``, ``f_t ~ N(rho f_{t-1}, sigma)``, ``mu ~ N(0, 2)``,
``rho ~ Uniform(-1, 1)``, ``sigma ~ HalfNormal(1)``; data simulated with ``mu = 1``,
``rho = 0.85``, ``sigma = 0.4``. For each length ``n``, in a fresh process: LM's default call
(``LaplaceMatching(model).run`` + draws + verdict) cold and warm (median of
:data:`WARM_REPEATS` new keys where NUTS runs, one beyond), its auto-pilot trail and verdict; up to :data:`NUTS_MAX` NUTS
(1 chain, :data:`NUM_WARMUP` + :data:`NUM_SAMPLES`) cold and warm, and LM's hyperparameter
means against NUTS's in NUTS SDs (the chain's Monte Carlo error ``1 / sqrt(ESS)`` beside them);
at every length whether the simulated ``rho`` and ``sigma`` lie within three of LM's SDs.

The field's Hessian is tridiagonal (an AR(1)): the nested fit reads it as a band
(``numpyro_lm/mode/banded_hessian.py``). ``python benchmarks/fields.py [n ...]`` writes
``benchmarks/results/fields.md`` and the table in ``docs/nested.md``.
"""

import json
import os
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.contrib.control_flow import scan
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import environment, write_results  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402

SIZES = (200, 2000, 10_000)
NUTS_MAX = 200
"""NUTS runs up to this length (a scan over 2000 steps takes NUTS most of an hour here)."""
NUM_WARMUP, NUM_SAMPLES, WARM_REPEATS = 500, 2000, 3
TRUTH = {"mu": 1.0, "rho": 0.85, "sigma": 0.4}
HYPER = ("mu", "rho", "sigma")


def ar1_counts(y):
    """The model (module docstring)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    rho = numpyro.sample("rho", dist.Uniform(-1.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))

    def step(prev, _):
        f = numpyro.sample("f", dist.Normal(rho * prev, sigma))
        return f, f

    _, f = scan(step, 0.0, None, length=y.shape[0])
    numpyro.sample("y", dist.Poisson(jnp.exp(mu + f)), obs=y)


def ar1_data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    f, prev = np.zeros(n), 0.0
    for t in range(n):
        prev = TRUTH["rho"] * prev + TRUTH["sigma"] * rng.normal()
        f[t] = prev
    return rng.poisson(np.exp(TRUTH["mu"] + f)).astype(np.float32)


def _lm(lm, y, seed):
    start = time.perf_counter()
    lm.run(jax.random.PRNGKey(seed), y)
    samples = jax.block_until_ready(lm.get_samples())
    return time.perf_counter() - start, samples, lm.diagnostics()


def assess(n: int) -> dict:
    """One length, in this process (``--one n``)."""
    warnings.simplefilter("ignore")
    y = ar1_data(n)
    lm = LaplaceMatching(ar1_counts, progress_bar=False)
    cold, samples, diagnostics = _lm(lm, y, 0)
    repeats = WARM_REPEATS if n <= NUTS_MAX else 1  # a long series' call takes a minute
    warm = float(np.median([_lm(lm, y, k)[0] for k in range(1, repeats + 1)]))
    out = {"n": n, "lm_cold": cold, "lm_warm": warm, "trusted": bool(diagnostics["trusted"]),
           "trail": " -> ".join(f"{t['candidate']} {'ok' if t['trusted'] else 'x'}" for t in diagnostics["trail"]),
           "lm": {k: (float(np.mean(samples[k])), float(np.std(samples[k]))) for k in HYPER}}
    out["truth_inside"] = all(abs(out["lm"][k][0] - TRUTH[k]) <= 3 * out["lm"][k][1] for k in ("rho", "sigma"))
    if n <= NUTS_MAX:
        mcmc = MCMC(NUTS(ar1_counts), num_warmup=NUM_WARMUP, num_samples=NUM_SAMPLES, progress_bar=False)
        times = []
        for seed in (1, 2):
            start = time.perf_counter()
            mcmc.run(jax.random.PRNGKey(seed), y)
            draws = jax.block_until_ready(mcmc.get_samples())
            times.append(time.perf_counter() - start)
        out["nuts_cold"], out["nuts_warm"] = times
        gaps = {}
        for k in HYPER:
            d = np.asarray(draws[k])
            gaps[k] = (abs(out["lm"][k][0] - d.mean()) / d.std(), 1 / np.sqrt(effective_sample_size(d[None])))
        out["gap"] = {k: (float(a), float(b)) for k, (a, b) in gaps.items()}
    return out


def row(r: dict) -> str:
    lm = " / ".join(f"{r['lm'][k][0]:.3f} +- {r['lm'][k][1]:.3f}" for k in HYPER)
    if "nuts_cold" in r:
        worst = max(r["gap"], key=lambda k: r["gap"][k][0])
        nuts = (f"{r['nuts_cold']:.1f} / {r['nuts_warm']:.1f} | {r['nuts_cold'] / r['lm_cold']:.1f} | "
                f"{r['nuts_warm'] / r['lm_warm']:.1f} | {r['gap'][worst][0]:.2f} ({worst}; MC error "
                f"{r['gap'][worst][1]:.2f})")
    else:
        nuts = "- | - | - | -"
    return (f"| {r['n']:,} | {r['lm_cold']:.1f} / {r['lm_warm']:.2f} | {nuts} | {r['trusted']} | {r['trail']} | "
            f"{lm} | {r['truth_inside']} |")


def main(sizes):
    lines = [environment() + f". Each length in a fresh process; LM warm: median of {WARM_REPEATS} calls (one beyond n = {NUTS_MAX}); NUTS: 1 "
             f"chain, {NUM_WARMUP} warm-up + {NUM_SAMPLES} draws, up to n = {NUTS_MAX}, cold and again (warm); "
             "gap: the worst hyperparameter's |mean LM - mean NUTS| / sd NUTS, with the chain's Monte Carlo error "
             "1 / sqrt(ESS) in the same units; truth: the simulated rho and sigma within 3 of LM's posterior SDs.", "",
             "| n | LM cold / warm s | NUTS cold / warm s | cold x | warm x | gap (NUTS SD) | trusted | auto-pilot | "
             "mu / rho / sigma (LM) | truth inside |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for n in sizes:
        done = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True, text=True)
        if done.returncode != 0:
            lines.append(f"| {n:,} | error: {done.stderr.strip().splitlines()[-1][:200]} |")
        else:
            lines.append(row(json.loads(done.stdout.strip().splitlines()[-1])))
        print(lines[-1], flush=True)
    if tuple(sizes) == SIZES:
        write_results("fields", "\n".join(lines), "nested.md")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(assess(int(sys.argv[2]))))
    else:
        main([int(a) for a in sys.argv[1:]] or SIZES)
