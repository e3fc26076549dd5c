"""Many data sets of one model: ``run_many`` against a Python loop of ``run`` and against NUTS.

B = 1000 data sets of the non-centred eight schools model (D = 10), simulated from its
prior predictive (the data sets of a simulation-based calibration), fitted side by side
in one process (float32, this machine's CPU):

- ``run_many``: one compiled program for all B fits; its first call (with compilation)
  and later ones (new keys; median of three), each followed by ``get_samples()`` (1000
  draws per data set);
- a Python loop of ``run`` over the same B data sets, each fit with its 1000 draws (``run``
  makes them in the fit's program) and, as the fit-only comparison, with one draw each;
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

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, NUTS, Predictive

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
    lm = LaplaceMatching(model, num_samples=num_samples, progress_bar=False)
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

    lm = LaplaceMatching(model, num_samples=1000, progress_bar=False)

    def fit(i):
        return lm.run_many(jax.random.PRNGKey(i), sigma, y=data, on_failure="warn").state.mode

    many = {"fit_cold": timed(lambda: fit(0)), "draws_cold": timed(lambda: lm.get_samples())}
    # compiled calls: the median of three (this machine is shared; the loops are long enough)
    warm = [(timed(lambda i=i: fit(i)), timed(lambda: lm.get_samples())) for i in range(1, 4)]
    many["fit_warm"], many["draws_warm"] = np.median(warm, axis=0)
    failed_many = int(np.sum(~np.asarray(lm.diagnostics()["positive_definite"])))
    loop_fit, failed_loop = loop(model, args, data, 1)
    loop_draws, _ = loop(model, args, data, 1000)

    mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, progress_bar=False, jit_model_args=True)
    nuts_cold = timed(lambda: (mcmc.run(jax.random.PRNGKey(0), *args, y=data[0]), mcmc.get_samples())[1])
    nuts_warm = timed(lambda: (mcmc.run(jax.random.PRNGKey(1), *args, y=data[0]), mcmc.get_samples())[1])

    b = num_datasets
    rows = [
        ("fit (mode, curvature, matched families)", many["fit_cold"], many["fit_warm"], loop_fit),
        ("fit + 1000 draws per data set", many["fit_cold"] + many["draws_cold"],
         many["fit_warm"] + many["draws_warm"], loop_draws),
    ]
    lines = [
        f"B = {b} prior-predictive data sets of non-centred eight schools (D = 10), float32, "
        f"jax {jax.__version__}, {jax.devices()[0].platform} ({os.cpu_count()} cores); "
        f"failed fits: run_many {failed_many}, loop {failed_loop}.",
        "",
        "| work | run_many first call s | run_many compiled s | loop of run s | loop / first call | "
        "loop / compiled |",
        "|---|---|---|---|---|---|",
    ]
    for name, cold, warm, looped in rows:
        lines.append(f"| {name} | {cold:.2f} | {warm:.2f} | {looped:.2f} | {looped / cold:.1f}x | {looped / warm:.1f}x |")
    lines += [
        "",
        f"NUTS (1 chain, 1000 + 1000) on one data set: {nuts_cold:.2f} s first call, {nuts_warm:.2f} s compiled; "
        f"x {b} = {b * nuts_warm:.0f} s, {b * nuts_warm / (many['fit_warm'] + many['draws_warm']):.0f} times "
        "run_many's compiled call with its draws.",
    ]
    table = "\n".join(lines)
    print(table)
    write_results("batch", table, "batch.md")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-datasets", type=int, default=1000)
    main(parser.parse_args().num_datasets)
