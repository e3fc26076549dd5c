"""The AR(1) trend of Poisson counts over 10^6 steps on one machine: time and peak memory of
LaplaceMatching's default call, its cold call alone (a warm one costs about as much: at this
length the time is compute, not compilation), with the hyperparameters it finds and the
simulated truth (issue 43's "n = 10^6 for the AR(1) runs on one machine").

The row comes from ``benchmarks/fields.py --one ar1 1000000 cold`` in a fresh process (the
model, data and columns of ``benchmarks/fields.py``).

``python benchmarks/fields_long.py`` writes ``benchmarks/results/fields_long.md`` and the table
in ``docs/fields.md``.
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fields import row  # noqa: E402
from report import environment, write_results  # noqa: E402

SIZE = 1_000_000


def main():
    lines = [environment() + ". One fresh process, the cold call alone; memory: the process's peak resident set; "
             "truth: every simulated hyperparameter within 3 of LM's posterior SDs.", "",
             "| model | latent values | LM cold / warm s | peak MB | NUTS cold / warm s | cold x | warm x | "
             "gap (NUTS SD) | trusted | auto-pilot | hyperparameters (LM) | truth inside |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    done = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fields.py"),
                           "--one", "ar1", str(SIZE), "cold"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the 10^6-step AR(1) failed:\n{done.stderr[-3000:]}")
    lines.append(row(json.loads(done.stdout.strip().splitlines()[-1])))
    table = "\n".join(lines)
    print(table)
    write_results("fields_long", table, "fields.md")


if __name__ == "__main__":
    main()
