"""Benchmark tables to files: ``benchmarks/results/<name>.md``, and into the docs between markers.

The docs quote the benchmarks' numbers only through these files: a doc holds
``<!-- benchmarks/<name>.py -->`` ... ``<!-- /benchmarks/<name>.py -->`` and each run of the
benchmark replaces what lies between them. A run on an accelerator (``jax.devices()`` a GPU)
writes ``benchmarks/results/<name>_gpu.md`` and the block ``<!-- benchmarks/<name>.py on gpu -->``
instead: absolute times on that device, beside the CPU's ratios. Such a run is made on a lent
machine; ``python benchmarks/report.py <name>_gpu <doc>`` puts its fetched file into the doc here.
"""

import os
import re
import sys
import time

import jax

# "cold" means compiled in this process: the library's persistent compilation cache is off in the
# benchmarks unless one measures it (benchmarks/inla.py's second-process column)
os.environ.setdefault("NUMPYRO_LM_COMPILATION_CACHE", "off")

HERE = os.path.dirname(os.path.abspath(__file__))


def platform() -> str:
    """``"cpu"``, or the accelerator's platform (``"gpu"``) the benchmark runs on."""
    return jax.devices()[0].platform


def write_results(name: str, table: str, doc: str):
    """Write ``table`` to ``benchmarks/results/<name>.md`` (``<name>_gpu.md`` on a GPU) and between
    the markers of ``docs/<doc>``."""
    results = name if platform() == "cpu" else f"{name}_{platform()}"
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", f"{results}.md"), "w") as f:
        f.write(f"<!-- written by benchmarks/{name}.py on {time.strftime('%Y-%m-%d')}; do not edit -->\n{table}\n")
    insert_results(results, doc)


def insert_results(results: str, doc: str):
    """Put ``benchmarks/results/<results>.md`` between its markers in ``docs/<doc>``: those of
    ``benchmarks/<name>.py`` for ``results = name``, of ``benchmarks/<name>.py on gpu`` for
    ``<name>_gpu``."""
    with open(os.path.join(HERE, "results", f"{results}.md")) as f:
        stamp_line, table = f.read().split("\n", 1)
    name, stamp = re.match(r"<!-- written by benchmarks/(\w+)\.py on ([\d-]+);", stamp_line).groups()
    where = "" if results == name else f" on {results[len(name) + 1:]}"
    path = os.path.join(HERE, "..", "docs", doc)
    begin, end = f"<!-- benchmarks/{name}.py{where} -->", f"<!-- /benchmarks/{name}.py{where} -->"
    with open(path) as f:
        text = f.read()
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n_Measured {stamp} by `python benchmarks/{name}.py`{where}._\n\n{table.rstrip()}\n"
                f"{end}{tail}")


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
    device = jax.devices()[0]
    where = f"{device.platform} ({cores})" if device.platform == "cpu" else f"{device.platform}: {device.device_kind}"
    return f"jax {jax.__version__}, x64={jax.config.jax_enable_x64}, {where}"


if __name__ == "__main__":
    insert_results(*sys.argv[1:3])
