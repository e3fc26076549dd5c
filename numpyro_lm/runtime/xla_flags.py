"""Keep XLA:CPU from deadlocking jaxlib's batched LAPACK kernels.

Since jaxlib 0.10 the CPU LAPACK kernels (LU, triangular solve, Cholesky, eigh, ... behind
``jnp.linalg``) split a large batch of matrices into tasks on XLA's intra-op thread pool
and block until they finish (``jax::ParallelBatchMap``). XLA's concurrency-optimised
scheduler lets independent kernels of one program run at the same time, each on a pool
thread; when every pool thread is such a kernel, each waits for tasks that no free thread
is left to run, and the process hangs at 0 % CPU. Seen on 2 cores with a vmapped
inverse-Wishart map over 235 4 x 4 matrices and with four independent solves of 300
16 x 16 matrices in one jit (``tests/runtime/test_xla_flags.py``); native stacks show both pool
threads in ``BlockingCounter::Wait`` under ``lapack_sgetrf_ffi`` / ``lapack_strsm_ffi``.

:func:`avoid_lapack_deadlock` (called when ``numpyro_lm`` is imported) adds
``--xla_cpu_enable_concurrency_optimized_scheduler=false`` to ``XLA_FLAGS`` while JAX's
backends are not yet initialised: the default scheduler orders the kernels one after
another. Measured on the benchmarks' models it costs nothing (``make bench``: the scale
table's GP and GLMM rows ran as fast with it). A flag the user set in ``XLA_FLAGS`` is
kept as it is; where the backends were started before ``numpyro_lm`` was imported the flag
cannot take effect and a warning says how to set it.
"""

from __future__ import annotations

import os
import warnings

__all__ = ["SCHEDULER_FLAG", "avoid_lapack_deadlock"]

SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def _started_backends() -> dict:
    from jax._src import xla_bridge  # private, but the only way to ask without starting them

    return dict(getattr(xla_bridge, "_backends", {}))


def avoid_lapack_deadlock() -> str:
    """Add :data:`SCHEDULER_FLAG` to ``XLA_FLAGS`` if it can still take effect.

    Returns what was done: ``"set"``, ``"user"`` (the user's ``XLA_FLAGS`` already name
    the option), or ``"late"`` (JAX's backends were already started; a warning is given
    when one of them is the CPU).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    name = SCHEDULER_FLAG.split("=")[0]
    if name in flags:
        return "user"
    started = _started_backends()
    if started:
        if "cpu" in started:
            warnings.warn(
                "numpyro_lm was imported after JAX started its CPU backend, so it could not set "
                f"XLA_FLAGS={SCHEDULER_FLAG}: without it, jaxlib's batched linear algebra (a vmap over "
                "hundreds of matrices) can hang on CPU. Import numpyro_lm before running any JAX "
                "computation, or export XLA_FLAGS before starting Python.",
                RuntimeWarning,
                stacklevel=3,
            )
        return "late"
    os.environ["XLA_FLAGS"] = f"{flags} {SCHEDULER_FLAG}".strip()
    return "set"
