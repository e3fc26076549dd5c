"""Keep XLA:CPU from deadlocking jaxlib's batched LAPACK kernels, program by program.

Since jaxlib 0.10 the CPU LAPACK kernels (LU, triangular solve, Cholesky, eigh, ... behind
``jnp.linalg``) split a large batch of matrices (at least 2e5 flops of work) into tasks on
XLA's intra-op thread pool and block until they finish (``jax::ParallelBatchMap``). XLA's
runtime runs independent kernels of one program at the same time, each on a pool thread;
when every pool thread is such a kernel, each waits for tasks that no free thread is left to
run, and the process hangs at 0 % CPU. Seen on 2 cores with a vmapped inverse-Wishart map
over 235 4 x 4 matrices and with four independent solves of 300 16 x 16 matrices in one jit
(``tests/runtime/test_xla_flags.py``); native stacks show both pool threads in
``BlockingCounter::Wait`` under ``lapack_sgetrf_ffi`` / ``lapack_strsm_ffi``.

Every program the library compiles (:func:`numpyro_lm.runtime.precision.precise_jit`) is
compiled with :data:`THREADING_OPTIONS`, ``xla_cpu_multi_thread_eigen=False``: the program
gets no intra-op pool, so a LAPACK kernel runs its batch on its own thread and nothing waits
on a pool. It is a compile option of that program alone: nothing process-wide changes, the
import order does not matter, and the user's own programs keep XLA's settings. (The other
remedy, ``--xla_cpu_enable_concurrency_optimized_scheduler=false``, is read only from
``XLA_FLAGS`` when JAX starts: as a compile option it leaves the schedule unchanged, measured.)

Measured on 2 cores it costs nothing and saves a little: warm calls of the Poisson
random-effect benchmark at N = 25 000 0.93 s against 1.3-1.8 s, the logistic GLMM at
J = 1000 and J = 10^4 and the 2000-point GP as fast or faster (``make bench``: the two cores
are better spent on the other work than on splitting one kernel). On a host with many cores a
user who wants XLA's intra-op threads in the library's programs exports
``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false`` (which also avoids the
deadlock) or names ``xla_cpu_multi_thread_eigen`` there; then the library adds nothing.
"""

from __future__ import annotations

import os

__all__ = ["SCHEDULER_FLAG", "THREADING_OPTIONS", "user_chose_threading", "with_threading_options"]

SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
THREADING_OPTIONS = {"xla_cpu_multi_thread_eigen": False}


def user_chose_threading() -> bool:
    """The user's ``XLA_FLAGS`` already keep the batched kernels apart (the scheduler flag) or
    set XLA's intra-op threading themselves: the library leaves their programs' threading alone."""
    flags = os.environ.get("XLA_FLAGS", "")
    return SCHEDULER_FLAG in flags.split() or "xla_cpu_multi_thread_eigen" in flags


def with_threading_options(options):
    """``options`` (a dict or ``None``: XLA's defaults) plus :data:`THREADING_OPTIONS`, unless
    the user chose (:func:`user_chose_threading`) or ``options`` name the option already."""
    options = dict(options or {})
    if not user_chose_threading():
        for name, value in THREADING_OPTIONS.items():
            options.setdefault(name, value)
    return options or None
