"""The published "Poisson GLM with an iid random effect": LaplaceMatching's default call against
NUTS, side by side in one process per size (issue 42's benchmark).

The model (K. Morrison's INLA tutorial; M. Modrak's Stan-vs-INLA rerun): ``x_i ~ N(5, 1)``,
``y_i ~ Poisson(exp(alpha + beta x_i + nu_i))``, ``nu_i ~ N(0, 1/sqrt(tau_nu))`` written
non-centred, ``alpha, beta ~ N(0, sqrt(1000))``, ``tau_nu ~ Gamma(0.01, 0.01)``; data simulated
with ``alpha = 1``, ``beta = 0.5``, ``sd(nu) = 0.1`` (``tau_nu = 100``).

For each size ``N`` a fresh process (so every cold call is a first call) times:
- LM's default call (``LaplaceMatching(model).run`` + its draws and verdict): cold (compilation
  included, into an empty persistent compilation cache: ``numpyro_lm.runtime.compilation_cache``)
  and warm (median of repeats, new keys); and in a second fresh process its cold call again, the
  programs read from the first process's cache ("cached");
- NUTS (1 chain, ``NUM_WARMUP`` warm-up + ``NUM_SAMPLES`` draws): cold, and warm (a second run),
  up to :data:`NUTS_MAX` observations;

and scores LM's draws against NUTS's (W1 / NUTS sd on ``alpha``, ``beta``, ``tau_nu``), with
LM's verdict, its k-hat and whether ``tau_nu``'s truth lies within three of LM's posterior SDs.

``python benchmarks/inla.py [N ...]`` writes ``benchmarks/results/inla.md`` and the table in
``docs/scale.md``.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import environment, write_results  # noqa: E402
from score import w1_over_sd  # noqa: E402

from numpyro_lm import LaplaceMatching, NotTrustedWarning  # noqa: E402

SIZES = (5_000, 25_000, 100_000)
NUTS_MAX = int(os.environ.get("INLA_NUTS_MAX", 25_000))
"""NUTS runs up to this N: beyond, one run takes most of an hour on 2 cores (the truth of tau_nu is
the check); ``INLA_NUTS_MAX`` sets it lower where a lent machine's minutes are few (the caption says)."""
NUM_WARMUP, NUM_SAMPLES, WARM_REPEATS = 500, 1000, 3
TAU_TRUE = 100.0
PUBLISHED = ("Published on this model: R-INLA 10.6 s at N = 5 000 and 611 s at N = 25 000, Stan 388 s and 5 808 s "
             "(M. Modrak's rerun); R-INLA 166.8 s at N = 100 000 (K. Morrison's tutorial); other machines.")


def poisson_re(x, y=None):
    """The model (module docstring)."""
    alpha = numpyro.sample("alpha", dist.Normal(0.0, jnp.sqrt(1000.0)))
    beta = numpyro.sample("beta", dist.Normal(0.0, jnp.sqrt(1000.0)))
    tau_nu = numpyro.sample("tau_nu", dist.Gamma(0.01, 0.01))
    with numpyro.plate("obs", x.shape[0]):
        nu_normalized = numpyro.sample("nu_normalized", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Poisson(jnp.exp(alpha + beta * x + nu_normalized / jnp.sqrt(tau_nu))), obs=y)


def poisson_re_data(n: int, seed: int = 0):
    """``(x, y)`` simulated with ``alpha = 1``, ``beta = 0.5``, ``sd(nu) = 0.1``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(5.0, 1.0, n).astype(np.float32)
    y = rng.poisson(np.exp(1.0 + 0.5 * x + rng.normal(0.0, 0.1, n))).astype(np.float32)
    return x, y


def _lm(x, y, seed):
    start = time.perf_counter()
    lm = LaplaceMatching(poisson_re, progress_bar=False).run(jax.random.PRNGKey(seed), x, y=y)
    samples = jax.block_until_ready(lm.get_samples())
    diagnostics = lm.diagnostics()
    return time.perf_counter() - start, lm, samples, diagnostics


def _nuts(x, y, seed):
    mcmc = MCMC(NUTS(poisson_re), num_warmup=NUM_WARMUP, num_samples=NUM_SAMPLES, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), x, y=y)
    samples = jax.block_until_ready(mcmc.get_samples())
    return time.perf_counter() - start, samples


def assess(n: int) -> dict:
    """One size, in this process: LM cold and warm, NUTS cold and warm, the scores."""
    warnings.simplefilter("ignore", NotTrustedWarning)  # the verdict is a column of the table
    x, y = poisson_re_data(n)
    x, y = jnp.asarray(x), jnp.asarray(y)
    lm_cold, lm, samples, d = _lm(x, y, 0)
    lm_warm = float(np.median([_lm(x, y, seed)[0] for seed in range(1, WARM_REPEATS + 1)]))
    tau = lm.posterior["tau_nu"]
    out = dict(n=n, lm_cold=lm_cold, lm_warm=lm_warm, trusted=bool(d["trusted"]), pareto_k=float(d["pareto_k"]),
               trail=[a["candidate"] for a in d["trail"]], tau_lm=(float(tau.mean), float(np.sqrt(tau.variance))))
    if n > NUTS_MAX:
        return out
    nuts_cold, nuts = _nuts(x, y, 0)
    nuts_warm, _ = _nuts(x, y, 1)
    sites = ("alpha", "beta", "tau_nu")
    scores = w1_over_sd({s: samples[s] for s in sites}, {s: nuts[s] for s in sites})
    return dict(out, nuts_cold=nuts_cold, nuts_warm=nuts_warm, w1={s: float(scores[s][0]) for s in sites},
                tau_nuts=(float(np.mean(nuts["tau_nu"])), float(np.std(nuts["tau_nu"]))))


def cold_only(n: int) -> dict:
    """LM's cold call alone (the second process of :func:`assess_fresh`)."""
    warnings.simplefilter("ignore", NotTrustedWarning)
    x, y = poisson_re_data(n)
    return {"lm_cached": _lm(jnp.asarray(x), jnp.asarray(y), 0)[0]}


def _fresh(flag: str, n: int, cache: str) -> dict:
    env = {**os.environ, "NUMPYRO_LM_COMPILATION_CACHE": cache}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), flag, str(n)], capture_output=True, text=True,
                         env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"n": n, "error": f"the process failed (exit {out.returncode}): {out.stderr[-500:]}"}
    return json.loads(lines[-1])


def assess_fresh(n: int) -> dict:
    """:func:`assess` in a fresh process with an empty compilation cache, then :func:`cold_only` in
    another that reads it."""
    with tempfile.TemporaryDirectory() as cache:
        out = _fresh("--one", n, cache)
        if "error" in out:
            return out
        second = _fresh("--cold-only", n, cache)
        return {**out, **({} if "error" in second else second)}


def row(r: dict) -> str:
    if "error" in r:
        return f"| {r['n']:,} | raised: {' '.join(r['error'].replace('|', '/').split())[:300]} |" + " - |" * 10
    (tau, tau_sd), inside = r["tau_lm"], abs(r["tau_lm"][0] - TAU_TRUE) <= 3 * r["tau_lm"][1]
    cached = f"{r['lm_cached']:.1f}" if "lm_cached" in r else "-"
    lm = (f"| {r['n']:,} | {r['lm_cold']:.1f} / {cached} / {r['lm_warm']:.1f} | ", f"{r['trusted']} | {r['pareto_k']:.2f} | "
          f"{' -> '.join(r['trail'])} | ", f"{tau:.1f} +- {tau_sd:.1f} ({'inside' if inside else 'OUTSIDE'} 3 SD of 100)")
    if "nuts_cold" not in r:
        return f"{lm[0]}- | - | - | {lm[1]}- | {lm[2]} | - |"
    w1, (tau_nuts, tau_nuts_sd) = r["w1"], r["tau_nuts"]
    return (f"{lm[0]}{r['nuts_cold']:.1f} / {r['nuts_warm']:.1f} | {r['nuts_cold'] / r['lm_cold']:.1f} | "
            f"{r['nuts_warm'] / r['lm_warm']:.1f} | {lm[1]}{w1['alpha']:.3f} / {w1['beta']:.3f} / {w1['tau_nu']:.3f} | "
            f"{lm[2]} | {tau_nuts:.1f} +- {tau_nuts_sd:.1f} |")


def main(sizes):
    lines = [environment() + f". NUTS: 1 chain, {NUM_WARMUP} warm-up + {NUM_SAMPLES} draws, up to N = {NUTS_MAX:,}; "
             f"LM warm: median of {WARM_REPEATS} calls; each size in a fresh process; LM cached: the cold call of a "
             f"second process, its programs read from the first one's compilation cache. {PUBLISHED}", "",
             "| N | LM cold / cached / warm s | NUTS cold / warm s | cold x | warm x | trusted | k-hat | auto-pilot | "
             "W1/sd alpha / beta / tau_nu | tau_nu LM | tau_nu NUTS |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for n in sizes:
        lines.append(row(assess_fresh(n)))
        print(lines[-1], flush=True)
    if tuple(sizes) == SIZES:
        write_results("inla", "\n".join(lines), "scale.md")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(assess(int(sys.argv[2]))))
    elif sys.argv[1:2] == ["--cold-only"]:
        print(json.dumps(cold_only(int(sys.argv[2]))))
    else:
        main([int(a) for a in sys.argv[1:]] or SIZES)
