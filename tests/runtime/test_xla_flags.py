"""numpyro_lm.runtime.xla_flags: the library's programs keep batched LAPACK kernels from deadlocking.

The end-to-end cases run in a fresh interpreter with the scheduler flag removed from the
environment it inherits, and start JAX before importing the package (the order that used to
leave a user exposed): a hang fails as ``subprocess.TimeoutExpired`` (the work takes a second).
"""

import os
import subprocess
import sys

import pytest

from numpyro_lm.runtime.xla_flags import SCHEDULER_FLAG, THREADING_OPTIONS, with_threading_options

JAX_FIRST = "import jax, jax.numpy as jnp\njnp.ones(3).sum().block_until_ready()\n"
# four independent batched solves in one program: compiled with XLA's defaults this hangs at
# 0 % CPU on 2 cores (jaxlib 0.10.2; measured: no output after 40 s, while 100 x 16 x 16 finishes)
FOUR_SOLVES = """
from numpyro_lm.runtime.precision import precise_jit
f = precise_jit(lambda xs: sum(jnp.linalg.solve(x, x[..., :1]).sum() for x in xs))
xs = [jnp.eye(16) + 0.01 * jax.random.normal(jax.random.key(k), (300, 16, 16)) for k in range(4)]
for i in range(5):
    f(xs).block_until_ready()
"""


def _python(code, timeout=120, flags=None):
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f != SCHEDULER_FLAG)
    if flags is not None:
        env["XLA_FLAGS"] = flags
    return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_batched_solves_finish_when_jax_started_first_and_nothing_is_warned():
    code = JAX_FIRST + "import os, numpyro_lm\nprint(repr(os.environ['XLA_FLAGS']))\n" + FOUR_SOLVES + "print('done')"
    out = _python(code, flags="")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["''", "done"]  # XLA_FLAGS untouched by the import
    assert "Warning" not in out.stderr, out.stderr


@pytest.mark.slow  # 13 s on one core: runs where CI=true (Makefile)
def test_batched_inverse_wishart_map_of_235_matrices_finishes():
    # the case: a jitted batch of 235 4 x 4 matrices hung (batches of 100 finished)
    code = JAX_FIRST + """
import numpy as np
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


@pytest.mark.slow  # a fresh interpreter compiling a batched fit: CI=true and make test-all
def test_a_batched_fit_after_jax_started_finishes_without_a_warning():
    code = JAX_FIRST + """
import numpy as np, numpyro, numpyro.distributions as dist
from numpyro_lm import LaplaceMatching
def model(y):
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("n", y.shape[-1]):
        numpyro.sample("y", dist.Normal(0.0, s), obs=y)
y = np.random.default_rng(0).normal(size=(16, 40)).astype(np.float32)
lm = LaplaceMatching(model, progress_bar=False).run_many(jax.random.PRNGKey(0), y)
print(lm.get_samples()["s"].shape)
"""
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert "could not set XLA_FLAGS" not in out.stderr and "RuntimeWarning" not in out.stderr, out.stderr


@pytest.mark.parametrize("flags, expected", [
    ("", THREADING_OPTIONS),
    ("--xla_force_host_platform_device_count=2", THREADING_OPTIONS),
    (SCHEDULER_FLAG, None),  # the user's global remedy: their threading kept
    ("--xla_cpu_multi_thread_eigen=true", None),
])
def test_the_threading_option_is_added_unless_the_user_chose(monkeypatch, flags, expected):
    monkeypatch.setenv("XLA_FLAGS", flags)
    assert with_threading_options(None) == expected
    assert with_threading_options({"xla_backend_optimization_level": 0}) == {
        "xla_backend_optimization_level": 0, **(expected or {})}
    # an explicit choice in the program's own options wins
    assert with_threading_options({"xla_cpu_multi_thread_eigen": True}) == {"xla_cpu_multi_thread_eigen": True}
