"""Several processes, one batch: which data sets each process fits, and how they share the outcome.

Under ``jax.distributed.initialize`` (one process per host, or several on one host) every
process runs the same script with the same batch of data sets. :func:`process_share` gives each
process a contiguous share of the batch, in proportion to its devices (``jax.local_devices()``),
so that every device of every process fits about as many data sets; each process fits its
share on its own devices (:mod:`numpyro_lm.runtime.batch`) and the processes then exchange
what they found with :func:`jax.experimental.multihost_utils.process_allgather` (over the
collectives JAX was started with: gloo or MPI on CPUs, NCCL on GPUs). Nothing here starts,
configures or stops JAX's distributed runtime: that is the user's call, as in any multi-host
JAX program.

:func:`allgather_objects` carries small Python values (an error, the warnings a share raised)
as bytes; the rows of arrays travel the same way, joined in data-set order (:func:`allgather_rows`).
"""

from __future__ import annotations

import pickle
from typing import NamedTuple

import jax
import numpy as np

__all__ = ["Share", "is_multiprocess", "process_share", "allgather_objects", "allgather_rows"]


class Share(NamedTuple):
    """This process's data sets of a batch of ``total``: ``start`` to ``stop`` (``stop`` excluded),
    and every process's ``(start, stop)`` in process order (``bounds``)."""

    start: int
    stop: int
    total: int
    bounds: tuple

    @property
    def size(self) -> int:
        return self.stop - self.start


def is_multiprocess() -> bool:
    """Whether JAX runs several processes (``jax.distributed.initialize`` was called with more than one)."""
    return jax.process_count() > 1


def process_share(total: int, devices_per_process=None, process_index=None) -> Share:
    """The :class:`Share` of process ``process_index`` (default this one) of ``total`` data sets.

    Each device of every process gets ``total // G`` data sets (``G`` devices in all), the first
    ``total % G`` one more; a process's share is its devices' (``devices_per_process``: the
    number of local devices of each process, default from ``jax.devices()``).
    """
    if devices_per_process is None:
        counts = np.zeros(jax.process_count(), int)
        for d in jax.devices():
            counts[d.process_index] += 1
        devices_per_process = counts.tolist()
    process_index = jax.process_index() if process_index is None else process_index
    per_device = np.full(int(sum(devices_per_process)), total // sum(devices_per_process))
    per_device[: total % len(per_device)] += 1
    # each process's share ends where its last device's does
    ends = np.concatenate([[0], np.cumsum(per_device)])[np.concatenate([[0], np.cumsum(devices_per_process)])]
    bounds = tuple((int(a), int(b)) for a, b in zip(ends[:-1], ends[1:]))
    start, stop = bounds[process_index]
    return Share(start, stop, int(total), bounds)


def allgather_objects(value) -> list:
    """Every process's ``value`` (picklable), in process order, on every process."""
    from jax.experimental import multihost_utils

    data = np.frombuffer(pickle.dumps(value), np.uint8)
    lengths = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64))).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: data.size] = data
    everyone = np.asarray(multihost_utils.process_allgather(padded))
    return [pickle.loads(everyone[p, : int(n)].tobytes()) for p, n in enumerate(lengths)]


def allgather_rows(tree):
    """The leaves of ``tree`` (host arrays whose leading axis holds this process's data sets) joined
    along that axis over every process, in data-set order, on every process (one exchange of bytes
    for the whole tree, not one collective per leaf)."""
    everyone = allgather_objects(jax.tree.map(np.asarray, tree))
    return jax.tree.map(lambda *leaves: np.concatenate(leaves), *everyone)
