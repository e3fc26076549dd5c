"""Benchmark tables to files: ``benchmarks/results/<name>.md``, and into the docs between markers.

The docs quote the benchmarks' numbers only through these files: a doc holds
``<!-- benchmarks/<name>.py -->`` ... ``<!-- /benchmarks/<name>.py -->`` and each run of the
benchmark replaces what lies between them.
"""

import os
import time

import jax

# "cold" means compiled in this process: the library's persistent compilation cache is off in the
# benchmarks unless one measures it (benchmarks/inla.py's second-process column)
os.environ.setdefault("NUMPYRO_LM_COMPILATION_CACHE", "off")

HERE = os.path.dirname(os.path.abspath(__file__))


def write_results(name: str, table: str, doc: str):
    """Write ``table`` to ``benchmarks/results/<name>.md`` and between the markers of ``docs/<doc>``."""
    stamp = time.strftime("%Y-%m-%d")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", f"{name}.md"), "w") as f:
        f.write(f"<!-- written by benchmarks/{name}.py on {stamp}; do not edit -->\n{table}\n")
    path = os.path.join(HERE, "..", "docs", doc)
    begin, end = f"<!-- benchmarks/{name}.py -->", f"<!-- /benchmarks/{name}.py -->"
    with open(path) as f:
        text = f.read()
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n_Measured {stamp} by `python benchmarks/{name}.py`._\n\n{table}\n{end}{tail}")


def run_table(lines: list, names, assess, row) -> list:
    """Print the table's head ``lines``, then one row per name as it comes (``row(assess(name))``);
    returns the results (``lines`` grows with the rows)."""
    print("\n".join(lines), flush=True)
    results = []
    for name in names:
        results.append(assess(name))
        lines.append(row(results[-1]))
        print(lines[-1], flush=True)
    return results


def environment() -> str:
    """The line every table opens with: JAX's version, float64 or not, the platform and cores."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = f"{os.cpu_count()} cores" if usable == os.cpu_count() else f"pinned to {usable} of {os.cpu_count()} cores"
    return f"jax {jax.__version__}, x64={jax.config.jax_enable_x64}, {jax.devices()[0].platform} ({cores})"
