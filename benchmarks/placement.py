"""Where a fit runs: ``device="auto"`` against ``"cpu"`` and ``"default"`` (numpyro_lm/runtime/placement.py).

Six trust-suite models (``suite.py``; a few hundred latent and observed numbers at most) and
the Poisson random-effect benchmark at N = 5 000 (10^4), each fitted by the default call
(``LaplaceMatching(model).run`` + ``get_samples()``) with each ``device`` option, in one
process: the first call (compilation included) and the compiled one (median of three new
keys). On a machine whose default device is a CPU the three options are the same device and
the table says that nothing changes (ratios near 1); where a GPU is the default device
(``benchmarks/on_gpu.sh``) ``"default"`` is the GPU and the table shows what ``"auto"``'s
rule, the host CPU below ``PLACEMENT_NUMBERS``, buys (``benchmarks/results/placement_gpu.md``).

``python benchmarks/placement.py`` (part of ``make bench``) writes ``benchmarks/results/placement.md``
and the table in ``docs/scaling.md``.
"""

import os
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


def main():
    warnings.simplefilter("ignore")
    default = jax.devices()[0]
    lines = [
        f"jax {jax.__version__}, default device: {default.platform} ({getattr(default, 'device_kind', '')}), "
        f"{os.cpu_count()} CPU cores, float32. Each model: the default call with each device option, in one process; "
        "first call (compilation included) and compiled (median of three keys), seconds.",
        "",
        "| model | numbers | auto runs on | auto first / compiled | cpu first / compiled | default first / compiled "
        "| default / auto compiled |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in MODELS + ["poisson_5000"]:
        r = {option: measure(name, option) for option in OPTIONS}
        cells = " | ".join(f"{r[o]['cold']:.2f} / {r[o]['warm']:.3f}" for o in OPTIONS)
        line = (f"| {name} | {r['auto']['numbers']} | {r['auto']['where']} | {cells} | "
                f"{r['default']['warm'] / r['auto']['warm']:.2f} |")
        print(line, flush=True)
        lines.append(line)
    table = "\n".join(lines)
    print(table)
    write_results("placement", table, "scaling.md")


if __name__ == "__main__":
    main()
