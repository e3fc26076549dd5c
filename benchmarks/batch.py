"""Many data sets of one model: ``run_many`` against a Python loop of ``run`` and against NUTS.

B = 1000 data sets of the non-centred eight schools model (D = 10), simulated from its
prior predictive (the data sets of a simulation-based calibration), fitted side by side
in one process (float32, this machine's CPU):

- ``run_many``: one compiled program for all B fits; its first call (with compilation)
  and later ones (new keys; median of three), each followed by ``get_samples()`` (1000
  draws per data set); on one device and, split with ``jax.sharding``, on as many CPU
  devices as this machine has cores (``XLA_FLAGS=--xla_force_host_platform_device_count``,
  set here before JAX starts: the way JAX spreads one program over a CPU's cores);
- a Python loop of ``run(...)`` (``strategy="laplace"``: the joint fit, as ``run_many``
  makes; the default call would start with nested Laplace over ``tau``) and ``get_samples()``
  over the same B data sets, with 1000 draws each and, as the fit-only comparison, one.
  Each ``run`` also computes its fit's verdict (4000 draws and their float64 importance
  weights: ``run`` warns when a fit is not trusted), which ``run_many`` computes only when
  ``diagnostics()`` asks for it;
- NUTS (1 chain, 1000 warmup + 1000 draws) on the first data set, cold and compiled,
  times B (extrapolated: a loop of 1000 NUTS runs takes about an hour here).

Ratios are taken side by side; the table is printed, written to
``benchmarks/results/batch.md`` and copied into ``docs/batch.md`` (the numbers the docs quote). Run with
``python benchmarks/batch.py`` (part of ``make bench``); ``--num-datasets`` for another B.
"""

import argparse
import os
import sys
import time
import warnings

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={os.cpu_count()}").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from numpyro.infer import MCMC, NUTS, Predictive  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from models import eight_schools  # noqa: E402
from report import write_results  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402
from numpyro_lm.inference_data import unobserved  # noqa: E402

def timed(fn):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def loop(model, args, data, num_samples):
    """Seconds of a Python loop of ``run`` (and ``get_samples``) over the data sets; failures counted."""
    # the joint fit, as run_many makes (the default call would start with nested Laplace over tau)
    lm = LaplaceMatching(model, num_samples=num_samples, progress_bar=False, strategy="laplace")
    failed = 0
    t0 = time.perf_counter()
    for i, y in enumerate(data):
        try:
            jax.block_until_ready(lm.run(jax.random.PRNGKey(i), *args, y=y).get_samples())
        except ValueError:
            failed += 1
    return time.perf_counter() - t0, failed


def main(num_datasets):
    warnings.simplefilter("ignore")  # failed fits are counted, not printed
    model, args, kwargs = eight_schools()
    prior = Predictive(unobserved(model), num_samples=num_datasets)(jax.random.PRNGKey(1), *args, **kwargs)
    data = np.asarray(prior["obs"])
    sigma = jnp.broadcast_to(args[0], (num_datasets,) + args[0].shape)

    def many(devices):
        lm = LaplaceMatching(model, num_samples=1000, progress_bar=False)

        def fit(i):
            return lm.run_many(jax.random.PRNGKey(i), sigma, y=data, on_failure="warn", devices=devices).state.mode

        out = {"fit_cold": timed(lambda: fit(0)), "draws_cold": timed(lambda: lm.get_samples())}
        # compiled calls: the median of three (this machine is shared; the loops are long enough)
        warm = [(timed(lambda i=i: fit(i)), timed(lambda: lm.get_samples())) for i in range(1, 4)]
        out["fit_warm"], out["draws_warm"] = np.median(warm, axis=0)
        out["failed"] = int(np.sum(~np.asarray(lm.diagnostics()["positive_definite"])))
        return out

    devices = jax.devices()
    runs = {1: many(devices[:1])}
    if len(devices) > 1:
        runs[len(devices)] = many(devices)
    loop_fit, failed_loop = loop(model, args, data, 1)
    loop_draws, _ = loop(model, args, data, 1000)

    mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, progress_bar=False, jit_model_args=True)
    nuts_cold = timed(lambda: (mcmc.run(jax.random.PRNGKey(0), *args, y=data[0]), mcmc.get_samples())[1])
    nuts_warm = timed(lambda: (mcmc.run(jax.random.PRNGKey(1), *args, y=data[0]), mcmc.get_samples())[1])

    b = num_datasets
    lines = [
        f"B = {b} prior-predictive data sets of non-centred eight schools (D = 10), float32, "
        f"jax {jax.__version__}, {devices[0].platform} ({os.cpu_count()} cores, {len(devices)} devices); "
        f"failed fits: run_many {max(r['failed'] for r in runs.values())}, loop {failed_loop}.",
        "",
        "| work | devices | run_many first call s | run_many compiled s | loop of run (with verdicts) s | "
        "loop / first call | "
        "loop / compiled |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, r in runs.items():
        rows = [
            ("fit (mode, curvature, matched families)", r["fit_cold"], r["fit_warm"], loop_fit),
            ("fit + 1000 draws per data set", r["fit_cold"] + r["draws_cold"], r["fit_warm"] + r["draws_warm"],
             loop_draws),
        ]
        for name, cold, warm, looped in rows:
            lines.append(f"| {name} | {n} | {cold:.2f} | {warm:.2f} | {looped:.2f} | {looped / cold:.1f}x | "
                         f"{looped / warm:.1f}x |")
    best = min(r["fit_warm"] + r["draws_warm"] for r in runs.values())
    lines += [
        "",
        f"NUTS (1 chain, 1000 + 1000) on one data set: {nuts_cold:.2f} s first call, {nuts_warm:.2f} s compiled; "
        f"x {b} = {b * nuts_warm:.0f} s, {b * nuts_warm / best:.0f} times run_many's fastest compiled call with "
        "its draws.",
    ]
    table = "\n".join(lines)
    print(table)
    write_results("batch", table, "batch.md")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-datasets", type=int, default=1000)
    main(parser.parse_args().num_datasets)
