"""A batch of joint fits shared by several JAX processes (``run_many`` under ``jax.distributed``).

Every process calls ``run_many`` with the same batch. Each fits its share
(:func:`numpyro_lm.runtime.distributed.process_share`) on its own devices, with the keys and the
draw budget the whole batch would use, so that a data set's fit does not depend on which process
made it. Then the processes exchange, in this order:

1. what went wrong: the first failed data set's error (``on_failure="raise"``) is raised by
   every process, naming the data set by its index in the whole batch; the warnings each share
   raised (failed or unconverged data sets, ``on_failure="warn"``) are repeated by every process;
2. with ``gather="all"``, the fits, their keys, the verdict's draws and weights and the
   curvatures' spectra, from which each process rebuilds the result of the whole batch
   (:class:`~numpyro_lm.approximations.joint.JointResult`), as one process would have made it.
   With ``gather="local"`` each process keeps its share's result (``LaplaceMatching.batch_indices``
   says which data sets), and nothing large moves between hosts.
"""

from __future__ import annotations

import pickle
import warnings

import jax
import numpy as np

from ..runtime.batch import Batch, pad, pad_inputs, take, take_inputs
from ..runtime.distributed import allgather_objects, allgather_rows, process_share
from .joint import JointResult

__all__ = ["GATHER", "fit_across_processes"]

GATHER = ("all", "local")


def fit_across_processes(options, info, batch: Batch, rng_key, args, kwargs, init_params, compiler_options,
                         on_failure: str, gather: str = "all") -> JointResult:
    """The joint fits of ``batch`` (the whole batch, unpadded arguments) across every process
    (module docstring): the whole batch's :class:`JointResult` on every process, or this
    process's share's (``gather="local"``; ``gather`` is one of :data:`GATHER`, as ``run_many`` checked)."""
    if batch.size < jax.process_count():
        raise ValueError(f"run_many across {jax.process_count()} processes needs at least one data set per process; "
                         f"the batch holds {batch.size}. Pass more data sets, or run fewer processes.")
    if batch.mesh is not None and any(d.process_index != jax.process_index() for d in batch.mesh.devices.flat):
        raise ValueError("run_many across processes: devices= must be this process's own (jax.local_devices()); "
                         "each process fits its share of the batch on its own devices.")
    share = process_share(batch.size)
    local = batch.share(share.start, share.stop, batch.size)
    part = slice(share.start, share.stop)
    local_args, local_kwargs = pad_inputs(*take_inputs(args, kwargs, batch.axes, part), local)
    local_init = None if init_params is None else pad(take(init_params, part), local)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = options.fit_batch(info, local, rng_key, local_args, local_kwargs, local_init, compiler_options,
                                       on_failure)
            parts = _parts(result) if gather == "all" else None
            error = None
        except Exception as raised:  # noqa: BLE001 - every process must learn of it, or the others wait forever
            result, parts, error = None, None, raised
    errors = allgather_objects(_portable(error))
    said = allgather_objects([(w.category, str(w.message)) for w in caught])
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    for category, message in (w for each in said for w in each):
        warnings.warn(message, category, stacklevel=4)
    if gather == "local":
        return result
    return _whole_result(result, batch, allgather_rows(parts), rng_key, args, kwargs, compiler_options)


def _portable(error):
    """``error`` as it can travel between processes (pickled), or a ``ValueError`` with its text."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - an exception whose arguments do not pickle
        return ValueError(f"{type(error).__name__}: {error}")


def _parts(result: JointResult) -> dict:
    """What the whole batch's result needs of this share (host arrays, one row per data set):
    the fit, its keys, the verdict's draws and weights and the curvatures' spectra."""
    n = result.num_diagnostic_samples
    log_p, log_q, _ = result.weights()
    samples, flat = result.draws(n)
    fit, keys, samples, flat = jax.device_get(result.unpad((result.fit, result.keys, samples, flat)))
    return {"fit": fit, "keys": keys, "samples": samples, "flat": flat, "log_p": log_p, "log_q": log_q,
            "spectrum": result._spectrum_and_scaled()}


def _whole_result(local: JointResult, batch: Batch, parts: dict, rng_key, args, kwargs,
                  compiler_options) -> JointResult:
    """The whole batch's result from every share's ``parts`` (in data-set order), its draws,
    weights and spectra already made: the same object one process fitting the batch would hold."""
    whole = batch._replace(whole=batch.size)  # the verdict's draw budget, as each share used it
    args, kwargs = pad_inputs(args, kwargs, whole)
    fit, keys = (pad(jax.device_put(parts[k]), whole) for k in ("fit", "keys"))
    result = JointResult(local.info, local.options, args, kwargs, rng_key, keys, fit, local.num_samples,
                         compiler_options, whole)
    n = local.num_diagnostic_samples
    result._num_diagnostic_samples = n
    result._draws[n] = pad(jax.device_put((parts["samples"], parts["flat"])), whole)
    result.set_weights(n, parts["log_p"], parts["log_q"])
    result._spectrum = tuple(np.asarray(a) for a in parts["spectrum"])
    return result
