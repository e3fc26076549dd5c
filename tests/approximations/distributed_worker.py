"""One process of tests/approximations/test_across_processes.py (not collected by pytest).

``python distributed_worker.py PROCESS_ID NUM_PROCESSES PORT OUT``: with more than one process,
JAX's distributed runtime over gloo on localhost; then ``run_many`` on 64 Poisson data sets
(gather "all" and "local"), and with one data set broken (a NaN count: ``on_failure`` "raise" and
"warn"); what it saw goes to ``OUT/process_<id>.npz``.
"""

import os
import sys
import warnings

import jax

PROCESS_ID, NUM_PROCESSES, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if NUM_PROCESSES > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{PORT}", num_processes=NUM_PROCESSES,
                               process_id=PROCESS_ID)

import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from numpyro_lm import LaplaceMatching  # noqa: E402

BATCH, COUNTS, BROKEN = 64, 10, 40


def poisson(y):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    with numpyro.plate("counts", y.shape[-1]):
        numpyro.sample("y", dist.Poisson(rate), obs=y)


def main():
    y = np.random.default_rng(0).poisson(np.linspace(0.5, 8.0, BATCH)[:, None], (BATCH, COUNTS)).astype(np.float32)
    key = jax.random.PRNGKey(1)
    out = {"process_count": jax.process_count()}
    lm = LaplaceMatching(poisson, num_samples=200, progress_bar=False).run_many(key, y)
    d = lm.diagnostics()
    out.update(samples=np.asarray(lm.get_samples()["rate"]), pareto_k=np.asarray(d["pareto_k"]),
               trusted=np.asarray(d["trusted"]), concentration=np.asarray(lm.posterior["rate"].concentration),
               indices=lm.batch_indices)
    local = LaplaceMatching(poisson, num_samples=200, progress_bar=False).run_many(key, y, gather="local")
    out.update(local_samples=np.asarray(local.get_samples()["rate"]), local_indices=local.batch_indices,
               local_pareto_k=np.asarray(local.diagnostics()["pareto_k"]))
    broken = y.copy()
    broken[BROKEN, 3] = np.nan
    try:
        LaplaceMatching(poisson, num_samples=200, progress_bar=False).run_many(key, broken)
        out["raised"] = ""
    except ValueError as error:
        out["raised"] = f"{type(error).__name__}: {error}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = LaplaceMatching(poisson, num_samples=200, progress_bar=False).run_many(key, broken, on_failure="warn")
    out["warned"] = " | ".join(str(w.message) for w in caught)
    out["kept_finite"] = np.all(np.isfinite(np.asarray(kept.get_samples()["rate"])), axis=1)
    np.savez(os.path.join(OUT, f"process_{PROCESS_ID}.npz"), **out)
    if NUM_PROCESSES > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
