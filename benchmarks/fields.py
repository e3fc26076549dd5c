"""Latent Markov fields (issue 43): a time series, a random walk and an areal field.

- ``ar1``: an AR(1) trend under Poisson counts, written with ``scan``:
  ``y_t ~ Poisson(exp(mu + f_t))``, ``f_t ~ N(rho f_{t-1}, sigma)``, ``mu ~ N(0, 2)``,
  ``rho ~ Uniform(-1, 1)``, ``sigma ~ HalfNormal(1)``; simulated with ``mu = 1``,
  ``rho = 0.85``, ``sigma = 0.4``.
- ``rw``: a binary series on a ``GaussianRandomWalk`` trend:
  ``y_t ~ Bernoulli(logit = b + f_t)``, ``f ~ GaussianRandomWalk(s)``, ``s ~ HalfNormal(1)``,
  ``b ~ N(0, 2)``; simulated with ``s = 0.1``, ``b = 0.3``.
- ``car``: Poisson counts over a k x k grid of regions with a sparse CAR field:
  ``y_i ~ Poisson(exp(b0 + phi_i))``, ``phi ~ CAR(0, alpha, tau, W, is_sparse=True)`` (W the
  grid's four-neighbour adjacency), ``b0 ~ N(0, 2)``, ``tau ~ Gamma(2, 1)``,
  ``alpha ~ Uniform(0, 0.99)``; simulated with ``b0 = 1``, ``tau = 2``, ``alpha = 0.9``.

For each model and size, in a fresh process: LM's default call (``LaplaceMatching(model).run``
+ draws + verdict) cold and warm (median of :data:`WARM_REPEATS` new keys at the smallest size,
one beyond), its auto-pilot trail and verdict, its peak resident memory; at the smallest size
NUTS (1 chain, :data:`NUM_WARMUP` + :data:`NUM_SAMPLES`) cold and warm on the same model, and
LM's hyperparameter means against NUTS's in NUTS SDs (the chain continued, untimed, to
:data:`REFERENCE_DRAWS` draws; its Monte Carlo error ``1 / sqrt(ESS)`` beside them); at every size whether the simulated hyperparameters lie within
three of LM's SDs. The fields' Hessians are banded (``numpyro_lm/mode/banded_hessian.py``).
``python benchmarks/fields.py [model:size ...]`` writes ``benchmarks/results/fields.md`` and the
table in ``docs/fields.md``.
"""

import json
import os
import resource
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

NUM_WARMUP, NUM_SAMPLES, WARM_REPEATS = 500, 2000, 3
REFERENCE_DRAWS = 20_000
"""Draws of the accuracy reference: the timed chain continued, untimed (2000 draws left a Monte
Carlo error of 0.15 SD on the AR(1)'s level, as large as the gaps to be measured)."""


def ar1_counts(y):
    """``ar1`` (module docstring)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    rho = numpyro.sample("rho", dist.Uniform(-1.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))

    def step(prev, _):
        f = numpyro.sample("f", dist.Normal(rho * prev, sigma))
        return f, f

    _, f = scan(step, 0.0, None, length=y.shape[0])
    numpyro.sample("y", dist.Poisson(jnp.exp(mu + f)), obs=y)


TRUTH = {"mu": 1.0, "rho": 0.85, "sigma": 0.4}


def ar1_data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    f, prev = np.zeros(n), 0.0
    for t in range(n):
        prev = TRUTH["rho"] * prev + TRUTH["sigma"] * rng.normal()
        f[t] = prev
    return rng.poisson(np.exp(TRUTH["mu"] + f)).astype(np.float32)


def rw_binary(y):
    """``rw`` (module docstring)."""
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    f = numpyro.sample("f", dist.GaussianRandomWalk(s, num_steps=y.shape[0]))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    numpyro.sample("y", dist.Bernoulli(logits=b + f), obs=y)


RW_TRUTH = {"s": 0.1, "b": 0.3}


def rw_data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    f = np.cumsum(RW_TRUTH["s"] * rng.normal(size=n))
    return (rng.uniform(size=n) < 1 / (1 + np.exp(-(RW_TRUTH["b"] + f)))).astype(np.float32)


def car_poisson(adj, y):
    """``car`` (module docstring)."""
    b0 = numpyro.sample("b0", dist.Normal(0.0, 2.0))
    tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
    alpha = numpyro.sample("alpha", dist.Uniform(0.0, 0.99))
    phi = numpyro.sample("phi", dist.CAR(0.0, alpha, tau, adj, is_sparse=True))
    numpyro.sample("y", dist.Poisson(jnp.exp(b0 + phi)), obs=y)


CAR_TRUTH = {"b0": 1.0, "tau": 2.0, "alpha": 0.9}


def grid_adjacency(k: int) -> np.ndarray:
    """The four-neighbour adjacency of a k x k grid, regions numbered row by row."""
    index = np.arange(k * k).reshape(k, k)
    adj = np.zeros((k * k, k * k), np.float32)
    adj[index[:, :-1].ravel(), index[:, 1:].ravel()] = adj[index[:-1].ravel(), index[1:].ravel()] = 1.0
    return adj + adj.T


def car_data(k: int, seed: int = 0):
    """``(adjacency, counts)`` over a k x k grid (the field drawn from the CAR prior itself)."""
    adj = grid_adjacency(k)
    prior = dist.CAR(0.0, CAR_TRUTH["alpha"], CAR_TRUTH["tau"], adj)
    phi = np.asarray(prior.sample(jax.random.PRNGKey(seed)))
    return adj, np.random.default_rng(seed).poisson(np.exp(CAR_TRUTH["b0"] + phi)).astype(np.float32)


# name: (model, data(size) -> args, truth, sizes, the latent values at a size, the size's words)
MODELS = {
    "ar1": (ar1_counts, lambda n: (ar1_data(n),), TRUTH, (200, 2000, 10_000, 100_000), lambda n: n,
            "AR(1) Poisson, n = {:,}"),
    "rw": (rw_binary, lambda n: (rw_data(n),), RW_TRUTH, (200, 2000, 10_000), lambda n: n,
           "random walk, binary, n = {:,}"),
    "car": (car_poisson, car_data, CAR_TRUTH, (20, 50), lambda k: k * k, "CAR Poisson, {0} x {0} grid"),
}


def _lm(lm, args, seed):
    start = time.perf_counter()
    lm.run(jax.random.PRNGKey(seed), *args)
    samples = jax.block_until_ready(lm.get_samples())
    return time.perf_counter() - start, samples, lm.diagnostics()


def _nuts(model, args, out):
    mcmc = MCMC(NUTS(model), num_warmup=NUM_WARMUP, num_samples=NUM_SAMPLES, progress_bar=False)
    times = []
    for seed in (1, 2):
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed), *args)
        draws = jax.block_until_ready(mcmc.get_samples())
        times.append(time.perf_counter() - start)
    out["nuts_cold"], out["nuts_warm"] = times
    chunks = [draws]
    for _ in range(REFERENCE_DRAWS // NUM_SAMPLES - 1):  # the same chain continued, untimed
        mcmc.post_warmup_state = mcmc.last_state
        mcmc.run(mcmc.post_warmup_state.rng_key, *args)
        chunks.append(mcmc.get_samples())
    out["gap"] = {}
    for k in out["lm"]:
        d = np.concatenate([np.asarray(c[k]) for c in chunks])
        out["gap"][k] = (float(abs(out["lm"][k][0] - d.mean()) / d.std()),
                         float(1 / np.sqrt(effective_sample_size(d[None]))))


def assess(name: str, size: int, warm: bool = True) -> dict:
    """One model and size, in this process (``--one name size``; ``--one name size cold``: no warm call)."""
    warnings.simplefilter("ignore")
    model, data, truth, sizes, latent, _ = MODELS[name]
    args = data(size)
    lm = LaplaceMatching(model, progress_bar=False)
    cold, samples, diagnostics = _lm(lm, args, 0)
    smallest = size == sizes[0]
    repeats = WARM_REPEATS if smallest else 1  # a long field's call takes up to a minute
    warm = float(np.median([_lm(lm, args, k)[0] for k in range(1, repeats + 1)])) if warm else None
    out = {"model": name, "size": size, "latent": latent(size), "lm_cold": cold, "lm_warm": warm,
           "trusted": bool(diagnostics["trusted"]),
           "memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "trail": " -> ".join(f"{t['candidate']} {'ok' if t['trusted'] else 'x'}" for t in diagnostics["trail"]),
           "lm": {k: (float(np.mean(samples[k])), float(np.std(samples[k]))) for k in truth}}
    out["truth_inside"] = all(abs(out["lm"][k][0] - v) <= 3 * out["lm"][k][1] for k, v in truth.items())
    if smallest:
        _nuts(model, args, out)
    return out


def row(r: dict) -> str:
    words = MODELS[r["model"]][5].format(r["size"])
    lm = " / ".join(f"{k} {m:.3f} +- {s:.3f}" for k, (m, s) in r["lm"].items())
    if "nuts_cold" in r:
        worst = max(r["gap"], key=lambda k: r["gap"][k][0])
        nuts = (f"{r['nuts_cold']:.1f} / {r['nuts_warm']:.1f} | {r['nuts_cold'] / r['lm_cold']:.2f} | "
                f"{r['nuts_warm'] / r['lm_warm']:.2f} | {r['gap'][worst][0]:.2f} ({worst}; MC error "
                f"{r['gap'][worst][1]:.2f})")
    else:
        nuts = "- | - | - | -"
    warm = "-" if r["lm_warm"] is None else f"{r['lm_warm']:.2f}"
    return (f"| {words} | {r['latent']:,} | {r['lm_cold']:.1f} / {warm} | {r['memory_mb']:,.0f} | {nuts} | "
            f"{r['trusted']} | {r['trail']} | {lm} | {r['truth_inside']} |")


def main(cases):
    lines = [environment() + f". Each row in a fresh process; LM warm: median of {WARM_REPEATS} calls at a model's "
             f"smallest size, one beyond; memory: the process's peak resident set; NUTS: 1 chain, {NUM_WARMUP} "
             f"warm-up + {NUM_SAMPLES} draws at the smallest size, cold and again (warm); x: NUTS's time over LM's; "
             "gap: the worst hyperparameter's |mean LM - mean NUTS| / sd NUTS, against the second chain continued "
             f"(untimed) to {REFERENCE_DRAWS} draws, with its Monte Carlo error 1 / sqrt(ESS) in the same units; truth: every simulated hyperparameter within 3 of LM's posterior "
             "SDs.", "",
             "| model | latent values | LM cold / warm s | peak MB | NUTS cold / warm s | cold x | warm x | "
             "gap (NUTS SD) | trusted | auto-pilot | hyperparameters (LM) | truth inside |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name, size in cases:
        done = subprocess.run([sys.executable, __file__, "--one", name, str(size)], capture_output=True, text=True)
        if done.returncode != 0:
            lines.append(f"| {MODELS[name][5].format(size)} | error: {done.stderr.strip().splitlines()[-1][:200]} |")
        else:
            lines.append(row(json.loads(done.stdout.strip().splitlines()[-1])))
        print(lines[-1], flush=True)
    if cases == ALL:
        write_results("fields", "\n".join(lines), "fields.md")


ALL = [(name, size) for name, spec in MODELS.items() for size in spec[3]]

if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(assess(sys.argv[2], int(sys.argv[3]), warm=sys.argv[4:5] != ["cold"])))
    else:
        main([(a.split(":")[0], int(a.split(":")[1])) for a in sys.argv[1:]] or ALL)
