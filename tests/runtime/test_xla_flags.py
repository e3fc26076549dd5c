"""numpyro_lm.runtime.xla_flags: importing the package keeps batched LAPACK kernels from deadlocking.

Each case runs in a fresh interpreter (XLA_FLAGS are read once, when JAX's backends start)
with the scheduler flag removed from the environment it inherits from this process.
"""

import os
import subprocess
import sys

import pytest

from numpyro_lm.runtime.xla_flags import SCHEDULER_FLAG

# four independent batched solves in one program: without the flag this hangs at 0 % CPU on
# 2 cores (jaxlib 0.10.2; measured: no output after 30 s, while 100 x 16 x 16 finishes)
FOUR_SOLVES = """
import jax, jax.numpy as jnp
f = jax.jit(lambda xs: sum(jnp.linalg.solve(x, x[..., :1]).sum() for x in xs))
xs = [jnp.eye(16) + 0.01 * jax.random.normal(jax.random.key(k), (300, 16, 16)) for k in range(4)]
for i in range(5):
    f(xs).block_until_ready()
"""


def _python(code, timeout=120, flags=None):
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f != SCHEDULER_FLAG)
    if flags is not None:
        env["XLA_FLAGS"] = flags
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_import_sets_the_flag_and_batched_solves_finish():
    # a hang fails as subprocess.TimeoutExpired (the work itself takes about a second)
    out = _python("import os, numpyro_lm\nprint(os.environ['XLA_FLAGS'])\n" + FOUR_SOLVES + "print('done')")
    assert out.returncode == 0, out.stderr
    assert SCHEDULER_FLAG in out.stdout and out.stdout.strip().endswith("done")


@pytest.mark.slow  # 13 s on one core: runs where CI=true (Makefile)
def test_batched_inverse_wishart_map_of_235_matrices_finishes():
    # the case: a jitted batch of 235 4 x 4 matrices hung (batches of 100 finished)
    code = """
import numpy as np, jax.numpy as jnp
from numpyro_lm.families.wishart import inverse_wishart_sqrtm as fam
rng = np.random.default_rng(0)
a = rng.normal(size=(235, 4, 4))
params = {"concentration": jnp.asarray(rng.uniform(6, 20, 235), jnp.float32),
          "scale_matrix": jnp.asarray(a @ a.transpose(0, 2, 1) + 4 * np.eye(4), jnp.float32)}
back = fam.from_gaussian(*fam.to_gaussian(params))
print(float(jnp.max(jnp.abs(back["concentration"] - params["concentration"]))))
"""
    out = _python(code)
    assert out.returncode == 0, out.stderr
    # the exact inverse of the exact map: float32 round trip of degrees of freedom 6-20
    assert float(out.stdout.split()[-1]) < 0.05


@pytest.mark.slow
def test_a_flag_the_user_set_is_kept():
    out = _python("import os, numpyro_lm\nprint(os.environ['XLA_FLAGS'])",
                  flags="--xla_cpu_enable_concurrency_optimized_scheduler=true")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["--xla_cpu_enable_concurrency_optimized_scheduler=true"]


@pytest.mark.slow
def test_importing_after_jax_started_warns():
    code = ("import warnings, jax.numpy as jnp\njnp.ones(1).block_until_ready()\n"
            "warnings.simplefilter('always')\nimport numpyro_lm")
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert "could not set XLA_FLAGS" in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("flags", ["", "--xla_force_host_platform_device_count=2"])
def test_other_flags_are_kept(flags):
    out = _python("import os, numpyro_lm\nprint(os.environ['XLA_FLAGS'])", flags=flags)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == flags.split() + [SCHEDULER_FLAG]
