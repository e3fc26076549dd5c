"""Every example in ``examples/`` runs from the environment ``make demo`` builds (the ``plot`` and
``data`` extras), to the end, in a fresh interpreter.

Each takes 10 s to 1.5 min alone on 2 cores (the limit the examples are written to is 2 min;
timing is ``make bench``'s business, not a test's): slow-marked, they run where CI=true and
with ``make test-all``. The timeout only turns a hang into a failure.
"""

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
NAMES = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py"))
HANG = 900  # s: several times an example's run on a busy CI core


def test_every_example_is_listed():
    assert len(NAMES) >= 9 and "quickstart.py" in NAMES


@pytest.mark.slow  # end-to-end scripts of 10-90 s each: CI=true and make test-all
@pytest.mark.parametrize("name", NAMES)
def test_example_runs_to_the_end(name):
    env = dict(os.environ, MPLBACKEND="Agg")
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True,
                         timeout=HANG, env=env, cwd=EXAMPLES)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
