"""Where a fit runs: ``device="auto"`` against ``"cpu"`` and ``"default"`` (numpyro_lm/runtime/placement.py).

Six trust-suite models (``suite.py``; a few hundred latent and observed numbers at most) and
the Poisson random-effect benchmark at N = 5 000 (10^4), each fitted by the default call
(``LaplaceMatching(model).run`` + ``get_samples()``) with each ``device`` option, each pair in
a fresh process (JAX itself warmed up on a toy program first): the first call (compilation
included) and the compiled one (median of three new keys). On a machine whose default device is a CPU the three options are the same device and
the table says that nothing changes (ratios near 1); where a GPU is the default device
(``benchmarks/on_gpu.sh``) ``"default"`` is the GPU and the table shows what ``"auto"``'s
rule, the host CPU below ``PLACEMENT_NUMBERS``, buys (``benchmarks/results/placement_gpu.md``).

``python benchmarks/placement.py`` (part of ``make bench``) writes ``benchmarks/results/placement.md``
and the table in ``docs/scaling.md``.
"""

import json
import os
import subprocess
import sys
import time
import warnings

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inla import poisson_re, poisson_re_data  # noqa: E402
from report import write_results  # noqa: E402
from suite import SUITE  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402
from numpyro_lm.runtime.placement import fit_device  # noqa: E402

MODELS = ["eight_schools_noncentered", "hierarchical_normal_groups", "linear_regression_noise", "ar2",
          "student_t_regression", "beta_binomial_rats"]
OPTIONS = ("auto", "cpu", "default")


def case(name):
    if name == "poisson_5000":
        x, y = poisson_re_data(5000)
        return poisson_re, (x,), {"y": y}
    return SUITE[name]()


def timed(fn) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def measure(name: str, device: str) -> dict:
    model, args, kwargs = case(name)
    lm = LaplaceMatching(model, progress_bar=False, device=device)
    cold = timed(lambda: lm.run(jax.random.PRNGKey(0), *args, **kwargs).get_samples())
    warm = float(np.median([timed(lambda i=i: lm.run(jax.random.PRNGKey(i), *args, **kwargs).get_samples())
                            for i in (1, 2, 3)]))
    info = lm.model_info
    numbers = info.size + info.layout.observed_size
    placed = fit_device(device, numbers)
    where = (placed or jax.devices()[0]).platform
    return {"cold": cold, "warm": warm, "numbers": numbers, "where": where}


def fresh(name: str, device: str) -> dict:
    """:func:`measure` in a process of its own (no program compiled by another option's run)."""
    done = subprocess.run([sys.executable, __file__, "--one", name, device], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def one(name: str, device: str):
    warnings.simplefilter("ignore")
    jax.jit(lambda x: x + 1)(np.ones(3)).block_until_ready()  # JAX's own start, not the fit's
    print(json.dumps(measure(name, device)))


def main():
    default = jax.devices()[0]
    lines = [
        f"jax {jax.__version__}, default device: {default.platform} ({getattr(default, 'device_kind', '')}), "
        f"{os.cpu_count()} CPU cores, float32. Each model and device option in a fresh process: the default call's "
        "first call (compilation included) and compiled one (median of three keys), seconds.",
        "",
        "| model | numbers | auto runs on | auto first / compiled | cpu first / compiled | default first / compiled "
        "| default / auto compiled |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in MODELS + ["poisson_5000"]:
        r = {option: fresh(name, option) for option in OPTIONS}
        cells = " | ".join(f"{r[o]['cold']:.2f} / {r[o]['warm']:.3f}" for o in OPTIONS)
        line = (f"| {name} | {r['auto']['numbers']} | {r['auto']['where']} | {cells} | "
                f"{r['default']['warm'] / r['auto']['warm']:.2f} |")
        print(line, flush=True)
        lines.append(line)
    table = "\n".join(lines)
    print(table)
    write_results("placement", table, "scaling.md")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3])
    else:
        main()
