"""Fixes to JAX's TPU interpreter that the plugin applies while a Pallas test runs.

Part of the compatibility layer (see ``_compat.jax_internals``): every private JAX
internal used here is reached through ``_compat.jax_internals.private_attribute`` and each fix
is a context manager that puts JAX back as it was on exit. Each is tested at
both ends of the supported range in ``tests/test_interpreter_compat.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .jax_internals import (
    PIPELINE_MODULE,
    JaxInternalsChanged,
    attributes_replaced,
    cpu_lowerings,
    emit_pipeline_replaced,
    private_attribute,
)

_CALLBACK = "jax._src.callback"
_INTERPRETER_PACKAGE = "jax._src.pallas.mosaic.interpret"


def _callback_module(callback: Any) -> str:
    """The module of the Python function behind an io_callback's ``_FlatCallback``."""
    function = getattr(callback, "callback_func", callback)
    while isinstance(function, functools.partial):
        function = function.func
    return getattr(function, "__module__", "") or ""


@contextlib.contextmanager
def interpreter_callbacks_on_host_arrays() -> Iterator[bool]:
    """The TPU interpreter's callbacks get their operands as NumPy arrays, not as JAX arrays.

    Why: ``jax.experimental.io_callback`` copies a callback's operands onto the
    CPU device (``device_put``) before calling it. XLA's CPU client copies a
    buffer of 100 KiB or more on its thread pool, whose size is the number of
    simulated devices on a small host. A kernel interpreted on 8 devices holds
    all 8 pool threads in its callbacks while they wait on each other (a remote
    DMA, a barrier), so the copy of a large operand waits for a thread that
    never frees: the run hangs with every thread on a futex, past any timeout
    (``bench_reduce_scatter`` on 8 devices did). The interpreter reads its
    operands with NumPy anyway, so they are handed over as NumPy copies
    instead. Other callbacks are left to JAX. Yields False when this JAX's
    io_callback cannot be wrapped (JAX's behaviour then).
    """
    try:
        module = private_attribute(_CALLBACK)
        original = module.io_callback_impl
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    @functools.wraps(original)
    def io_callback_impl(*args: Any, callback: Any, **params: Any) -> Any:
        if not _callback_module(callback).startswith(_INTERPRETER_PACKAGE):
            return original(*args, callback=callback, **params)
        # Copies: the operands are views of XLA's buffers, valid during the call only.
        results = callback(*(np.array(arg) for arg in args))
        return [np.asarray(result) for result in results]

    module.io_callback_impl = io_callback_impl
    try:
        yield True
    finally:
        module.io_callback_impl = original


# The public builders of kernels over a mesh, which read JAX's forced interpret mode when
# they are built and called, in place of the interpret= the kernel passed.
_MESH_KERNEL_BUILDERS = ("core_map", "kernel")


@contextlib.contextmanager
def own_interpret_params_kept_on_meshes(
    merge: Any, changed: Any,
) -> Iterator[bool]:
    """``pl.core_map`` and ``pl.kernel`` keep a kernel's own ``pltpu.InterpretParams``, as
    ``_compat.pallas_call_hooks.own_interpret_params_kept`` does for ``pallas_call``.

    JAX (0.10 to 0.12) reads ``force_tpu_interpret_mode``'s parameters in place of
    the ``interpret=`` a ``core_map`` passed, so a kernel that allowed HBM in
    ``run_scoped`` ("Cannot allocate HBM in run_scoped") or chose its cores lost
    that under the plugin. Inside the block, such a call is built and traced
    with ``merge(own, forced)[0]``; ``changed(kernel name, changes)`` hears what
    the merge changed. Yields False when JAX's builders cannot be wrapped.
    """
    try:
        pallas = private_attribute("jax.experimental.pallas")
        context = private_attribute("jax._src.config", "pallas_tpu_interpret_mode_context_manager")
    except (JaxInternalsChanged, AttributeError, ImportError):
        yield False
        return
    # Only the module's own attributes: a deprecated one (jax 0.12's core_map) is served by
    # the module's __getattr__, which warns; setting it would bypass that for good.
    originals = {name: vars(pallas)[name] for name in _MESH_KERNEL_BUILDERS
                 if callable(vars(pallas).get(name))}

    def without_forcing(function: Any, params: Any) -> Any:
        # What the builder returns (a decorator, a kernel) reads the forced mode again when
        # called: it runs with the merged parameters alone too.
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            with pltpu.force_tpu_interpret_mode(None):
                result = function(*args, **kwargs)
            return without_forcing(result, params) if callable(result) else result

        return call

    def keeping(name: str, original: Any) -> Any:
        @functools.wraps(original)
        def build(*args: Any, **kwargs: Any) -> Any:
            own, forced = kwargs.get("interpret"), context.value
            if not (isinstance(own, pltpu.InterpretParams)
                    and isinstance(forced, pltpu.InterpretParams)):
                return original(*args, **kwargs)
            merged, changes = merge(own, forced)
            if changes:
                changed(kwargs.get("name") or f"pl.{name}", changes)
            return without_forcing(original, merged)(*args, **{**kwargs, "interpret": merged})

        return build

    with attributes_replaced(pallas, {name: keeping(name, original)
                                      for name, original in originals.items()}):
        yield True


@contextlib.contextmanager
def chip_as_abstract_device(device_kind: str, num_cores: int, *,
                            replace_stand_in: bool = False) -> Iterator[bool]:
    """Inside the block, JAX's "current device" for Pallas is the chip the run stands in for.

    ``pltpu.create_tensorcore_mesh`` and ``pltpu.TensorCoreMesh`` count the
    TensorCores of ``jax.devices()[0]`` (a CPU device has no ``num_cores``: an
    ``AttributeError``) unless the abstract mesh in context names a device;
    ``pltpu.get_tpu_info`` reads the same. This enters an abstract mesh with no
    axes (so it shards nothing: ``empty`` to every sharding rule) whose
    ``AbstractDevice`` has ``device_kind`` (the CPU device's kind, which the
    backend registers as answering for the chip), the chip's ``num_cores`` and
    platform "cpu" (an explicit ``.lower()`` keeps lowering for the CPU). A mesh
    the test already entered is left alone; with ``replace_stand_in`` an empty one
    that stands in for another chip (platform "cpu", as this enters) is replaced,
    so that ``estimate(chip="v5p")`` inside a test standing in for v5e sees v5p's
    cores. Works the same from jax 0.10 to 0.12; yields False where this JAX has
    no abstract device.
    """
    try:
        mesh_lib = private_attribute("jax._src.mesh")
        current = mesh_lib.get_abstract_mesh()
        present = getattr(current, "abstract_device", None)
        ours = (replace_stand_in and current.empty and present is not None
                and getattr(present, "platform", None) == "cpu")
        if (present is not None and not ours) or not current.empty:
            yield False
            return
        device = mesh_lib.AbstractDevice(device_kind=device_kind, num_cores=num_cores,
                                         platform="cpu")
        context = mesh_lib.use_abstract_mesh(
            mesh_lib.AbstractMesh((), (), abstract_device=device))
    except (AttributeError, TypeError) as error:
        raise JaxInternalsChanged(
            f"jax._src.mesh has no abstract device of this shape ({error}); pl.kernel and "
            "TensorCoreMesh cannot see the stand-in chip on this JAX.") from error
    with context:
        yield True


def _empty_and_in_bounds(rnge: tuple[Any, ...], shape: tuple[int, ...]) -> bool:
    """Whether ``rnge`` selects nothing, every start within ``shape`` (an end is in bounds)."""
    empty = False
    for index, size in zip(rnge, shape):
        if isinstance(index, slice):
            start = 0 if index.start is None else int(index.start)
            stop = size if index.stop is None else int(index.stop)
            if start > size:
                return False
            empty = empty or stop <= start
        elif int(index) >= size:
            return False
    return empty


@contextlib.contextmanager
def interpreter_effects_allowed_in_custom_derivatives() -> Iterator[bool]:
    """A TPU-interpreted kernel inside ``jax.custom_vjp`` or ``custom_jvp`` traces and checks.

    In the TPU interpreter, ``pallas_call`` declares the interpreter's callback effects
    (``get_interpret_effects``), which JAX refuses inside a custom derivative: its type check
    (``jax_enable_checks``, on in JAX's tests) and ``custom_vjp``'s remat raise "Effects not
    supported in `custom_vjp`". On the chip the kernel has no effect, and an attention kernel
    under its own ``custom_vjp`` runs. So the interpreter's effect types are allowed in
    custom derivatives while the block runs; yields False where JAX's registries moved.
    """
    try:
        effects = private_attribute("jax._src.effects")
        allowed = effects.custom_derivatives_allowed_effects
        interpret_effects = private_attribute("jax._src.pallas.core", "get_interpret_effects")(
            pltpu.InterpretParams())
        types = allowed._effect_types
    except (JaxInternalsChanged, AttributeError, TypeError):
        yield False
        return
    added = {type(effect) for effect in interpret_effects} - set(types)
    types.update(added)
    try:
        yield True
    finally:
        types.difference_update(added)


@contextlib.contextmanager
def empty_slices_in_bounds() -> Iterator[bool]:
    """An empty slice that starts at a dimension's end (``x.at[pl.ds(3, 0)]`` of a dimension
    of 3) reads and writes nothing in JAX's TPU interpreter, as on the chip, instead of
    raising "entirely out of bounds" (reported as ``[out-of-bounds-access]``).

    Kernels that size the DMA of a no-op tile to zero (tpu-inference's ragged conv1d)
    start such slices at the end of the array. Yields False where the interpreter's
    buffers cannot be wrapped.
    """
    try:
        buffer_class = private_attribute(f"{_INTERPRETER_PACKAGE}.shared_memory", "Buffer")
        original_get, original_set = buffer_class.__getitem__, buffer_class.__setitem__
        normalize = buffer_class._normalize_range
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    def getitem(self: Any, rnge: Any) -> Any:
        full = normalize(self, tuple(rnge))
        if _empty_and_in_bounds(full, tuple(self.shape)):
            return self.content[full]
        return original_get(self, rnge)

    def setitem(self: Any, rnge: Any, value: Any) -> None:
        if _empty_and_in_bounds(normalize(self, tuple(rnge)), tuple(self.shape)):
            return
        original_set(self, rnge, value)

    buffer_class.__getitem__, buffer_class.__setitem__ = getitem, setitem
    try:
        yield True
    finally:
        buffer_class.__getitem__, buffer_class.__setitem__ = original_get, original_set


@contextlib.contextmanager
def zero_byte_waits_return() -> Iterator[bool]:
    """A wait for 0 bytes returns at once in JAX's TPU interpreter with race detection too.

    A zero-length copy never signals its semaphore, so under race detection the semaphore
    has no clock for the waiting core yet, and the interpreter's ``Semaphore.wait`` stopped at
    ``assert clock is not None`` (tpu-inference's ragged conv1d waits for the zero-length DMAs
    of its no-op tiles). On the chip such a wait returns at once and orders nothing. Yields
    False where the interpreter's semaphores cannot be wrapped.
    """
    try:
        semaphore_class = private_attribute(f"{_INTERPRETER_PACKAGE}.shared_memory", "Semaphore")
        original_wait = semaphore_class.wait
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    def wait(self: Any, value: Any, global_core_id: Any, *args: Any, **kwargs: Any) -> Any:
        if (int(value) == 0 and getattr(self, "detect_races", False)
                and getattr(self, "clocks", None) is not None
                and self.clocks[int(global_core_id)] is None):
            return None
        return original_wait(self, value, global_core_id, *args, **kwargs)

    semaphore_class.wait = wait
    try:
        yield True
    finally:
        semaphore_class.wait = original_wait


@contextlib.contextmanager
def memory_space_constraints_accepted() -> Iterator[bool]:
    """An input constrained to SMEM or VMEM (``pltpu.with_memory_space_constraint``) runs in
    JAX's TPU interpreter, as one in HBM does.

    The interpreter strips the memory space of a kernel's operands (its
    ``remove_memory_space`` primitive) and copies each into a buffer of its own, but
    its rule accepts only HBM and ANY and raised "Unsupported memory space: smem"
    for the rest (tokamax's ``gmm_v2`` passes its group sizes to ``pl.kernel`` in
    SMEM). Where an operand lives changes nothing of its value, and the kernel's refs
    take their memory spaces from its block specs, not from this: so any memory space
    is stripped the same way. Yields False where the primitive cannot be reached.
    """
    try:
        primitive = private_attribute(f"{_INTERPRETER_PACKAGE}.interpret_pallas_call",
                             "remove_memory_space_p")
        core = private_attribute("jax._src.core")
        original = primitive.abstract_eval
        memory_space_class = core.MemorySpace
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    def strip(x: Any) -> Any:
        if (isinstance(x, core.ShapedArray) and x.memory_space is not None
                and not isinstance(x.memory_space, memory_space_class)):
            return core.ShapedArray(x.shape, x.dtype)
        return x

    primitive.def_abstract_eval(strip)
    try:
        yield True
    finally:
        primitive.abstract_eval = original


def _selects_nothing(rnge: Any) -> bool:
    return any(isinstance(index, slice) and index.start is not None and index.stop is not None
               and int(index.stop) <= int(index.start) for index in tuple(rnge or ()))


@contextlib.contextmanager
def empty_accesses_race_with_nothing() -> Iterator[bool]:
    """A read or write of no element (a zero-length DMA) races with nothing under race
    detection, as on the chip.

    JAX's race detector (0.10 to 0.12, ``race_detection_state._slices_overlap``) counts
    ``slice(2, 2)`` as overlapping ``slice(2, 3)``: tpu-inference's fused MoE, whose
    all-to-all sends a zero-length copy for an expert no token chose, was reported as
    racing with the copy of the next row. Such an access is not recorded. Yields False
    where the detector cannot be wrapped.
    """
    try:
        state_class = private_attribute(f"{_INTERPRETER_PACKAGE}.race_detection_state",
                               "RaceDetectionState")
        originals = {name: getattr(state_class, name) for name in ("check_read", "check_write")}
        signatures = {name: inspect.signature(method) for name, method in originals.items()}
        if any("rnge" not in signature.parameters for signature in signatures.values()):
            raise AttributeError("no rnge parameter")
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    def skipping_empty(name: str) -> Any:
        original, signature = originals[name], signatures[name]

        @functools.wraps(original)
        def check(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _selects_nothing(signature.bind(self, *args, **kwargs).arguments["rnge"]):
                return None
            return original(self, *args, **kwargs)

        return check

    with attributes_replaced(state_class, {name: skipping_empty(name) for name in originals}):
        yield True


_TPU_PRIMITIVES = "jax._src.pallas.mosaic.primitives"


def _unsigned(bits: int) -> Any:
    return jnp.dtype(f"uint{bits}")


def value_bits(dtype: Any) -> int:
    """The width of ``dtype``'s values (4 for int4, which takes a byte in memory)."""
    return (jnp.finfo(dtype).bits if jnp.issubdtype(dtype, jnp.floating)
            else jnp.iinfo(dtype).bits)


def _pack_elementwise_on_cpu(*xs: Any, packed_dtype: Any) -> Any:
    """``pltpu.pack_elementwise`` as Mosaic computes it: each source narrowed to
    ``packed_dtype`` (float32 to bfloat16 rounds to nearest even; integers keep their low
    bits), the first in the lowest bits of the word."""
    wide_bits, narrow_bits = value_bits(xs[0].dtype), value_bits(packed_dtype)
    word = jnp.zeros(xs[0].shape, _unsigned(wide_bits))
    for position, x in enumerate(xs):
        if jnp.issubdtype(packed_dtype, jnp.floating):
            bits = lax.bitcast_convert_type(x.astype(packed_dtype), _unsigned(narrow_bits))
            bits = bits.astype(_unsigned(wide_bits))
        else:
            bits = lax.bitcast_convert_type(x, _unsigned(wide_bits)) & ((1 << narrow_bits) - 1)
        word = word | (bits << (position * narrow_bits))
    return word


def _unpack_elementwise_on_cpu(x: Any, *, index: int, packed_dtype: Any,
                               unpacked_dtype: Any) -> Any:
    """``pltpu.unpack_elementwise``: the ``index``-th narrow value of each word, widened to
    ``unpacked_dtype`` (a signed integer sign-extended, bfloat16 to float32 exactly)."""
    wide_bits, narrow_bits = value_bits(unpacked_dtype), value_bits(packed_dtype)
    floating = jnp.issubdtype(packed_dtype, jnp.floating)
    word = lax.bitcast_convert_type(x, _unsigned(wide_bits))
    bits = (word >> (index * narrow_bits)) & ((1 << narrow_bits) - 1)
    if floating:
        narrow = lax.bitcast_convert_type(bits.astype(_unsigned(narrow_bits)), packed_dtype)
        return narrow.astype(unpacked_dtype)
    if jnp.issubdtype(packed_dtype, jnp.signedinteger):
        # Move the narrow value's sign bit to the word's and shift back arithmetically.
        shift = wide_bits - narrow_bits
        signed = lax.bitcast_convert_type(bits << shift, jnp.dtype(f"int{wide_bits}"))
        return (signed >> shift).astype(unpacked_dtype)
    return bits.astype(unpacked_dtype)


def _stochastic_round_on_cpu(x: Any, random_bits: Any, *, target_dtype: Any) -> Any:
    """``x`` rounded to one of its two neighbours in ``target_dtype``: up with probability the
    distance from the lower one over the gap, drawn from ``random_bits`` (uint32)."""
    nearest = x.astype(target_dtype)
    as_x = nearest.astype(x.dtype)
    lower = jnp.where(as_x > x, jnp.nextafter(nearest, jnp.finfo(target_dtype).min), nearest)
    upper = jnp.where(as_x < x, jnp.nextafter(nearest, jnp.finfo(target_dtype).max), nearest)
    low, high = lower.astype(x.dtype), upper.astype(x.dtype)
    gap = high - low
    up = jnp.where(gap > 0, (x - low) / jnp.where(gap > 0, gap, 1), 0)
    draw = random_bits.astype(x.dtype) * (1.0 / 2.0 ** 32)
    return jnp.where(jnp.isnan(nearest.astype(x.dtype)), nearest,
                     jnp.where(draw < up, upper, lower))


# Mosaic lowers each to TPU instructions and JAX gives them no CPU rule: a kernel using one
# crashed in the TPU interpreter ("MLIR translation rule for primitive 'pack_elementwise' not
# found for platform cpu").
def _trace_value_on_cpu(value: Any, *, label: str) -> list[Any]:
    """Nothing: the chip adds the scalar to the enclosing xprof trace, which changes no value."""
    del value, label
    return []


# name: (its computation on the CPU, whether it has several results).
_ON_THE_CPU = {
    "pack_elementwise_p": (_pack_elementwise_on_cpu, False),
    "unpack_elementwise_p": (_unpack_elementwise_on_cpu, False),
    # Which neighbour the chip picks for given bits: unchecked; JAX's test_stochastic_round
    # accepts either.
    "stochastic_round_p": (_stochastic_round_on_cpu, False),
    "trace_value_p": (_trace_value_on_cpu, True),
}


def tpu_primitives_on_the_cpu() -> contextlib.AbstractContextManager[bool]:
    """``pltpu.pack_elementwise``, ``unpack_elementwise``, ``stochastic_round`` and
    ``trace_value`` run on the CPU (:data:`_ON_THE_CPU`) while the block runs."""
    return cpu_lowerings(_TPU_PRIMITIVES, _ON_THE_CPU)


_INTERPRET_PALLAS_CALL = f"{_INTERPRETER_PACKAGE}.interpret_pallas_call"


def _broadcast_reads(indexer: Any) -> tuple[Any, list[tuple[int, int]]]:
    """``indexer`` with each zero-stride slice read once, and (result axis, size) of each."""
    slice_class = private_attribute("jax._src.indexing", "Slice")
    indices, broadcasts, axis = [], [], 0
    for index in indexer.indices:
        if isinstance(index, slice_class):
            if index.stride == 0 and int(index.size) > 1:
                broadcasts.append((axis, int(index.size)))
                index = dataclasses.replace(index, size=1, stride=1)
            axis += 1
        elif getattr(index, "shape", ()) != ():  # an array of indices keeps its dimensions
            axis += len(index.shape)
        indices.append(index)
    return dataclasses.replace(indexer, indices=tuple(indices)), broadcasts


@contextlib.contextmanager
def zero_stride_reads_broadcast() -> Iterator[bool]:
    """A load of ``ref[pl.ds(i, n, stride=0)]`` reads element ``i`` ``n`` times, as the chip's
    strided load does, in the TPU interpreter.

    The interpreter turns that slice into ``slice(i, i, 0)``, which selects nothing (and NumPy
    refuses a step of 0): tokamax's grouped matmul broadcasts a row this way. Only the last
    indexer of a load is rewritten; yields False where the interpreter's reader moved.
    """
    try:
        module = private_attribute(_INTERPRET_PALLAS_CALL)
        original = module.get
        private_attribute("jax._src.indexing", "Slice")
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    def broadcasting(reader: Any) -> Any:
        def get(token: Any, device_id: Any, local_core_id: Any, memory_space: Any,
                buffer_id: Any, transforms: Any, *args: Any, **kwargs: Any) -> Any:
            transforms = tuple(transforms) if transforms is not None else ()
            last = transforms[-1] if transforms else None
            indexer, broadcasts = (_broadcast_reads(last) if hasattr(last, "indices")
                                   else (last, []))
            if not broadcasts:
                return reader(token, device_id, local_core_id, memory_space, buffer_id,
                              transforms, *args, **kwargs)

            token, value = reader(token, device_id, local_core_id, memory_space, buffer_id,
                                  (*transforms[:-1], indexer), *args, **kwargs)
            for axis, size in broadcasts:
                value = np.repeat(value, size, axis=axis)
            return token, value

        return get

    # The interpreter's DMAs call get.__wrapped__ (its reader without the error handler):
    # both get the broadcast.
    get = functools.wraps(original)(broadcasting(original))
    get.__wrapped__ = broadcasting(getattr(original, "__wrapped__", original))
    module.get = get
    try:
        yield True
    finally:
        module.get = original


@contextlib.contextmanager
def emit_pipeline_traced_for_the_interpreter() -> Iterator[bool]:
    """A kernel interpreted with ``jax_use_emit_pipeline_primitive`` on runs its
    ``pltpu.emit_pipeline`` loops, where the installed JAX's TPU interpreter has no rule for
    that primitive.

    Before JAX 0.12 the interpreter binds the primitive as it finds it, with its buffer ids
    for refs, and JAX's tracing refuses ("JaxprInputEffect ... does not have a corresponding
    jaxpr input"): JAX's pipeline tests' ``*PrimitiveTest`` classes (62 of them at 0.10.2)
    could not run. The primitive's Mosaic lowering traces the same ``_emit_pipeline`` loop
    that the flag off traces at once, so a pipeline built while the TPU interpreter is
    forced is built with the flag off: what runs is the loop the chip's lowering emits. A
    trace for the chip (the compile check forces no interpreter) still binds the
    primitive, and is judged as it is. JAX 0.12 and later interpret the primitive
    themselves (``emit_pipeline_to_jaxpr``): yields False there, and where the pipeline
    module moved.
    """
    try:
        module = private_attribute(PIPELINE_MODULE)
        original = module.emit_pipeline
        interpret_mode = private_attribute("jax._src.config",
                                           "pallas_tpu_interpret_mode_context_manager")
        flag = private_attribute("jax._src.config", "use_emit_pipeline_primitive")
    except (JaxInternalsChanged, AttributeError):
        yield False
        return
    if hasattr(module, "emit_pipeline_to_jaxpr"):  # the interpreter's own rule (JAX 0.12+)
        yield False
        return
    @functools.wraps(original)
    def emit_pipeline(*args: Any, **kwargs: Any) -> Any:
        if flag.value and interpret_mode.value is not None:
            with flag(False):
                return original(*args, **kwargs)
        return original(*args, **kwargs)

    with emit_pipeline_replaced(emit_pipeline):
        yield True


_THREAD_MAP = f"{_INTERPRETER_PACKAGE}.thread_map"


@contextlib.contextmanager
def core_threads_off_the_kernels_device() -> Iterator[bool]:
    """The computations the TPU interpreter starts for each TensorCore of a two-core chip
    (v4, v5p: ``num_cores_or_threads=2``) run on the last simulated device, not on the default
    one, where the kernel that started them runs.

    Each core's part of a kernel runs as a computation of its own, dispatched from inside the
    kernel's callback (``thread_map._thread_map_callback``, jax 0.10 to 0.12). Dispatched to the
    default device while the test's thread queued more work there, it waited behind that work,
    which waited for the kernel: JAX's paged-attention tests as a v5p hung (every thread in an
    XLA dispatch, no progress for minutes; 2 of 2 runs of 88 ids, at the 18th and the 35th).
    On the last device nothing waits before it, unless the kernel itself runs there (a kernel
    sharded over every device). Yields False where the thread map moved.
    """
    try:
        module = private_attribute(_THREAD_MAP)
        originals = {name: getattr(module, name) for name in ("_thread_map_callback",
                                                              "_run_jaxpr")}
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    def on_the_last_device(function: Any) -> Any:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            # Also the thread pool's threads: JAX's default device is a thread's own setting.
            with jax.default_device(jax.local_devices()[-1]):
                return function(*args, **kwargs)
        return run

    with attributes_replaced(module, {name: on_the_last_device(original)
                                      for name, original in originals.items()}):
        yield True


_INTERPRETER_UTILS = f"{_INTERPRETER_PACKAGE}.utils"


def _chip_poison(dtype: Any) -> Any:
    """The value Mosaic's lowering poisons an integer buffer with: only the top bit set
    (``_poison_memref`` in jax/_src/pallas/mosaic/lowering.py, jax 0.10 to 0.12), which is
    a signed type's minimum and 2**(bits - 1) for an unsigned one."""
    info = jnp.iinfo(dtype)
    return info.min if info.min < 0 else np.asarray(1 << (info.bits - 1)).astype(dtype)[()]


@contextlib.contextmanager
def buffers_poisoned_as_the_chip_poisons() -> Iterator[bool]:
    """With ``pl.enable_poison_buffers`` on (``jax_pallas_poison_buffers``), fresh integer
    memory in the TPU interpreter holds what the chip's poisoned buffers hold: the integer
    with only its top bit set, not the type's maximum.

    JAX's ``tpu_pallas_pipeline_test.py::test_poison_buffers`` (TPU v5 and later in JAX's
    CI) turns the option on and expects an ``emit_pipeline`` output block's unwritten half
    to read ``jnp.iinfo(dtype).min``; JAX's interpreter (``utils.get_uninitialized_value``)
    fills integers with the maximum, and its eight integer cases failed on the CPU. Without
    the option the chip leaves fresh memory as it was, any value is the chip's, and the
    interpreter's maximum stays: an unsigned flag that a kernel assumes starts at 0 reads
    non-zero under both. Floats (NaN) and booleans (True) are the chip's already. The option
    is read where the interpreter asks, on the tracing thread for buffers it allocates; a
    value asked from a callback (tile padding, an out-of-bounds read) sees the option as
    set for the whole process. Yields False where the interpreter's fill moved.
    """
    try:
        module = private_attribute(_INTERPRETER_UTILS)
        original = module.get_uninitialized_value

        option = pl.enable_poison_buffers
    except (JaxInternalsChanged, AttributeError, ImportError):
        yield False
        return

    @functools.wraps(original)
    def get_uninitialized_value(dtype: Any, uninitialized_memory: Any) -> Any:
        if (uninitialized_memory == "nan" and jnp.issubdtype(dtype, jnp.integer)
                and option.value):
            return _chip_poison(dtype)
        return original(dtype, uninitialized_memory)

    with attributes_replaced(module, {"get_uninitialized_value": get_uninitialized_value}):
        yield True
