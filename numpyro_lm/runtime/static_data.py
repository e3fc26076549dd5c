"""Data the model needs as concrete values: kept static instead of traced.

Array arguments are traced, so that a refit with new data of the same shapes reuses the
compiled programs. Models written for ``MCMC`` (whose default ``jit_model_args=False``
closes over the data) may instead use their data in Python or NumPy: a plate size from
``np.max(group) + 1``, ``np.unique(dept)``, ``int(n)``, boolean indexing by a NumPy mask.
Under tracing these raise one of :data:`CONCRETE_ERRORS`.

:func:`static_where_needed` runs the model's abstract trace with the array arguments
traced; where it raises one of these, it marks the arguments the model needs concretely
as :class:`StaticArray` (a NumPy view keyed by its content): the programs then take them as
compile-time constants, as ``MCMC`` does, and compile once per distinct value. The others
stay traced. Found by trying the trace with all array arguments static, then each one
traced again, keeping those that work traced (one abstract trace per argument).
"""

from __future__ import annotations

import hashlib
from typing import Callable

import jax
import numpy as np

__all__ = ["StaticArray", "CONCRETE_ERRORS", "needs_concrete", "mark_static", "static_positions",
           "static_where_needed"]

CONCRETE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                   jax.errors.TracerIntegerConversionError, jax.errors.NonConcreteBooleanIndexError)
"""What a model raises when it needs a traced argument's value (``TracerBoolConversionError``
is a ``ConcretizationTypeError``); :func:`needs_concrete` also reads JAX's plain
``TypeError`` for a traced shape (``jnp.zeros((n, 2))`` with ``n`` from the data)."""


def needs_concrete(error: BaseException) -> bool:
    """Whether ``error`` says a traced value was used where a concrete one is needed (JAX's
    errors, or a distribution's that asks for a NumPy array: ``CAR(..., is_sparse=True)``'s
    adjacency matrix)."""
    return isinstance(error, CONCRETE_ERRORS) or (isinstance(error, (TypeError, IndexError, ValueError))
                                                  and ("Tracer" in str(error) or "numpy array" in str(error)))


class StaticArray(np.ndarray):
    """A NumPy array the programs take as a constant: hashed and compared by content. Made by
    :func:`mark_static` as a read-only copy, so that its key is computed once: a nested fit looks
    its program up for every batch of inner fits, and hashing a CAR prior's 2500 x 2500
    adjacency took 27 ms each time (two thirds of an inner fit)."""

    def content_key(self) -> tuple:
        """``(shape, dtype, digest of the bytes)``: equal arrays give equal keys."""
        key = getattr(self, "_content_key", None)
        if key is None:
            data = np.ascontiguousarray(self).view(np.ndarray)
            key = (self.shape, self.dtype.str, hashlib.blake2b(data.tobytes(), digest_size=16).hexdigest())
            if not self.flags.writeable:  # a writeable view could change under its key
                self._content_key = key
        return key

    def fresh(self) -> "StaticArray":
        """A new object over the same read-only numbers, with the same key (for a program that
        must not meet an object it saw in another precision: :func:`~numpyro_lm.runtime.programs.in_float64`)."""
        if self.flags.writeable:
            return self.copy()
        out = self.view(StaticArray)
        out._content_key = self.content_key()
        return out


def _is_data(leaf) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic)) and not isinstance(leaf, StaticArray)


def mark_static(args: tuple, kwargs: dict, which) -> tuple:
    """``(args, kwargs)`` with the array leaves at positions ``which`` (in ``jax.tree`` order)
    made :class:`StaticArray`."""
    leaves, treedef = jax.tree.flatten((tuple(args), dict(kwargs)))
    return jax.tree.unflatten(treedef, [_frozen(leaf) if i in which else leaf for i, leaf in enumerate(leaves)])


def _frozen(leaf) -> StaticArray:
    """A read-only copy of ``leaf`` (the caller's array may change after the fit)."""
    out = np.array(leaf, copy=True)
    out.setflags(write=False)
    return out.view(StaticArray)


def static_positions(args: tuple, kwargs: dict) -> frozenset:
    """The ``jax.tree`` positions of the :class:`StaticArray` leaves (what :func:`mark_static` takes)."""
    return frozenset(i for i, leaf in enumerate(jax.tree.leaves((tuple(args), dict(kwargs))))
                     if isinstance(leaf, StaticArray))


def static_where_needed(trace: Callable, args: tuple, kwargs: dict):
    """``(args, kwargs, trace(args, kwargs))`` with the array arguments that the abstract
    ``trace`` needs concretely made :class:`StaticArray` (module docstring); the trace's
    first error where static arguments do not help either."""
    try:
        return args, kwargs, trace(args, kwargs)
    except Exception as first:  # noqa: BLE001 - only JAX's "needs a concrete value" errors are handled
        if not needs_concrete(first):
            raise
        error = first
    static = {i for i, leaf in enumerate(jax.tree.leaves((tuple(args), dict(kwargs)))) if _is_data(leaf)}

    def attempt(which):
        new_args, new_kwargs = mark_static(args, kwargs, which)
        return new_args, new_kwargs, trace(new_args, new_kwargs)

    try:
        out = attempt(static)
    except Exception as second:  # noqa: BLE001
        if not needs_concrete(second):
            raise
        error.add_note("numpyro_lm traces the model with its latent values abstract (as NUTS does): Python control "
                       "flow or NumPy on a latent site's value (if sigma > 1, np.exp(sigma), float(sigma)) needs "
                       "jax.numpy and jax.lax.cond / jnp.where instead; data arguments the model needs as concrete "
                       "values were already tried as constants.")
        raise error from None
    for i in sorted(static):  # traced again where the model lets it be (compiled once per shape)
        try:
            out = attempt(static - {i})
            static = static - {i}
        except Exception:  # noqa: BLE001 - whatever fails traced stays static (its trace above worked)
            pass
    return out
