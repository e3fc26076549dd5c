"""Many data sets in one program: which arguments carry the batch axis, padding, devices.

``LaplaceMatching.run_many`` fits B data sets of one model at once: every array argument
of the model carries a leading batch axis of size B (other arguments are shared). The
per-data-set pipeline (:mod:`numpyro_lm.approximations.joint_fit`) is ``jax.vmap``-ed over that axis and, where
this process has several devices, split across them with ``jax.shard_map``
(:func:`numpyro_lm.runtime.programs.program`); the batch is padded to a multiple of the number of
devices with copies of its first data set, and the padding is dropped from every result.
Users outgrow one device through JAX itself: ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
splits a CPU, and GPUs or TPUs appear in ``jax.devices()``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .programs import batch_mesh, merge_inputs, split_inputs

__all__ = ["Batch", "batch_of", "pad", "pad_inputs", "take", "take_inputs"]


class Batch(NamedTuple):
    """How a batch of data sets is laid out: ``size`` data sets (``padded`` with the padding),
    ``axes`` (per array argument, whether it is batched) and the device ``mesh`` (or None).

    Where several processes share a batch (:mod:`.distributed`), these are one process's share:
    data sets ``offset`` to ``offset + size`` of the ``whole`` batch (``None``: one process holds it
    all), which name the data sets and size the verdict's draws as the whole batch would."""

    size: int
    padded: int
    axes: tuple
    mesh: Optional[object]
    offset: int = 0
    whole: Optional[int] = None

    @property
    def budget_size(self) -> int:
        """The data sets a per-batch work budget is shared by: the whole batch's (padded where one process holds it)."""
        return self.padded if self.whole is None else self.whole

    def share(self, start: int, stop: int, whole: int) -> "Batch":
        """This layout for data sets ``start`` to ``stop`` of ``whole`` (padded for the same mesh)."""
        size = stop - start
        multiple = 1 if self.mesh is None else self.mesh.devices.size
        return self._replace(size=size, padded=size + (-size % multiple), offset=start, whole=whole)


def batch_of(args, kwargs, axes: Optional[tuple] = None, devices=None) -> Batch:
    """The :class:`Batch` of the model arguments; ``axes`` default: every array is batched.

    Refuses batched arrays without a leading axis or with different leading sizes, naming them.
    """
    arrays, key = split_inputs((tuple(args), dict(kwargs or {})))
    axes = tuple(True for _ in arrays) if axes is None else tuple(axes)
    if not any(axes):
        raise ValueError("run_many needs at least one array argument with a leading batch axis (one entry "
                         "per data set); the model's arguments hold no arrays.")
    sizes = {np.shape(a)[0] if np.ndim(a) else None for a, b in zip(arrays, axes) if b}
    if None in sizes or len(sizes) != 1:
        shapes = [np.shape(a) for a, b in zip(arrays, axes) if b]
        raise ValueError(
            f"run_many: every array argument must carry the same leading batch axis (one entry per data "
            f"set); their shapes are {shapes}. Stack the data sets along a new first axis, or pass shared "
            "values as Python numbers or tuples."
        )
    size = sizes.pop()
    if size == 0:
        raise ValueError("run_many: the batch is empty (the array arguments' leading axis has size 0); pass at "
                         "least one data set.")
    mesh = batch_mesh(devices)
    multiple = 1 if mesh is None else mesh.devices.size
    return Batch(size, size + (-size % multiple), axes, mesh)


def pad(tree, batch: Batch):
    """Pad the leading axis of every leaf of ``tree`` to ``batch.padded`` (copies of entry 0)."""
    extra = batch.padded - batch.size
    if extra == 0:
        return tree
    return jax.tree.map(lambda a: jnp.concatenate([a, jnp.repeat(a[:1], extra, axis=0)]), tree)


def pad_inputs(args, kwargs, batch: Batch):
    """``(args, kwargs)`` with their batched arrays padded to ``batch.padded``."""
    arrays, key = split_inputs((tuple(args), dict(kwargs or {})))
    arrays = [pad(a, batch) if b else a for a, b in zip(arrays, batch.axes)]
    return merge_inputs(arrays, key)


def take(tree, index):
    """Entry ``index`` (an int or a slice) of the leading axis of every leaf."""
    return jax.tree.map(lambda a: a[index], tree)


def take_inputs(args, kwargs, axes: tuple, index: int):
    """``(args, kwargs)`` of data set ``index``: its entry of every batched array."""
    arrays, key = split_inputs((tuple(args), dict(kwargs or {})))
    arrays = [a[index] if b else a for a, b in zip(arrays, axes)]
    return merge_inputs(arrays, key)
