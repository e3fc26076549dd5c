"""``run_many`` across JAX processes: one process against two (``jax.distributed`` over gloo).

B = 1000 prior-predictive data sets of non-centred eight schools (D = 10), as ``batch.py``
fits them, float32, on this machine's CPU. Three runs, one after another, each in fresh
processes started here (the way a user launches them: the same script, once per process):

- one process, one CPU device (the baseline);
- two processes on localhost, one CPU device each (``jax.distributed.initialize`` with
  ``jax_cpu_collectives_implementation="gloo"``), ``gather="all"``: each fits its 500 data sets,
  then both rebuild the whole batch's result;
- the same with ``gather="local"``: each keeps its own 500.

Each process times, after start-up (imports, and ``jax.distributed.initialize`` where there are
two): the first ``run_many`` + ``get_samples()`` (1000 draws per data set) + ``diagnostics()``
(the verdicts), compilation included, and the same call compiled (new key; median of two). A
run's time is its slowest process's. On two cores, two processes of one device each share the
cores that one process's programs use through XLA's threads: the table shows what the exchange
between processes costs, not a gain; more hosts are where more processes pay.

Writes ``benchmarks/results/processes.md`` and the table in ``docs/scaling.md``
(``python benchmarks/processes.py``, part of ``make bench``).
"""

import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(process_id: int, num_processes: int, port: str, gather: str):
    """One process: the timings of its calls, as one JSON line on stdout."""
    start = time.perf_counter()
    import jax

    if num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=num_processes,
                                   process_id=process_id)
    import warnings

    import numpy as np
    from numpyro.infer import Predictive

    sys.path.insert(0, HERE)
    from models import eight_schools

    from numpyro_lm import LaplaceMatching
    from numpyro_lm.inference_data import unobserved

    warnings.simplefilter("ignore")  # failed fits are counted, not printed
    model, args, kwargs = eight_schools()
    b = 1000
    data = np.asarray(Predictive(unobserved(model), num_samples=b)(jax.random.PRNGKey(1), *args, **kwargs)["obs"])
    sigma = np.broadcast_to(np.asarray(args[0]), (b,) + args[0].shape)
    ready = time.perf_counter() - start
    lm = LaplaceMatching(model, num_samples=1000, progress_bar=False)

    def call(i):
        t0 = time.perf_counter()
        lm.run_many(jax.random.PRNGKey(i), sigma, y=data, on_failure="warn", gather=gather)
        jax.block_until_ready(lm.get_samples())
        trusted = np.asarray(lm.diagnostics()["trusted"])
        return time.perf_counter() - t0, trusted

    cold, trusted = call(0)
    warm = float(np.median([call(i)[0] for i in (1, 2)]))
    print(json.dumps({"ready": ready, "cold": cold, "warm": warm, "held": int(lm.batch_size),
                      "trusted": int(trusted.sum()), "jax": jax.__version__}), flush=True)
    if num_processes > 1:
        jax.distributed.shutdown()


def launch(num_processes: int, gather: str) -> dict:
    """Start the processes of one run and return the slowest one's timings."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(HERE, ".."), os.environ.get("PYTHONPATH", "")])}
    started = [subprocess.Popen([sys.executable, __file__, "--worker", str(p), str(num_processes), port, gather],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for p in range(num_processes)]
    outs = []
    for process in started:
        out, err = process.communicate(timeout=1200)
        if process.returncode != 0:
            raise RuntimeError(err[-3000:])
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return {k: max(o[k] for o in outs) if k in ("ready", "cold", "warm") else [o[k] for o in outs] for k in outs[0]}


def main():
    sys.path.insert(0, HERE)
    from report import write_results

    runs = [("1 process, 1 device", launch(1, "all")), ('2 processes, gather="all"', launch(2, "all")),
            ('2 processes, gather="local"', launch(2, "local"))]
    base = runs[0][1]
    lines = [
        f"B = 1000 prior-predictive data sets of non-centred eight schools (D = 10), float32, jax {base['jax'][0]}, "
        f"cpu ({os.cpu_count()} cores), one CPU device per process, gloo between processes on localhost. Each call: "
        "run_many + get_samples() (1000 draws per data set) + diagnostics(); a run's time is its slowest process's.",
        "",
        "| run | data sets held per process | start-up s | first call s | compiled call s | first call vs 1 process "
        "| compiled vs 1 process | trusted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs:
        lines.append(f"| {name} | {' / '.join(map(str, r['held']))} | {r['ready']:.1f} | {r['cold']:.2f} | "
                     f"{r['warm']:.2f} | {r['cold'] / base['cold']:.2f}x | {r['warm'] / base['warm']:.2f}x | "
                     f"{' / '.join(map(str, r['trusted']))} |")
    table = "\n".join(lines)
    print(table)
    write_results("processes", table, "scaling.md")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        main()
