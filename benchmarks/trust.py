"""Can LM's answer on the suite be trusted? LM and a short NUTS run against the references.

For each model of ``benchmarks/suite.py``:

- LM: ``LaplaceMatching(model, progress_bar=False).run(PRNGKey(0), ...)`` then its draws
  (an error is reported as a string); cold = that first call (compilation included),
  warm = the median over three other keys of a compiled ``run`` + ``get_samples`` (each
  key run once untimed first: the auto-pilot may stop at another candidate for another
  key, and that candidate's first call compiles);
- NUTS: 1 chain, 1000 warmup + 1000 draws, seed 1, ``jit_model_args=True``; cold = the
  first ``run`` (+ ``get_samples``), warm = a second ``run`` of the same MCMC object;
- accuracy: the worst W1/sd coordinate (``benchmarks/score.py``) of each against the
  reference (``benchmarks/reference.py``), beside the score's noise floor (two halves of
  the reference); LM's ``diagnostics()``: ``pareto_k``, ``trusted`` and ``trail`` ("-"
  where the key does not exist).

Each model runs in a fresh Python process (after a throwaway NUTS run and LM fit of a toy
model, so neither side pays JAX's start-up): JAX keeps compiled programs for the life of a
process, and a model run after a similar one would otherwise start partly compiled (seen:
NUTS's "cold" run of the second eight-schools variant 1.5 s instead of 3.6 s).

``python benchmarks/trust.py [name ...]`` prints the table and, for a run over the whole
suite, writes it to ``benchmarks/results/trust.md``.
"""

import json
import os
import subprocess
import sys
import time
import warnings

import jax
import numpy as np
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import load_reference, reference_metadata  # noqa: E402
from score import halves, w1_over_sd, worst  # noqa: E402
from report import environment, run_table, write_results  # noqa: E402
from suite import SUITE  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GOOD, BAD = 0.10, 0.30  # W1/sd thresholds of the summary


def timed(fn):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - start, out


def cell(value) -> str:
    """A table cell: "-" for a missing value, no pipes or line breaks."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return " ".join(str(value).replace("|", "/").split())


def run_lm(model, args, kwargs) -> dict:
    lm = LaplaceMatching(model, progress_bar=False)
    try:
        cold, draws = timed(lambda: lm.run(jax.random.PRNGKey(0), *args, **kwargs).get_samples())
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        return {"error": f"{type(e).__name__}: {e}"}
    try:
        diagnostics = lm.diagnostics()
    except Exception as e:  # noqa: BLE001
        diagnostics = {"pareto_k": f"diagnostics() raised {type(e).__name__}: {e}"}
    with warnings.catch_warnings():  # the first call's warnings were shown; no repeats
        warnings.simplefilter("ignore")
        # compiled: each key's auto-pilot path once untimed (another key may stop at another
        # candidate, whose programs would otherwise compile inside the timing), then timed
        warm = []
        for i in (1, 2, 3):
            lm.run(jax.random.PRNGKey(i), *args, **kwargs)
            warm.append(timed(lambda i=i: lm.run(jax.random.PRNGKey(i), *args, **kwargs).get_samples())[0])
        warm = np.median(warm)
    trail = diagnostics.get("trail")
    if trail:  # the auto-pilot's attempts, e.g. "laplace x -> nested ok"
        trail = " -> ".join(f"{a['candidate']} {'ok' if a['trusted'] else 'x'}" for a in trail)
    return {"draws": draws, "cold": cold, "warm": warm, "pareto_k": diagnostics.get("pareto_k"),
            "trusted": diagnostics.get("trusted"), "trail": trail}


def run_nuts(model, args, kwargs) -> dict:
    mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, num_chains=1, progress_bar=False,
                jit_model_args=True)
    cold, draws = timed(lambda: (mcmc.run(jax.random.PRNGKey(1), *args, **kwargs), mcmc.get_samples())[1])
    warm, _ = timed(lambda: (mcmc.run(jax.random.PRNGKey(2), *args, **kwargs), mcmc.get_samples())[1])
    return {"draws": draws, "cold": cold, "warm": warm}


def assess(name: str) -> dict:
    """One model, in this process: LM and NUTS against the reference (JSON-able: no draws)."""
    model, args, kwargs = SUITE[name]()
    ref = load_reference(name)
    lm, nuts = run_lm(model, args, kwargs), run_nuts(model, args, kwargs)
    nuts["worst"] = worst(w1_over_sd(nuts.pop("draws"), ref))
    if "draws" in lm:
        try:
            lm["worst"] = worst(w1_over_sd(lm.pop("draws"), ref))
        except Exception as e:  # noqa: BLE001 - e.g. a latent site missing from the draws
            lm["error"] = f"scoring its draws raised {type(e).__name__}: {e}"
    return {"name": name, "dim": reference_metadata(name)["dim"], "floor": worst(w1_over_sd(*halves(ref)))[2],
            "lm": lm, "nuts": nuts}


def assess_fresh(name: str) -> dict:
    """:func:`assess` in a fresh Python process (module docstring)."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name], capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"benchmarks/trust.py --one {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def row(r) -> str:
    lm, nuts = r["lm"], r["nuts"]

    def score(x):
        site, i, value = x["worst"]
        return f"{value:.3f} ({site}[{i}])"

    head = f"| {r['name']} | {r['dim']} | {r['floor']:.3f} | {score(nuts)} | "
    if "error" in lm:
        return head + (f"raised: {cell(lm['error'])} | - | - | - | - | - | "
                       f"{nuts['cold']:.2f} | {nuts['warm']:.2f} | - | - |")
    return head + (f"{score(lm)} | {cell(lm['pareto_k'])} | {cell(lm['trusted'])} | {cell(lm['trail'])} | "
                   f"{lm['cold']:.2f} | {lm['warm']:.3f} | {nuts['cold']:.2f} | {nuts['warm']:.2f} | "
                   f"{nuts['cold'] / lm['cold']:.1f} | {nuts['warm'] / lm['warm']:.0f} |")


def summary(results) -> list:
    ran = [r for r in results if "error" not in r["lm"]]
    good = [r for r in ran if r["lm"]["worst"][2] <= GOOD]
    lines = [f"- LM W1/sd <= {GOOD:.2f}: {len(good)} of {len(results)} models ({len(good) / len(results):.0%})."]
    bad = [r for r in ran if r["lm"]["worst"][2] > BAD]
    lines.append(f"- LM W1/sd > {BAD:.2f}: " + (", ".join(
        f"{r['name']} ({r['lm']['worst'][2]:.2f}, trusted {cell(r['lm']['trusted'])})" for r in bad) or "none") + ".")
    alarms = [f"{r['name']} ({r['lm']['worst'][2]:.3f})" for r in good if r["lm"]["trusted"] is not True]
    misses = [r["name"] for r in bad if r["lm"]["trusted"] is True]
    lines.append(f"- The verdict: untrusted while within {GOOD:.2f} W1/sd (false alarms): {len(alarms)} of {len(good)}"
                 f"{': ' + ', '.join(alarms) if alarms else ''}; trusted while above {BAD:.2f} (misses): "
                 f"{len(misses)} of {len(bad)}{': ' + ', '.join(misses) if misses else ''}.")
    failed = [r for r in results if "error" in r["lm"]]
    if failed:
        lines.append("- LM raised: " + ", ".join(r["name"] for r in failed) + ".")
    if ran:
        warm = np.median([r["nuts"]["warm"] / r["lm"]["warm"] for r in ran])
        cold = np.median([r["nuts"]["cold"] / r["lm"]["cold"] for r in ran])
        lines.append(f"- Median speed-up NUTS/LM over the {len(ran)} models LM ran: warm {warm:.0f}x, "
                     f"cold {cold:.1f}x.")
    return lines


def warm_up_jax():
    """A throwaway NUTS run and LM fit of a toy model, so that neither side of the first
    model pays the process's one-off start-up (JAX's backend, first compilations)."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    def toy():
        numpyro.sample("x", dist.Normal(jnp.zeros(2), 1.0).to_event(1))

    MCMC(NUTS(toy), num_warmup=10, num_samples=10, progress_bar=False).run(jax.random.PRNGKey(0))
    LaplaceMatching(toy, progress_bar=False).run(jax.random.PRNGKey(0))


def main(names):
    lines = [
        environment() + ". "
        "W1/sd: worst coordinate against the reference (4000 NUTS draws); floor: the same between two halves "
        "of the reference. Times in seconds; x: NUTS time / LM time.",
        "",
        "| model | D | floor | NUTS W1/sd | LM W1/sd | LM pareto_k | trusted | trail | LM cold | LM warm | "
        "NUTS cold | NUTS warm | cold x | warm x |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    results = run_table(lines, names, assess_fresh, row)
    tail = summary(results)
    lines += [""] + tail
    print("\n" + "\n".join(tail), flush=True)
    if set(names) == set(SUITE):  # a partial run does not replace the table
        write_results("trust", "\n".join(lines), "trust.md")


def jsonable(x):
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.generic, np.ndarray)):
        return x.tolist()
    return x


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        warm_up_jax()
        print(json.dumps(jsonable(assess(sys.argv[2]))), flush=True)
    else:
        main(sys.argv[1:] or list(SUITE))
