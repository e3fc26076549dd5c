"""Models written by others: what the default ``LaplaceMatching(model)`` does with each model of
the third-party corpus (``tests/third_party_models.py``, after NumPyro's examples and tests).

Per model, in one process after a throwaway fit (so that no row pays JAX's start-up):
``LaplaceMatching(model, progress_bar=False).run(PRNGKey(0), ...)`` and its draws, timed
(compilation included); the outcome (trusted, not trusted, or the error it raised, cut to
its first sentence); the auto-pilot's trail; and, where a long NUTS run is the reference
(``tests/data/third_party_nuts.npz``), the worst coordinate's ``|mean LM - mean NUTS| / sd
NUTS`` with NUTS's divergences beside it (a reference with divergences is itself biased).

``python benchmarks/third_party.py [name ...]`` prints the table; a run over every model writes it
to ``benchmarks/results/third_party.md`` and ``docs/models.md``.
"""

import os
import sys
import time
import warnings

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from report import environment, run_table, write_results  # noqa: E402
from third_party_models import NAMES, case  # noqa: E402
from third_party_common import comparable  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402

REFERENCE = os.path.join(HERE, "..", "tests", "data", "third_party_nuts.npz")


def gap_to_nuts(name, samples):
    """``(worst |mean LM - mean NUTS| / sd NUTS, NUTS divergences)`` or ``(None, None)``."""
    if not os.path.exists(REFERENCE):
        return None, None
    with np.load(REFERENCE) as ref:
        if f"{name}/divergences" not in ref:
            return None, None
        gaps = []
        for site, value in comparable(name, samples).items():
            if f"{name}/{site}/mean" in ref:
                mean, sd = ref[f"{name}/{site}/mean"], ref[f"{name}/{site}/sd"]
                varies = sd > 1e-6 * (1 + np.abs(mean))
                value = np.asarray(value, np.float64)
                gaps.append(np.max(np.abs(value.mean(0) - mean)[varies] / sd[varies], initial=0.0))
        return (max(gaps) if gaps else None), int(ref[f"{name}/divergences"])


def assess(name: str) -> dict:
    c = case(name)
    out = {"name": name, "kind": c.kind, "note": c.note}
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lm = LaplaceMatching(c.model, progress_bar=False).run(jax.random.PRNGKey(0), *c.args, **c.kwargs)
            samples = jax.block_until_ready(lm.get_samples())
    except Exception as e:  # noqa: BLE001 - a refusal is a result
        first = str(e).split(". ")[0].replace("|", "/")
        out.update(seconds=time.perf_counter() - start, outcome=f"refused: {type(e).__name__}: {first[:160]}")
        return out
    d = lm.diagnostics()
    finite = all(np.all(np.isfinite(np.asarray(v))) for v in samples.values())
    gap, divergences = gap_to_nuts(name, samples)
    out.update(seconds=time.perf_counter() - start, outcome="trusted" if d["trusted"] else "not trusted",
               finite=finite, gap=gap, divergences=divergences,
               trail=" -> ".join(f"{a['candidate']} {'ok' if a['trusted'] else 'x'}" for a in d.get("trail") or []))
    return out


def row(r) -> str:
    gap = "-" if r.get("gap") is None else f"{r['gap']:.2f} ({r['divergences']} div.)"
    finite = "-" if "finite" not in r else ("yes" if r["finite"] else "NO")
    return (f"| {r['name']} | {r['kind']} | {r['outcome']} | {r.get('trail') or '-'} | {finite} | {gap} | "
            f"{r['seconds']:.1f} | {r['note'].replace('|', '/')} |")


def main(names):
    with warnings.catch_warnings():  # a throwaway fit: JAX's start-up is not the first row's
        warnings.simplefilter("ignore")
        first = case("poisson_regression")
        LaplaceMatching(first.model, progress_bar=False).run(jax.random.PRNGKey(1), *first.args, **first.kwargs)
    lines = [
        environment() + ". Default `LaplaceMatching(model).run(key, ...)` and `get_samples()`; seconds include "
        "compilation. finite: every draw finite. gap: the worst coordinate's |mean LM - mean NUTS| / sd NUTS "
        "against 4 x 2000 NUTS draws (its divergences beside it: a reference with divergences is biased).",
        "",
        "| model | kind | outcome | trail | finite | gap to NUTS (SD) | seconds | what it exercises |",
        "|---|---|---|---|---|---|---|---|",
    ]
    results = run_table(lines, names, assess, row)
    runs = [r for r in results if r["kind"] == "continuous"]
    ran = [r for r in runs if not r["outcome"].startswith("refused")]
    far = [r for r in results if r["outcome"] == "trusted" and (r.get("gap") or 0) > 0.3]
    wrong = [r["name"] for r in far if r["divergences"] == 0]
    doubtful = [f"{r['name']} ({r['divergences']} div.)" for r in far if r["divergences"] > 0]
    lines += ["", f"- Continuous models that run: {len(ran)} of {len(runs)}; trusted: "
              f"{sum(r['outcome'] == 'trusted' for r in ran)}; trusted yet more than 0.3 SD from a NUTS reference "
              f"without divergences: {wrong or 'none'}, from one with divergences: {doubtful or 'none'}; "
              f"non-finite draws: {[r['name'] for r in ran if not r['finite']] or 'none'}."]
    lines.append(verdict_rates(ran))
    print("\n".join(lines[-2:]))
    if list(names) == list(NAMES):
        write_results("third_party", "\n".join(lines), "models.md")


def verdict_rates(ran) -> str:
    """The verdict against the references without divergences, by the gap in means: false alarms
    (untrusted within 0.10 SD) and misses (trusted beyond 0.30 SD)."""
    clean = [r for r in ran if r.get("gap") is not None and r["divergences"] == 0]
    close = [r for r in clean if r["gap"] <= 0.10]
    alarms = [f"{r['name']} ({r['gap']:.2f})" for r in close if r["outcome"] != "trusted"]
    far = [r for r in clean if r["gap"] > 0.30]
    misses = [r["name"] for r in far if r["outcome"] == "trusted"]
    return (f"- The verdict against the {len(clean)} references without divergences: untrusted while within 0.10 SD "
            f"of NUTS's means (false alarms by this measure): {len(alarms)} of {len(close)} "
            f"({len(alarms) / max(len(close), 1):.0%}): {', '.join(alarms) or 'none'}; trusted while more than 0.30 "
            f"SD off (misses): {len(misses)} of {len(far)}: {', '.join(misses) or 'none'}.")


if __name__ == "__main__":
    main(sys.argv[1:] or NAMES)
