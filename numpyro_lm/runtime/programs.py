"""Compiled programs over a model's arguments: one jit cache, batched and sharded on request.

A model's arguments mix arrays (data: traced, so a refit with new data of the same shapes
reuses the compiled program) and other values (plate sizes, flags, ``None``: static, part
of the program). :func:`split_inputs` separates them into a list of arrays and a hashable
:class:`InputKey`; :func:`merge_inputs` puts them back together inside a program.

:func:`program` compiles a pure function ``fn(static..., *arrays, args, kwargs)`` once per
function, static values, argument shapes and XLA options (``jax.jit``'s own cache), for
one data set or, with ``axes``, for a batch of data sets: ``jax.vmap`` over the leading
axis of the arrays marked batched, ``jax.shard_map`` across devices when a mesh is given.
Any pure function of the package or of an adapter can be compiled this way: nothing is
bound to a ``LaplaceMatching`` object.
"""

from __future__ import annotations

import collections
import functools
import warnings
from typing import Callable, NamedTuple, Optional

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from .precision import precise_jit
from .static_data import StaticArray

__all__ = [
    "FAST_COMPILE",
    "LARGE_MODEL",
    "HEAVY_PROGRAM",
    "options_for_work",
    "options_for_repeats",
    "REPEATED_MIN_NUMBERS",
    "NO_LIBRARY_KERNELS",
    "without_library_kernels",
    "long_loop",
    "resolve_compiler_options",
    "BATCH_COMPILE",
    "usable_compiler_options",
    "InputKey",
    "split_inputs",
    "is_traced",
    "merge_inputs",
    "shape_key",
    "program",
    "batch_mesh",
    "in_float64",
]

# XLA options for the small programs of a Laplace fit: LLVM's backend optimisations cost
# several times the compile time and buy little on dense linear algebra of this size;
# XLA:CPU's elemental emitters compile the many small fusions of a log density faster than
# its newer fusion emitters (jaxlib 0.10), and run them as fast.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
# ... and for the programs whose run time is not small next to compiling them: a batch of fits
# (run_many), programs that run many times (a nested fit's inner fits), large models and heavy
# programs (below): LLVM's optimisations on, the elemental emitters kept. XLA's defaults (the
# fusion emitters) cost much more compile time and run no faster: on the Poisson random-effect
# benchmark at N = 100 000 they took 13.6 s of compiling where these take 7.9 s, for the same
# warm call; a nested fit's inner fits at N = 5 000 run 2.7 -> 1.6 s per call with these, cold
# unchanged, where XLA's defaults cost 4 s more to compile.
BATCH_COMPILE = {"xla_cpu_use_fusion_emitters": False}
# ... large models: LARGE_MODEL numbers or more in the latent and observed values
LARGE_MODEL = 100_000
# ... and programs that evaluate the model at many points (the draws and the verdict's
# importance weights) where the numbers evaluated (points x latent and observed numbers) reach
# HEAVY_PROGRAM: optimised, they compile in about the same time and run several times faster
# (the constrained values of 1000 draws of the 5 000-observation Poisson random-effect model:
# 50 ms fast-compiled, 16 ms so, compiled in 0.19 and 0.15 s; the float64 log densities behind
# a large GLMM's verdict likewise)
HEAVY_PROGRAM = 1_000_000


def resolve_compiler_options(options, layout):
    """``options``, or for ``"auto"``: :data:`FAST_COMPILE` for a model smaller than
    :data:`LARGE_MODEL` numbers (latent and observed), else :data:`BATCH_COMPILE`."""
    if isinstance(options, str):
        if options != "auto":
            raise ValueError(f'compiler_options must be a dict, None or "auto", not {options!r}')
        return FAST_COMPILE if layout.size + layout.observed_size < LARGE_MODEL else BATCH_COMPILE
    return options


def options_for_work(options, work: int):
    """``options``, or :data:`BATCH_COMPILE` where they are the automatic :data:`FAST_COMPILE`
    and the program evaluates ``work`` >= :data:`HEAVY_PROGRAM` numbers."""
    return BATCH_COMPILE if options is FAST_COMPILE and work >= HEAVY_PROGRAM else options


REPEATED_MIN_NUMBERS = 1000
"""Latent and observed numbers from which a program that runs many times in one fit is compiled with
:data:`BATCH_COMPILE` (:func:`options_for_repeats`). A nested fit's inner fits, cold / warm s:
a 50-group logistic GLMM (1055 numbers) 4.5 / 1.5 fast-compiled, 4.9 / 0.65 so; the
hierarchical Poisson and beta-binomial models of the nested benchmark (42 and 52 numbers),
interleaved runs on a busy machine, 2.3 / 0.20-0.27 and 4.3-5.2 / 0.30-0.32 fast-compiled, 3.0-3.2 /
0.14-0.16 and 5.4-5.7 / 0.16-0.20 so: a first call 0.7 s slower for 0.1 s a refit."""


NO_LIBRARY_KERNELS = {"xla_cpu_experimental_ynn_fusion_type": ""}
"""XLA options that keep XLA:CPU's library kernels (YNNPACK) out of a program
(:func:`without_library_kernels`). Inside a loop that runs many times over large arrays they
allocate their own buffers at every step, fresh pages the kernel zeroes each time: the verdict's
quadrature over a 10^5-group logistic GLMM (100 steps of 2 draws x 5 nodes x 2 10^6 terms) took
2.0 million page faults and 10.8 s with them, 25 000 and 7.3 s without. Elsewhere they are kept:
without them every program of the Poisson random-effect benchmark at N = 100 000 compiled 0.9 s
longer (cold call 7.4 -> 8.2 s, three runs each)."""


def without_library_kernels(options):
    """``options`` with :data:`NO_LIBRARY_KERNELS` (``None``, XLA's defaults as the user asked, as it is)."""
    return None if options is None else {**options, **NO_LIBRARY_KERNELS}


def long_loop(fn: Callable) -> Callable:
    """Mark ``fn`` as a program whose loop runs many steps over large arrays: :func:`program` compiles
    it :func:`without_library_kernels`."""
    fn.long_loop = True
    return fn


def options_for_repeats(options, numbers: int):
    """``options``, or :data:`BATCH_COMPILE` where they are the automatic :data:`FAST_COMPILE` and
    the model has ``numbers`` >= :data:`REPEATED_MIN_NUMBERS` latent and observed numbers: for a
    program that runs many times in one fit (a nested fit's inner fits: 20-60 calls)."""
    return BATCH_COMPILE if options is FAST_COMPILE and numbers >= REPEATED_MIN_NUMBERS else options


@functools.lru_cache(maxsize=None)
def _known_option(name: str, value) -> bool:
    try:
        jax.jit(lambda x: x, compiler_options={name: value}).lower(0.0).compile()
    except Exception:  # "No such compile option" from a jaxlib without it
        return False
    return True


def usable_compiler_options(options):
    """``options`` less the entries of :data:`FAST_COMPILE` / :data:`BATCH_COMPILE` this jaxlib does not know.

    Checked once per option on first use (after the user has configured JAX), by
    compiling an identity; options a user adds are passed on unchecked.
    """
    if options is None:
        return None
    ours = {**FAST_COMPILE, **BATCH_COMPILE, **NO_LIBRARY_KERNELS}
    return {k: v for k, v in options.items() if not (k in ours and v == ours[k]) or _known_option(k, v)}


class _Static:
    """Hashable wrapper for a non-array model argument (compared by value, else identity)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def _key(self):
        if isinstance(self.value, StaticArray):  # data the model needs concretely: by content
            return (StaticArray, self.value.content_key())
        try:
            hash(self.value)
            return (type(self.value), self.value)
        except TypeError:
            return (type(self.value), id(self.value))

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, _Static) and self._key() == other._key()


def is_traced(x) -> bool:
    """A leaf that is traced (a :class:`~numpyro_lm.runtime.static_data.StaticArray` is static)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)) and not isinstance(x, StaticArray)


class InputKey(NamedTuple):
    """The static part of a pytree of inputs: its structure and non-array leaves."""

    treedef: object
    static: tuple  # one entry per leaf: a _Static, or None where the leaf is an array


def split_inputs(tree):
    """``(arrays, key)``: the array leaves of ``tree`` (traced) and an :class:`InputKey`."""
    leaves, treedef = jax.tree.flatten(tree)
    arrays = [leaf for leaf in leaves if is_traced(leaf)]
    static = tuple(None if is_traced(leaf) else _Static(leaf) for leaf in leaves)
    return arrays, InputKey(treedef, static)


def merge_inputs(arrays, key: InputKey):
    """Inverse of :func:`split_inputs`."""
    arrays = iter(arrays)
    return jax.tree.unflatten(key.treedef, [next(arrays) if s is None else s.value for s in key.static])


def on_device(args: tuple, kwargs: dict, device=None):
    """``(args, kwargs)`` with their NumPy arrays (not the static ones) put on the default
    device once: a program given a host array copies it in on every call (the 10^5-group
    GLMM's 48 MB took 25 ms a call on a CPU, against 6 ms for the program). With ``device``
    (:mod:`.placement`), every traced array is put there (committed, JAX arrays included), so
    that later programs on them run there too."""
    def put(a):
        if device is not None and isinstance(a, (np.ndarray, np.generic, jax.Array)) and is_traced(a):
            return jax.device_put(a, device)
        return jax.device_put(a) if isinstance(a, (np.ndarray, np.generic)) and is_traced(a) else a

    return jax.tree.map(put, (tuple(args), dict(kwargs)))


def shape_key(arrays) -> tuple:
    """Shapes and dtypes of the arrays, with the precision mode: what a compiled program depends on."""
    return tuple((np.shape(a), str(jax.numpy.result_type(a))) for a in arrays) + (jax.config.jax_enable_x64,)


@functools.lru_cache(maxsize=None)
def _compiled(options: Optional[tuple], num_static: int) -> Callable:
    """``jax.jit`` of :func:`_call` with these XLA options (one wrapper per option set), its
    matrix products in full float32 (:mod:`.precision`)."""
    opts = None if options is None else usable_compiler_options(dict(options))
    return precise_jit(_call, static_argnums=tuple(range(6 + num_static)), compiler_options=opts)


def _call(fn, key, axes, mesh, vectorized, num_static, *rest):
    """Run ``fn`` on one data set, or vmap (and shard) it over the batch (see :func:`program`)."""
    static, (inputs, arrays) = rest[:num_static], rest[num_static:]

    def one(inputs, arrays):
        args, kwargs = merge_inputs(inputs, key)
        return fn(*static, *_widened_inside(arrays), args, kwargs)

    if axes is None:
        return one(inputs, arrays)
    if vectorized:
        def mapped(inputs, arrays):
            return fn(*static, axes, key, inputs, *arrays)
    else:
        mapped = jax.vmap(one, in_axes=([0 if batched else None for batched in axes], 0))
    if mesh is not None:
        spec = PartitionSpec(mesh.axis_names[0])
        in_specs = ([spec if batched else PartitionSpec() for batched in axes], spec)
        # check_vma=False: the per-data-set loops start from constants (replicated) and carry
        # batched values; the program is elementwise over the batch, which is what we assert
        mapped = jax.shard_map(mapped, mesh=mesh, in_specs=in_specs, out_specs=spec, check_vma=False)
    return mapped(inputs, arrays)


def _widened_inside(arrays):
    """``arrays`` with their float32 leaves in float64 where the program is traced in float64
    (:func:`in_float64` passes the device's float32 arrays as they are: widening them on the host
    copied each through it, 160 MB for the verdict's 200 draws of 10^5 coordinates); as they are
    otherwise."""
    if not jax.config.jax_enable_x64:
        return arrays
    return jax.tree.map(lambda a: a.astype(np.float64) if getattr(a, "dtype", None) == np.float32 else a, arrays)


def program(fn: Callable, *static, compiler_options=FAST_COMPILE, axes=None, mesh: Optional[Mesh] = None,
            vectorized: bool = False):
    """``fn(*static, *arrays, args, kwargs)`` compiled; returns ``run(arrays, args, kwargs)``.

    ``fn`` and the ``static`` values must be hashable (module-level functions, NamedTuples
    of hashable fields): they key ``jax.jit``'s cache with the argument shapes, so a second
    call with new data of the same shapes runs the compiled program.

    :param axes: ``None`` for one data set; else a tuple with one flag per array leaf of
        ``(args, kwargs)`` (in :func:`split_inputs` order), ``True`` where the leaf carries a
        leading batch axis. ``arrays`` are then batched along their leading axis too, and
        ``fn`` is vmapped over the batch.
    :param mesh: a one-axis :class:`jax.sharding.Mesh`: the batch is split across its
        devices with ``jax.shard_map`` (its size must be a multiple of the mesh's).
    :param vectorized: ``fn`` handles the batch itself, called as ``fn(*static, axes,
        input_key, inputs, *arrays)`` with the array leaves ``inputs`` of ``(args, kwargs)``
        (batched where ``axes`` says) and their :class:`InputKey` (on each device's share
        of the batch where there is a mesh).
    """
    if getattr(fn, "long_loop", False):
        compiler_options = without_library_kernels(compiler_options)
    options = None if compiler_options is None else tuple(sorted(compiler_options.items()))
    jitted = _compiled(options, len(static))

    def run(arrays, args=(), kwargs=None):
        inputs, key = split_inputs((tuple(args), dict(kwargs or {})))
        return jitted(fn, key, axes, mesh, vectorized, len(static), *static, inputs, tuple(arrays))

    return run


def batch_mesh(devices=None) -> Optional[Mesh]:
    """A one-axis mesh ``("batch",)`` over ``devices`` (default: this process's devices),
    or ``None`` where there is only one."""
    devices = list(jax.local_devices() if devices is None else devices)
    if len(devices) < 2:
        return None
    return Mesh(np.array(devices), ("batch",))


def in_float64(run: Callable, arrays, args=(), kwargs=None):
    """``run(arrays, args, kwargs)`` (a :func:`program`) traced and run in float64, its
    floating inputs converted (exactly) from float32, its outputs fetched to the host.

    For the importance weights ``log p - log q``: a float32 ``log p`` of a model with many
    data points carries a round-off of ``eps * sum |terms|`` that can fake a heavy tail of
    the weights (``p`` near a boundary of its support) or hide a real one (a large ``|log p|``).
    """
    with jax.enable_x64(True):
        def up(a, data=False):
            # fresh objects: jaxlib 0.10 reuses an array's float32-mode (int32, float32)
            # conversion by identity in float64 mode ("lax.add requires ... int32, int64" in
            # indexing for a StaticArray; "expected s64[105] but got s32[105]" and "expected
            # f64[400] but got f32[400]" for data an earlier elliptical slice run had converted)
            if _is_floating(a):
                if data:
                    return _widened(a)
                if isinstance(a, jax.Array) and a.dtype == np.float32:
                    return a  # widened inside the program (_widened_inside), not through the host
                return np.array(jax.device_get(a), np.float64)  # np.array copies
            if isinstance(a, StaticArray):
                return a.fresh()
            return a.copy() if isinstance(a, np.ndarray) else a

        # the model's data kept widened (_widened); the fits' own values new each call
        wide = (jax.tree.map(up, arrays), *jax.tree.map(lambda a: up(a, True), (tuple(args), dict(kwargs or {}))))
        try:
            return jax.device_get(run(*wide))
        except (ValueError, jax.errors.JaxRuntimeError) as error:
            if not any(m in str(error) for m in ("Cannot lower jaxpr", "floating point types of different precisions")):
                raise
    # jaxlib 0.10 lowers a NumPy array the model closes over (global data, a Dirichlet's
    # concentration) with the dtype it had when first compiled in float32, which float64
    # programs then reject: as a lowering error, or as XLA's verifier's "mixed precision"
    warnings.warn("the model closes over NumPy arrays (data or constants held in a global or a closure), which "
                  "JAX cannot compile in float64 after float32: this part ran in float32. Pass the data as "
                  "arguments of the model (model(x, y=None), run(key, x, y=y)) and write constants as "
                  "jax.numpy arrays (jnp.asarray) to keep float64 here.", stacklevel=3)
    return jax.device_get(run(arrays, args, kwargs))


_WIDENED: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()
_WIDENED_KEPT = 8
"""Data arrays kept widened (:func:`_widened`): a model's few, and the last models' of a session."""


def _widened(a):
    """The model's data array ``a`` in float64 (in float64 mode). A device array (put there by
    :func:`on_device`) is widened once and kept by identity, with a reference that keeps the
    identity its own, for the :data:`_WIDENED_KEPT` latest: the inner fits and the verdict's
    programs run in float64 on the same data dozens of times a call (the 10^5-group GLMM's
    conversion and copy took 110 ms a call on a CPU). A host array is converted as it is."""
    if not isinstance(a, jax.Array):
        return np.array(a, np.float64)  # on the host: an eager conversion compiles a program per shape
    kept = _WIDENED.get(id(a))
    if kept is not None and kept[0] is a:
        _WIDENED.move_to_end(id(a))
        return kept[1]
    wide = jax.device_put(np.array(jax.device_get(a), np.float64))  # np.array copies
    _WIDENED[id(a)] = (a, wide)
    while len(_WIDENED) > _WIDENED_KEPT:
        _WIDENED.popitem(last=False)
    return wide


def _is_floating(a) -> bool:
    return is_traced(a) and jax.numpy.issubdtype(jax.numpy.result_type(a), jax.numpy.floating)
