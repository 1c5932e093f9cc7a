"""Every use of a private JAX internal lives here, and only here.

Pallas moves fast and the internals below (the TPU interpreter's global
state, its race flag, the registry of device kinds behind
``pltpu.get_tpu_info``) are not public API: they change between releases.
Each accessor is guarded so that a JAX release that moved one of them gives a
clear ``JaxInternalsChanged`` error naming the internal, instead of an
AttributeError deep inside a test. ``tests/test_jax_compat.py`` exercises
every function against the installed JAX, so a release that breaks one fails
CI here first.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # For annotations only. NumPy is imported inside the functions that need it:
    # this module loads with the plugin in every pytest run, and importing NumPy
    # would slow each run down by a tenth of a second.
    import numpy as np


class JaxInternalsChanged(RuntimeError):
    """A private JAX internal that pytest-pallas relies on is not where it was."""


class JaxFeatureOff(UserWarning):
    """A feature of the plugin is off for this run: the JAX internals it needs moved."""


# Features turned off in this process, with why (see optional_feature).
_features_off: dict[str, str] = {}


def feature_off(name: str, error: Exception) -> None:
    """Turn a feature off for the rest of the process, with one warning naming it and why.

    A JAX release newer than the newest tested may move an internal: the
    feature built on it stops, the rest of the run goes on, and the warnings
    summary says which feature is off (once, whichever test met it first).
    """
    if name not in _features_off:
        _features_off[name] = str(error)
        warnings.warn(JaxFeatureOff(f"pytest-pallas: {name} is off on this JAX: {error}"),
                      stacklevel=2)


def features_off() -> dict[str, str]:
    """The features turned off so far in this process, with why."""
    return dict(_features_off)


@contextlib.contextmanager
def optional_feature(name: str, make_context: Callable[[], Any]) -> Iterator[Any]:
    """Enter ``make_context()``, a feature built on JAX internals; yield None if they moved.

    The feature is then off for the rest of the process (:func:`feature_off`).
    """
    if name in _features_off:
        yield None
        return
    try:
        context = make_context()
        value = context.__enter__()
    except JaxInternalsChanged as error:
        feature_off(name, error)
        yield None
        return
    with contextlib.ExitStack() as stack:
        stack.push(context)
        yield value


def _private(module_name: str, attribute: str | None = None) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise JaxInternalsChanged(
            f"pytest-pallas needs {module_name}, which this JAX does not have ({error}); "
            "install a supported jax (see pyproject.toml) or report the new location."
        ) from error
    if attribute is None:
        return module
    try:
        return getattr(module, attribute)
    except AttributeError as error:
        raise JaxInternalsChanged(
            f"pytest-pallas needs {module_name}.{attribute}, which this JAX does not have; "
            "install a supported jax (see pyproject.toml) or report the new location."
        ) from error


_INTERPRETER = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"
_TPU_INFO = "jax._src.pallas.mosaic.tpu_info"
_PALLAS_CALL = "jax._src.pallas.pallas_call"
_XLA_BRIDGE = "jax._src.xla_bridge"


# --- The TPU interpreter's global state ------------------------------------


def races_found() -> bool:
    """Whether the TPU interpreter's race detector flagged a race since the last reset."""
    state = _private(_INTERPRETER, "races")
    return bool(state is not None and getattr(state, "races_found", False))


def reset_interpreter_state() -> None:
    """Drop the TPU interpreter's shared memory, semaphores and race state.

    A kernel that raised while being interpreted leaves this state behind, and
    the next interpreted kernel would then fail; public API since jax 0.7.
    """
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()
    with _observer_lock:
        _running_kernels.clear()
        _kernel_entered.clear()
    _drop_failed_effect_tokens()


def _drop_failed_effect_tokens() -> None:
    # Interpreted kernels are ordered effects (io_callback): each computation takes
    # the previous one's token, so the token of a computation that failed inside the
    # interpreter re-raises its error from every later kernel (a crash in one test
    # showed up as the same crash in the next). Start the next test from no token.
    try:
        tokens = _private("jax._src.dispatch", "runtime_tokens")
        tokens.clear()
    except (JaxInternalsChanged, AttributeError):
        pass


def interpret_params(**fields: Any) -> Any:
    """``pltpu.InterpretParams(**fields)``, with races recorded rather than raised.

    Up to jax 0.10 the race detector records a race (``races_found``) and the
    kernel runs on; from 0.11 it raises inside the interpreter's callback by
    default (``on_race="raise"``), which surfaces as an ``INTERNAL:
    CpuCallback error`` that names neither the rule nor the kernel. The
    plugin fails a racy kernel itself, with a ``data-race`` message, so it
    asks for the recording behaviour wherever this JAX can be told.
    """
    from jax.experimental.pallas import tpu as pltpu

    known = {field.name for field in dataclasses.fields(pltpu.InterpretParams)}
    if fields.get("detect_races") and "on_race" in known:
        fields.setdefault("on_race", "warn")
    return pltpu.InterpretParams(**fields)


def tensorcore_mesh(axis_name: str, num_cores: int) -> Any:
    """A ``pl.kernel`` mesh of ``num_cores`` TensorCores, spelled as the running JAX wants.

    jax 0.10 builds it with ``pltpu.create_tensorcore_mesh`` (its
    ``TensorCoreMesh`` takes an array of devices); from 0.11 that function is
    deprecated and ``pltpu.TensorCoreMesh(axis_name=..., num_cores=...)`` is
    the spelling.
    """
    from jax.experimental.pallas import tpu as pltpu

    mesh_class = getattr(pltpu, "TensorCoreMesh", None)  # not exported by jax 0.10
    if dataclasses.is_dataclass(mesh_class) and "num_cores" in {
            field.name for field in dataclasses.fields(mesh_class)}:
        return mesh_class(axis_name=axis_name, num_cores=num_cores)
    return pltpu.create_tensorcore_mesh(axis_name, num_cores=num_cores)


# --- Device kinds -> chip facts ----------------------------------------------


def chip_versions() -> dict[str, Any]:
    """The chip names JAX knows (``"v5e"``, ``"7x"``, ...) mapped to ``pltpu.ChipVersion``."""
    from jax.experimental.pallas import tpu as pltpu

    return {version.value: version for version in pltpu.ChipVersion}


def chip_version_of_device_kind(device_kind: str) -> Any | None:
    """The ``ChipVersion`` of a device kind string such as ``"TPU v5 lite"``, or None."""
    return _private(_TPU_INFO, "chip_version_from_device_kind")(device_kind)


@contextlib.contextmanager
def device_kind_answers_as(device_kind: str, tpu_info_factory: Callable[[], Any]) -> Iterator[None]:
    """Make ``pltpu.get_tpu_info()`` answer ``tpu_info_factory()`` on devices of ``device_kind``.

    ``get_tpu_info`` looks unknown device kinds up in a private registry; this
    is how a CPU run stands in for a chip so that ``pltpu.emit_pipeline`` and
    ``pl.kernel`` (which ask for the chip's tiling) work on the CPU.
    """
    registry = _private(_TPU_INFO, "registry")
    if not isinstance(registry, dict):
        raise JaxInternalsChanged(
            f"{_TPU_INFO}.registry is no longer a dict; pytest-pallas cannot stand in for a chip "
            "on this JAX."
        )
    missing = object()
    previous = registry.get(device_kind, missing)
    registry[device_kind] = tpu_info_factory
    _clear_tpu_info_caches()
    try:
        yield
    finally:
        if previous is missing:
            registry.pop(device_kind, None)
        else:
            registry[device_kind] = previous
        _clear_tpu_info_caches()


def _clear_tpu_info_caches() -> None:
    # get_tpu_info_for_chip is cached; get_tpu_info is not, but guard both so
    # a release that adds a cache does not serve the previous chip's facts.
    module = _private(_TPU_INFO)
    for name in ("get_tpu_info", "get_tpu_info_for_chip"):
        function = getattr(module, name, None)
        clear = getattr(function, "cache_clear", None)
        if clear is not None:
            clear()


# --- Interpreter fixes ------------------------------------------------------------


def with_tile_padded_bounds(params: Any) -> Any:
    """``params`` (a ``pltpu.InterpretParams``) with reads inside a buffer's tile padding legal.

    On the chip, VMEM and HBM arrays are stored in whole (8, 128) tiles (16 or 32
    sublanes for packed types), so a read past an array's logical end that stays
    inside its last tile reads padding, not another buffer; kernels (tokamax's
    grouped matmul with k = 200) read it and mask it. JAX's TPU interpreter models
    that with ``buffer_bounds="padded"`` (padding filled like uninitialised memory,
    SMEM unpadded); a read past the padding still raises. Unchanged on a JAX
    without that field.
    """
    import dataclasses as _dataclasses

    fields = ({f.name for f in _dataclasses.fields(params)}
              if _dataclasses.is_dataclass(params) else set())
    if "buffer_bounds" not in fields:
        return params
    return _dataclasses.replace(params, buffer_bounds="padded")


@contextlib.contextmanager
def chip_answering_on_this_device(tpu_info_factory: Callable[[], Any]) -> Iterator[None]:
    """Make ``pltpu.get_tpu_info()`` answer on this (CPU) device unless something already does.

    The TPU interpreter's tile padding asks the chip for its tiling.
    """
    from jax.experimental.pallas import tpu as pltpu

    try:
        pltpu.get_tpu_info()
    except Exception:  # noqa: BLE001  # no chip answers here: stand in for one
        import jax

        with device_kind_answers_as(jax.devices()[0].device_kind, tpu_info_factory):
            yield
        return
    yield


@contextlib.contextmanager
def vmapped_grid_semantics_fixed() -> Iterator[None]:
    """Let the TPU interpreter run a vmapped ``pallas_call`` that has ``dimension_semantics``.

    ``jax.vmap`` of a ``pallas_call`` prepends a grid axis; Mosaic's lowering
    gives that axis "parallel" semantics, but JAX's TPU interpreter (0.10.2)
    zips the grid with the user's shorter ``dimension_semantics`` and raises
    ``safe_zip() argument 1 has length 3 but argument 0 has length 4``. Inside
    this context the interpreter treats missing leading axes as "parallel",
    as the compiler does. A no-op for JAX releases where the semantics
    already cover the grid.
    """
    module = _private(_INTERPRETER)
    original = getattr(module, "_get_parallel_dim_semantics", None)
    if original is None:
        yield
        return

    def covering_vmapped_axes(mosaic_params, num_dimensions_in_grid):
        semantics = getattr(mosaic_params, "dimension_semantics", None)
        if semantics is not None and len(semantics) < num_dimensions_in_grid:
            missing = num_dimensions_in_grid - len(semantics)
            return (True,) * missing + tuple(original(mosaic_params, len(semantics)))
        return original(mosaic_params, num_dimensions_in_grid)

    module._get_parallel_dim_semantics = covering_vmapped_axes
    try:
        yield
    finally:
        module._get_parallel_dim_semantics = original


def abort_interpreted_kernels(error: Exception) -> bool:
    """Make every TPU-interpreted kernel that is waiting (semaphore, DMA, barrier) raise ``error``.

    The interpreter's waits poll its shared memory's failure slot every
    0.1 s; filling it (as the interpreter does when one device fails) ends a
    wait that nobody will ever signal. Returns False when no kernel is running.
    """
    module = _private(_INTERPRETER)
    shared_memory = getattr(module, "_shared_memory", None)
    if shared_memory is None:
        return False
    lock = getattr(shared_memory, "lock", None)
    if lock is None or not hasattr(shared_memory, "_failure"):
        raise JaxInternalsChanged(
            "the TPU interpreter's shared memory no longer has a failure slot; "
            "--pallas-timeout cannot stop a hung kernel on this JAX."
        )
    with lock:
        if shared_memory._failure is None:
            shared_memory._failure = error
    barrier = getattr(shared_memory, "barrier", None)
    if barrier is not None:
        barrier.abort()
    return True


# --- Backends ------------------------------------------------------------------


def backends_are_initialized() -> bool:
    """Whether JAX has created its device clients (after which the CPU device count is fixed)."""
    return bool(_private(_XLA_BRIDGE, "backends_are_initialized")())


# --- Observing pallas_call as it is traced -----------------------------------


def pallas_call_primitive() -> Any:
    """The ``pallas_call`` primitive, whose equations carry grid mappings and compiler params."""
    return _private(_PALLAS_CALL, "pallas_call_p")


_CORE = "jax._src.core"
_SOURCE_INFO = "jax._src.source_info_util"

_PARTIAL_EVAL = "jax._src.interpreters.partial_eval"

# (observer, whether it also takes the call's input avals)
_observers: list[tuple[Callable[..., None], bool]] = []
_observer_lock = threading.RLock()
_live_observations = 0
_unobserve: Callable[[], None] | None = None


@contextlib.contextmanager
def observe_pallas_calls(observer: Callable[..., None], *,
                         with_avals: bool = False) -> Iterator[None]:
    """Call ``observer(params)`` with each ``pallas_call`` equation's params as it is traced.

    With ``with_avals=True`` the observer is called ``observer(params, avals)``,
    ``avals`` being the abstract values of the call's operands (shapes and dtypes
    as traced, per device inside ``shard_map``).

    Every ``pallas_call`` is staged into a jaxpr, even an eager one (it binds
    through an inner ``jit``), under ``jit``, ``vmap`` (the batching rule binds
    a new call with a batched grid: the observer sees both) and ``shard_map``.
    The hook sits where tracing asks for the primitive's abstract value,
    before JAX's cache of those, so a call identical to one traced before is
    seen again. A whole function whose trace ``jit`` cached is not traced
    again, though, so it is not seen again: an observer that raises aborts
    the trace, which then is not cached, so a failing kernel fails on every
    call. Observers nest; the hook is removed when the last one leaves.

        with observe_pallas_calls(lambda params: print(params["name"])):
            my_kernel(x)
    """
    global _live_observations, _unobserve
    with _observer_lock:
        if _live_observations == 0:
            _unobserve = _install_observation()
        _live_observations += 1
        entry = (observer, with_avals)
        _observers.append(entry)
    try:
        yield
    finally:
        with _observer_lock:
            _observers[:] = [o for o in _observers if o is not entry]
            _live_observations -= 1
            if _live_observations == 0 and _unobserve is not None:
                _unobserve()
                _unobserve = None


def _notify_observers(params: dict[str, Any], avals: tuple[Any, ...]) -> None:
    for each, with_avals in tuple(_observers):
        if with_avals:
            each(params, avals)
        else:
            each(params)


def _install_observation() -> Callable[[], None]:
    primitive = pallas_call_primitive()
    staging = _private(_PARTIAL_EVAL)
    cached = getattr(staging, "_cached_abstract_eval", None)
    if callable(cached):
        # DynamicJaxprTrace looks this up on every bind it stages.
        def observed_cached_abstract_eval(prim: Any, *avals: Any, **params: Any) -> Any:
            if prim is primitive:
                _notify_observers(params, avals)
            return cached(prim, *avals, **params)

        staging._cached_abstract_eval = observed_cached_abstract_eval
        return lambda: setattr(staging, "_cached_abstract_eval", cached)
    # Without that cache, the primitive's own rule runs on every trace.
    original = getattr(primitive, "abstract_eval", None)
    if not callable(original):
        raise JaxInternalsChanged(
            f"{_PALLAS_CALL}.pallas_call_p has no abstract_eval rule to observe; "
            "pytest-pallas cannot check kernels as they are traced on this JAX."
        )

    def observed_abstract_eval(*avals: Any, **params: Any) -> Any:
        _notify_observers(params, avals)
        return original(*avals, **params)

    primitive.abstract_eval = observed_abstract_eval
    return lambda: setattr(primitive, "abstract_eval", original)


@contextlib.contextmanager
def suspend_pallas_call_observers() -> Iterator[None]:
    """Inside the block, no observer of :func:`observe_pallas_calls` (nor of
    :func:`observe_pallas_call_uses`) is called.

    For tests that run a kernel known to break a static rule in order to see
    what the interpreter does with it, and for the compile check, which binds
    a traced call again on its own (every output of it then counts as used).
    """
    with _observer_lock:
        saved, saved_uses = list(_observers), list(_use_observers)
        _observers.clear()
        _use_observers.clear()
    try:
        yield
    finally:
        with _observer_lock:
            _observers[:0] = saved
            _use_observers[:0] = saved_uses


def pallas_call_params_in(jaxpr: Any) -> Iterator[dict[str, Any]]:
    """The params of every ``pallas_call`` equation in a (closed) jaxpr, nested ones included.

    Descends into every sub-jaxpr an equation carries (``jit``/``pjit``,
    ``closed_call``, ``shard_map``, ``custom_vjp_call``/``custom_jvp_call``,
    ``cond`` branches, ``scan``/``while`` bodies, ...), but not into a
    kernel's own body.
    """
    inner = getattr(jaxpr, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        jaxpr = inner
    for equation in getattr(jaxpr, "eqns", ()):
        if equation.primitive is pallas_call_primitive():
            yield equation.params
            continue
        for value in equation.params.values():
            for sub in _sub_jaxprs(value):
                yield from pallas_call_params_in(sub)


def pallas_call_uses_in(jaxpr: Any) -> Iterator[tuple[dict[str, Any], tuple[bool, ...]]]:
    """Each ``pallas_call`` of a (closed) jaxpr with which of its outputs the program uses.

    An output counts as used when a later equation reads it or the enclosing
    jaxpr returns it (so an output handed back out of a nested ``jit`` is
    used, conservatively). Same traversal as :func:`pallas_call_params_in`.
    """
    inner = getattr(jaxpr, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        jaxpr = inner
    equations = list(getattr(jaxpr, "eqns", ()))
    read = {id(v) for v in getattr(jaxpr, "outvars", ())}
    for equation in equations:
        read.update(id(v) for v in equation.invars)
    for equation in equations:
        if equation.primitive is pallas_call_primitive():
            yield equation.params, tuple(id(v) in read for v in equation.outvars)
            continue
        for value in equation.params.values():
            for sub in _sub_jaxprs(value):
                yield from pallas_call_uses_in(sub)


_use_observers: list[Callable[[dict[str, Any], tuple[bool, ...]], None]] = []
_unobserve_uses: Callable[[], None] | None = None


@contextlib.contextmanager
def observe_pallas_call_uses(
    observer: Callable[[dict[str, Any], tuple[bool, ...]], None],
) -> Iterator[bool]:
    """Inside the block, ``observer(params, used_outputs)`` is called for each pallas_call that a
    jit lowering keeps, with which of its outputs the program uses.

    JAX removes unused values (dead-code elimination) before it lowers a
    program, and asks each equation which inputs it needs given the outputs
    used; this hooks that question for ``pallas_call``. Yields False (and
    observes nothing) when this JAX has no such rule to hook.
    """
    global _unobserve_uses
    try:
        rules = _private(_PARTIAL_EVAL, "dce_rules")
        primitive = pallas_call_primitive()
    except JaxInternalsChanged:
        yield False
        return
    with _observer_lock:
        if not _use_observers:
            original = rules.get(primitive)

            # (used_outs, eqn) up to jax 0.10; (used_outs, live_ins, eqn) from 0.11.
            def observed_dce_rule(used_outs: Any, *rest: Any) -> Any:
                equation = rest[-1]
                for each in tuple(_use_observers):
                    each(equation.params, tuple(bool(u) for u in used_outs))
                if original is None:
                    return [True] * len(equation.invars), equation
                return original(used_outs, *rest)

            rules[primitive] = observed_dce_rule

            def restore() -> None:
                if original is None:
                    rules.pop(primitive, None)
                else:
                    rules[primitive] = original

            _unobserve_uses = restore
        _use_observers.append(observer)
    try:
        yield True
    finally:
        with _observer_lock:
            _use_observers[:] = [o for o in _use_observers if o is not observer]
            if not _use_observers and _unobserve_uses is not None:
                _unobserve_uses()
                _unobserve_uses = None


def _sub_jaxprs(value: Any) -> Iterator[Any]:
    if hasattr(value, "eqns"):
        yield value
    elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
        yield value.jaxpr
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _sub_jaxprs(item)


# What a check needs to know of a pallas_call, in plain Python values, so
# that the checks themselves never touch a JAX internal.


@dataclasses.dataclass(frozen=True)
class BlockOperand:
    """One input or output of a pallas_call, as its BlockSpec maps it."""

    role: str  # "input" or "output"
    index: int  # position among the flat inputs (or outputs)
    origin: str  # Pallas' own name: "args[0]", "outputs[1]", ...
    parameter: str | None  # the kernel parameter that receives the block
    block_dims: tuple[tuple[str, int], ...]  # ("blocked" | "squeezed" | "element" | ..., size)
    array_shape: tuple[int, ...]
    dtype: np.dtype
    memory_space: str  # "vmem", "smem", "any", "hbm", "semaphore", ...
    buffer_count: int | None  # pl.Buffered(n), or None for the default
    revisit_any: bool  # pl.Buffered(revisit=pl.RevisitMode.ANY)
    trivial_window: bool  # whole array and an index map of zeros
    aliased: bool  # output aliased to an input (or input aliased to an output)
    index_map_reads_scalar_prefetch: bool
    index_map_axes: frozenset[int]  # grid axes the index map depends on
    _index_map: Any = dataclasses.field(repr=False, compare=False, default=None)
    _num_grid_axes: int = dataclasses.field(repr=False, compare=False, default=0)

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The block's size along every array dimension (a squeezed dimension counts 1)."""
        return tuple(size for _, size in self.block_dims)

    @property
    def ref_shape(self) -> tuple[int, ...]:
        """The shape of the Ref the kernel sees (squeezed dimensions dropped)."""
        return tuple(size for kind, size in self.block_dims if kind != "squeezed")

    def block_indices(self, grid_points: np.ndarray) -> np.ndarray:
        """The index map evaluated at each row of ``grid_points`` (shape (P, len(grid)))."""
        return _evaluate_index_map(self._index_map, self._num_grid_axes, grid_points)


@dataclasses.dataclass(frozen=True)
class ScratchOperand:
    index: int
    parameter: str | None
    shape: tuple[int, ...]
    dtype: Any  # a numpy dtype, or JAX's semaphore dtype
    memory_space: str


@dataclasses.dataclass(frozen=True)
class ScopedAllocation:
    shape: tuple[int, ...]
    dtype: Any
    memory_space: str
    where: str


@dataclasses.dataclass(frozen=True)
class ScopedRegion:
    """``pl.run_scoped`` allocations live together; children run one after another."""

    allocations: tuple[ScopedAllocation, ...]
    children: tuple[ScopedRegion, ...]


@dataclasses.dataclass(frozen=True)
class PallasCallInfo:
    """A pallas_call equation's params, as plain values."""

    name: str  # the pallas_call's name=, else the kernel function's name
    source: str | None  # "kernel_fn at file.py:12"
    grid: tuple[int | None, ...]  # None for a dynamic grid dimension
    dimension_semantics: tuple[str, ...]  # per grid axis; vmapped axes are "parallel"
    vmapped_axes: tuple[int, ...]
    num_scalar_prefetch: int
    operands: tuple[BlockOperand, ...]
    scratch: tuple[ScratchOperand, ...]
    scoped: ScopedRegion  # pl.run_scoped allocations in the kernel body
    vmem_limit_bytes: int | None
    for_tensor_core: bool  # False for GPU compiler params or a SparseCore mesh

    @property
    def title(self) -> str:
        source = short_source(self.source) if self.source else None
        if source and not source.startswith(self.name):
            return f"'{self.name}' ({source})"
        return f"'{source or self.name}'"


def short_source(kernel: str) -> str:
    """JAX's 'body at /home/me/repo/kernels.py:12' as 'body at kernels.py:12' under the cwd."""
    name, at, path = kernel.rpartition(" at ")
    if not at or not os.path.isabs(path):
        return kernel
    relative = os.path.relpath(path)
    return f"{name} at {path if relative.startswith('..') else relative}"


def describe_pallas_call(params: dict[str, Any]) -> PallasCallInfo:
    """Turn a pallas_call equation's params into a :class:`PallasCallInfo`."""
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    try:
        grid_mapping = params["grid_mapping"]
        kernel_jaxpr = params["jaxpr"]
        block_mappings = tuple(grid_mapping.block_mappings)
        grid = tuple(grid_mapping.grid)
        num_inputs = grid_mapping.num_inputs
        num_index = grid_mapping.num_index_operands
        vmapped = tuple(grid_mapping.vmapped_dims)
        scratch_avals = tuple(grid_mapping.scratch_avals)
    except (KeyError, AttributeError) as error:
        raise JaxInternalsChanged(
            f"pallas_call params no longer carry the grid mapping as pytest-pallas expects "
            f"({error!r}); the TPU-fidelity checks cannot read this JAX's kernels."
        ) from error
    debug_info = getattr(kernel_jaxpr, "debug_info", None)
    source = getattr(debug_info, "func_src_info", None)
    name = params.get("name") or getattr(debug_info, "func_name", None) or "<kernel>"
    arg_names = getattr(debug_info, "arg_names", None)
    if arg_names is not None and len(arg_names) != len(kernel_jaxpr.invars):
        arg_names = None

    def parameter(position: int) -> str | None:
        return None if arg_names is None else arg_names[position]

    compiler_params = params.get("compiler_params")
    tpu_params = isinstance(compiler_params, pltpu.CompilerParams)
    mesh = params.get("mesh")
    for_tensor_core = (compiler_params is None or tpu_params) and (
        mesh is None or type(mesh).__name__ == "TensorCoreMesh"
    )
    user_semantics = compiler_params.dimension_semantics if tpu_params else None
    user_rank = len(grid) - len(vmapped)
    if user_semantics is None:
        user_semantics = ("arbitrary",) * user_rank
    user_semantics = tuple(str(getattr(s, "value", s)) for s in user_semantics)
    if len(user_semantics) == user_rank:
        it = iter(user_semantics)
        semantics = tuple(
            "parallel" if axis in vmapped else next(it) for axis in range(len(grid))
        )
    else:  # Mosaic rejects this mismatch itself; check what can be checked.
        semantics = ("arbitrary",) * len(grid)

    aliases = tuple(params.get("input_output_aliases") or ())
    aliased_inputs = {i - num_index for i, _ in aliases}
    aliased_outputs = {o for _, o in aliases}
    operands = []
    for position, mapping in enumerate(block_mappings):
        is_input = position < num_inputs
        index = position if is_input else position - num_inputs
        index_map = mapping.index_map_jaxpr
        pipeline_mode = getattr(mapping, "pipeline_mode", None)
        operands.append(
            BlockOperand(
                role="input" if is_input else "output",
                index=index,
                origin=str(mapping.origin),
                parameter=parameter(num_index + position),
                block_dims=tuple(_block_dim(dim, pl) for dim in mapping.block_shape),
                array_shape=tuple(mapping.array_aval.shape),
                dtype=mapping.array_aval.dtype,
                memory_space=_memory_space_name(mapping.transformed_block_aval.memory_space),
                buffer_count=getattr(pipeline_mode, "buffer_count", None),
                revisit_any=getattr(pipeline_mode, "revisit", None) == pl.RevisitMode.ANY,
                trivial_window=bool(mapping.has_trivial_window()),
                aliased=(index in aliased_inputs) if is_input else (index in aliased_outputs),
                index_map_reads_scalar_prefetch=_reads_inputs_from(index_map.jaxpr, len(grid)),
                index_map_axes=_axes_reaching_outputs(index_map.jaxpr, len(grid)),
                _index_map=index_map,
                _num_grid_axes=len(grid),
            )
        )
    first_scratch = len(kernel_jaxpr.invars) - len(scratch_avals)
    scratch = tuple(
        ScratchOperand(
            index=i,
            parameter=parameter(first_scratch + i),
            shape=tuple(getattr(aval, "shape", ())),
            dtype=getattr(aval, "dtype", None),
            memory_space=_memory_space_name(getattr(aval, "memory_space", None)),
        )
        for i, aval in enumerate(scratch_avals)
    )
    return PallasCallInfo(
        name=str(name),
        source=source,
        grid=tuple(g if isinstance(g, (int, np.integer)) else None for g in grid),
        dimension_semantics=semantics,
        vmapped_axes=vmapped,
        num_scalar_prefetch=num_index,
        operands=tuple(operands),
        scratch=scratch,
        scoped=ScopedRegion((), _scoped_regions(kernel_jaxpr)),
        vmem_limit_bytes=compiler_params.vmem_limit_bytes if tpu_params else None,
        for_tensor_core=bool(for_tensor_core),
    )


def _block_dim(dim: Any, pl: Any) -> tuple[str, int]:
    if isinstance(dim, pl.Squeezed):
        return ("squeezed", 1)
    kind = {
        "Blocked": "blocked",
        "Element": "element",
        "BoundedSlice": "bounded",
        "Indirect": "indirect",
    }.get(type(dim).__name__)
    if kind is None:
        raise JaxInternalsChanged(f"unknown Pallas block dimension {dim!r}")
    return (kind, int(dim.block_size))


def _memory_space_name(memory_space: Any) -> str:
    if memory_space is None:
        return "vmem"  # Mosaic's choice for a pallas_call block on a TensorCore
    value = str(getattr(memory_space, "value", memory_space))
    return {"default": "vmem", "semaphore_mem": "semaphore"}.get(value, value)


def _reads_inputs_from(jaxpr: Any, first: int) -> bool:
    watched = set(jaxpr.invars[first:])
    if not watched:
        return False
    used = {v for eqn in jaxpr.eqns for v in eqn.invars if not _is_literal(v)}
    used |= {v for v in jaxpr.outvars if not _is_literal(v)}
    return bool(watched & used)


def _axes_reaching_outputs(jaxpr: Any, num_axes: int) -> frozenset[int]:
    # Data flow through the index map: an equation's outputs depend on all
    # its inputs (conservative for higher-order equations).
    depends: dict[Any, frozenset[int]] = {
        var: frozenset({axis}) for axis, var in enumerate(jaxpr.invars[:num_axes])
    }
    for eqn in jaxpr.eqns:
        reached = frozenset().union(
            *(depends.get(v, frozenset()) for v in eqn.invars if not _is_literal(v))
        )
        for out in eqn.outvars:
            depends[out] = reached
    return frozenset().union(
        *(depends.get(v, frozenset()) for v in jaxpr.outvars if not _is_literal(v))
    )


def _is_literal(atom: Any) -> bool:
    return type(atom).__name__ == "Literal"


def _evaluate_index_map(index_map: Any, num_grid_axes: int, grid_points: np.ndarray) -> np.ndarray:
    import jax
    import jax.numpy as jnp
    import numpy as np

    evaluate = _private(_CORE, "eval_jaxpr")
    extra = [
        np.zeros(getattr(aval, "shape", ()), getattr(aval, "dtype", np.int32))
        for aval in index_map.in_avals[num_grid_axes:]
    ]

    def one_point(*axes: Any) -> tuple[Any, ...]:
        return tuple(evaluate(index_map.jaxpr, index_map.consts, *axes, *extra))

    points = np.asarray(grid_points, dtype=np.int32)
    points = points.reshape(max(1, len(points)), num_grid_axes)
    # Index maps are evaluated while the kernel is being traced (an observer
    # runs inside the trace). jax >= 0.11 stages even jnp.asarray under
    # ensure_compile_time_eval there, so evaluate in JAX's eager context.
    eager = getattr(importlib.import_module(_CORE), "eval_context", None)
    with (eager() if eager is not None else contextlib.nullcontext()), \
            jax.ensure_compile_time_eval():
        if num_grid_axes == 0:
            outs = [jnp.broadcast_to(o, (points.shape[0],)) for o in one_point()]
        else:
            outs = jax.vmap(one_point)(*(jnp.asarray(points[:, a]) for a in range(num_grid_axes)))
        columns = [np.broadcast_to(np.asarray(o), (points.shape[0],)) for o in outs]
    if not columns:
        return np.zeros((points.shape[0], 0), dtype=np.int64)
    return np.stack(columns, axis=1).astype(np.int64)


def _scoped_regions(jaxpr: Any) -> tuple[ScopedRegion, ...]:
    regions: list[ScopedRegion] = []
    for eqn in getattr(jaxpr, "eqns", ()):
        if eqn.primitive.name == "run_scoped":
            body = eqn.params["jaxpr"]
            body = getattr(body, "jaxpr", body)
            where = _summarize_source(eqn)
            allocations = tuple(
                ScopedAllocation(
                    shape=tuple(getattr(v.aval, "shape", ())),
                    dtype=getattr(v.aval, "dtype", None),
                    memory_space=_memory_space_name(getattr(v.aval, "memory_space", None)),
                    where=where,
                )
                for v in body.invars
            )
            regions.append(ScopedRegion(allocations, _scoped_regions(body)))
            continue
        nested: list[ScopedRegion] = []
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                nested.extend(_scoped_regions(sub))
        if nested:
            regions.append(ScopedRegion((), tuple(nested)))
    return tuple(regions)


def _summarize_source(eqn: Any) -> str:
    try:
        return "pl.run_scoped at " + str(_private(_SOURCE_INFO, "summarize")(eqn.source_info))
    except Exception:  # noqa: BLE001  # a description only: never fail a check over it
        return "pl.run_scoped"


# What the TPU interpreter knows when a kernel exits: semaphores whose count
# is not back to zero, DMAs started but never waited for, races found.


@dataclasses.dataclass(frozen=True)
class KernelExitState:
    """What one interpreted pallas_call left behind on one device."""

    kernel: str
    device: int
    unbalanced_semaphores: tuple[tuple[int, int, int], ...]  # (semaphore id, core, count)
    pending_dmas: tuple[tuple[int, int, int], ...]  # (semaphore id, core, DMAs never waited)
    race_found: bool

    @property
    def clean(self) -> bool:
        return not (self.unbalanced_semaphores or self.pending_dmas or self.race_found)


_exit_recorders: list[list[KernelExitState]] = []
_exit_hook_error: JaxInternalsChanged | None = None
# How many devices are inside each interpreted kernel now (entered, not yet at the exit check).
_running_kernels: collections.Counter[str] = collections.Counter()
# When each kernel last started (time.monotonic()), for --pallas-timeout's per-kernel clock.
_kernel_entered: dict[str, float] = {}
# Whether this JAX's interpreter lets kernel entries be seen at all.
_kernel_entries_observed = False


def running_interpreted_kernels() -> list[str]:
    """The kernels the TPU interpreter is running now (what a hung test is waiting in).

    Known for kernels lowered after :func:`install_kernel_exit_hook`; a kernel
    that raised stays listed until :func:`reset_interpreter_state`.
    """
    return list(running_interpreted_kernel_ages() or ())


def running_interpreted_kernel_ages() -> dict[str, float] | None:
    """Seconds since each kernel the TPU interpreter is running now started.

    None when kernel entries are not seen: before :func:`install_kernel_exit_hook`,
    or on a JAX whose interpreter hides them (then the caller can only time the
    whole test). Same caveats as :func:`running_interpreted_kernels`.
    """
    if not _kernel_entries_observed:
        return None
    now = time.monotonic()
    with _observer_lock:
        return {kernel: now - _kernel_entered.get(kernel, now)
                for kernel, devices in _running_kernels.items() if devices > 0}


@contextlib.contextmanager
def record_kernel_exits() -> Iterator[list[KernelExitState]]:
    """Collect a :class:`KernelExitState` for each kernel the TPU interpreter finishes.

    The interpreter itself only prints a semaphore left with a non-zero count
    (raising there could hang the other simulated devices), says nothing of a
    DMA started and never waited for in its default "on_wait" DMA mode, and
    keeps the race flag of the last kernel only. This wraps its exit check to
    record all three per kernel and per device; the caller decides to fail.
    Kernels lowered before the hook was first installed (jit caches) keep the
    old exit check: install it early with :func:`install_kernel_exit_hook`.
    """
    global _exit_hook_error
    install_kernel_exit_hook()
    found: list[KernelExitState] = []
    with _observer_lock:
        _exit_recorders.append(found)
    try:
        yield found
    finally:
        with _observer_lock:
            # By identity: recorders are lists, and equal lists are not the same recorder.
            _exit_recorders[:] = [r for r in _exit_recorders if r is not found]
    if _exit_hook_error is not None:
        error, _exit_hook_error = _exit_hook_error, None
        raise error


@contextlib.contextmanager
def suspend_kernel_exit_recording() -> Iterator[None]:
    """Inside the block, recorders already active see no kernel exits (new ones do).

    For tests that run a kernel known to leave a semaphore unbalanced, to see
    what the interpreter does with it, under a harness that records exits.
    """
    with _observer_lock:
        saved = list(_exit_recorders)
        _exit_recorders.clear()
    try:
        yield
    finally:
        with _observer_lock:
            _exit_recorders[:0] = saved


def install_kernel_exit_hook() -> None:
    """Install (once) the wrapper behind :func:`record_kernel_exits`; idle when nobody records."""
    module = _private(_INTERPRETER)
    current = _private(_INTERPRETER, "interpret_pallas_call")
    original_validate = _private(_INTERPRETER, "_validate")
    if getattr(current, "_pytest_pallas_exit_hook", False):
        return
    # Called as each kernel starts on each device. Only names what is running, for
    # --pallas-timeout's message: without it that message names the test instead.
    original_initialize = getattr(module, "_initialize_shared_memory", None)

    def interpret_pallas_call(*args: Any, **kwargs: Any) -> Any:
        debug_info = getattr(kwargs.get("jaxpr"), "debug_info", None)
        kernel = (
            kwargs.get("name")
            or getattr(debug_info, "func_src_info", None)
            or getattr(debug_info, "func_name", None)
            or "<kernel>"
        )
        kernel = short_source(str(kernel))
        # interpret_pallas_call looks _validate up when it stages the exit
        # check, so swapping it for the duration of this call names the kernel.
        module._validate = functools.partial(_validate_and_record, original_validate, kernel)
        if original_initialize is not None:
            module._initialize_shared_memory = functools.partial(
                _enter_kernel, original_initialize, kernel)
        try:
            return current(*args, **kwargs)
        finally:
            module._validate = original_validate
            if original_initialize is not None:
                module._initialize_shared_memory = original_initialize

    global _kernel_entries_observed
    _kernel_entries_observed = original_initialize is not None
    interpret_pallas_call._pytest_pallas_exit_hook = True  # type: ignore[attr-defined]
    interpret_pallas_call.__wrapped__ = current  # type: ignore[attr-defined]
    module.interpret_pallas_call = interpret_pallas_call


def _enter_kernel(original: Callable[..., Any], kernel: str, *args: Any, **kwargs: Any) -> Any:
    with _observer_lock:
        _running_kernels[kernel] += 1
        _kernel_entered[kernel] = time.monotonic()  # a later call of the kernel restarts its clock
    return original(*args, **kwargs)


def _validate_and_record(
    original: Callable[..., Any], kernel: str, token: Any, device_id: Any
) -> Any:
    with _observer_lock:
        if _running_kernels[kernel] > 0:
            _running_kernels[kernel] -= 1
    if _exit_recorders:
        module = _private(_INTERPRETER)
        device = int(device_id)
        unbalanced: list[tuple[int, int, int]] = []
        pending: list[tuple[int, int, int]] = []
        try:
            shared = module._get_shared_memory()
            for semaphore, core in shared.get_sempahores_with_nonzero_count(device):
                count = int(semaphore.count_by_core[core])
                unbalanced.append((int(semaphore.id), int(core), count))
            with shared.lock:
                semaphores = list(shared.sem.values()) + list(shared.fixed_id_sem.values())
            for semaphore in semaphores:
                with semaphore.cv:
                    for core in shared.get_global_core_ids(device):
                        # A task outlives its DMA when another core ran the DMA for it.
                        if waiting := sum(map(_dma_unfinished, semaphore.tasks[core])):
                            pending.append((int(semaphore.id), int(core), waiting))
            races = getattr(module, "races", None)
            race_found = bool(races is not None and getattr(races, "races_found", False))
        except AttributeError as error:
            # Raising inside the interpreter's callback could hang the other
            # simulated devices; record_kernel_exits raises it afterwards.
            global _exit_hook_error
            _exit_hook_error = JaxInternalsChanged(
                f"the TPU interpreter's shared memory changed shape ({error!r}); pytest-pallas "
                "cannot check semaphores at kernel exit on this JAX."
            )
            return original(token, device_id)
        state = KernelExitState(kernel, device, tuple(unbalanced), tuple(pending), race_found)
        with _observer_lock:
            for found in _exit_recorders:
                found.append(state)
    return original(token, device_id)


def _dma_unfinished(task: Any) -> bool:
    # Tasks are bound methods of the interpreter's DMA objects: a read task
    # is done once its DMA has read, any other once the DMA has completed.
    dma = getattr(task, "__self__", None)
    if _moves_no_bytes(dma):
        return False  # a zero-length copy: its wait of 0 bytes returns before it runs
    state = getattr(getattr(dma, "state", None), "name", None)
    if getattr(task, "__name__", None) == "execute_read":
        return state == "STARTED"
    return state != "COMPLETED"


def _moves_no_bytes(dma: Any) -> bool:
    # A DMA whose source or destination is indexed by an empty slice (pl.ds(start, 0), as
    # kernels size the copy of a no-op tile) moves nothing: on the chip it completes at once.
    for transforms in (getattr(dma, "src_transforms", ()), getattr(dma, "dst_transforms", ())):
        for transform in transforms or ():
            for index in getattr(transform, "indices", ()):
                size = getattr(index, "size", None)
                try:
                    if size is not None and int(size) == 0:
                        return True
                except (TypeError, ValueError):
                    continue
    return False


# --- a kernel's own interpreter parameters -------------------------------------------------
#
# pltpu.force_tpu_interpret_mode replaces the interpret= of every pallas_call traced
# under it; a kernel (or a foreign test suite) that passes its own
# pltpu.InterpretParams(...) would silently lose them. This keeps them, merged with
# what the run must add, and records what changed.


@contextlib.contextmanager
def own_interpret_params_kept(
    merge: Callable[[Any, Any], tuple[Any, list[str]]],
    changed: Callable[[str, list[str]], None],
) -> Iterator[bool]:
    """Inside the block, a pallas_call that passes its own ``pltpu.InterpretParams`` under a
    forced TPU interpret mode runs with ``merge(own, forced)[0]``; ``changed(kernel name,
    changes)`` hears what the merge changed. Yields False (and keeps JAX's behaviour:
    forced parameters win) when this JAX's pallas_call cannot be wrapped."""
    from jax.experimental.pallas import tpu as pltpu

    try:
        module = _private(_PALLAS_CALL)
        original = module._pallas_call
        context = _private("jax._src.config", "pallas_tpu_interpret_mode_context_manager")
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    @functools.wraps(original)
    def keeping_own_params(kernel: Any, out_shape: Any, **kwargs: Any) -> Any:
        own = kwargs.get("interpret")
        forced = context.value
        if not (isinstance(own, pltpu.InterpretParams)
                and isinstance(forced, pltpu.InterpretParams)):
            return original(kernel, out_shape, **kwargs)
        merged, changes = merge(own, forced)
        if changes:
            changed(kwargs.get("name") or getattr(kernel, "__name__", "kernel"), changes)
        with pltpu.force_tpu_interpret_mode(None):
            return original(kernel, out_shape, **{**kwargs, "interpret": merged})

    module._pallas_call = keeping_own_params
    try:
        yield True
    finally:
        module._pallas_call = original


@contextlib.contextmanager
def forced_interpreter_when_called() -> Iterator[bool]:
    """Inside the block, a forced TPU interpret mode reaches every ``pallas_call`` traced, even
    one built before it was forced.

    JAX (0.10 to 0.12) reads the forced mode when ``pl.pallas_call(...)`` is *built*: a call
    built at import time, as in Pallas's own ``@functools.partial(pl.pallas_call,
    out_shape=...)`` idiom, kept ``interpret=False`` and failed in a Pallas test with "Only
    interpret mode is supported on CPU backend". Here the forced mode replaces a call's
    ``interpret=False`` when the call is traced, which is what ``force_tpu_interpret_mode``
    promises; a call's own interpreter parameters are left alone. Yields False (JAX's
    behaviour) when the primitive cannot be hooked.
    """
    try:
        primitive = pallas_call_primitive()
        context = _private("jax._src.config", "pallas_tpu_interpret_mode_context_manager")
    except JaxInternalsChanged:
        yield False
        return
    had_own = "bind" in vars(primitive)
    previous = primitive.bind

    def bind(*args: Any, **params: Any) -> Any:
        forced = context.value
        if forced is not None and params.get("interpret") is False:
            params = {**params, "interpret": forced}
        return previous(*args, **params)

    primitive.bind = bind
    try:
        yield True
    finally:
        if had_own:
            primitive.bind = previous
        else:
            del primitive.bind


# --- crashes inside JAX's own interpreters ------------------------------------------------
#
# Some kernels make JAX's Pallas interpreters fail with an error of their own
# (ragged paged attention: "'ReshapeTransform' object has no attribute
# 'indices'" in the TPU interpreter; "MLIR translation rule for primitive
# 'program_id' not found" in the plain one). Such an error says nothing about
# the kernel, and must not read as the user's bug.

_INTERPRETER_SOURCES = (
    "jax/_src/pallas/mosaic/interpret/",  # the TPU interpreter
    "jax/_src/pallas/hlo_interpreter.py",  # the plain interpreter (interpret=True)
    "jax/_src/state/discharge.py",  # the plain interpreter's discharge of kernel state
)
_INTERNAL_ERROR_TYPES = ("AttributeError", "TypeError", "KeyError", "IndexError",
                         "NotImplementedError", "UnboundLocalError", "NameError")
# A ValueError is often the kernel's own (a shape it rejects), so it counts only when
# the interpreter's code raised it: the plain interpreter's discharge of a remote copy
# fails in safe_zip ("argument 2 has length 8 but argument 0 has length 10") on
# tpu-inference's all-gather matmul.
_INTERNAL_WHEN_RAISED_INSIDE = ("ValueError",)
_NO_CPU_RULE = "MLIR translation rule for primitive"


def _in_interpreter(filename: str) -> bool:
    return any(s in filename.replace("\\", "/") for s in _INTERPRETER_SOURCES)


def interpreter_crash(error: BaseException) -> str | None:
    """One line naming the failure if ``error`` is a crash inside one of JAX's Pallas
    interpreters (not a check of theirs, not the kernel's own error); else None."""
    import re
    import traceback

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        if name in _INTERNAL_WHEN_RAISED_INSIDE:
            frames = traceback.extract_tb(current.__traceback__)
            if frames and _in_interpreter(frames[-1].filename):
                first = str(current).strip().splitlines()[0] if str(current).strip() else ""
                return f"{name}: {first} (in {_short_jax_path(frames[-1].filename)})"
        if name in _INTERNAL_ERROR_TYPES or _NO_CPU_RULE in str(current):
            frames = traceback.extract_tb(current.__traceback__)
            where = next((f.filename for f in reversed(frames)
                          if any(s in f.filename.replace("\\", "/") for s in _INTERPRETER_SOURCES)
                          ), None)
            if where is not None or _NO_CPU_RULE in str(current):
                first = str(current).strip().splitlines()[0] if str(current).strip() else ""
                return f"{name}: {first}" + (f" (in {_short_jax_path(where)})" if where else "")
        # The TPU interpreter runs in a host callback: its traceback arrives as text.
        text = str(current)
        if "callback" in text.lower() and any(s in text for s in _INTERPRETER_SOURCES):
            lines = [line for line in text.splitlines() if line.strip()]
            files = [m.group(1) for line in lines
                     if (m := re.match(r'\s*File "([^"]+)"', line))]
            internal = re.compile(r"\s*(" + "|".join(_INTERNAL_ERROR_TYPES) + r"): ")
            last = next((line.strip() for line in reversed(lines) if internal.match(line)), None)
            if last and files and any(s in files[-1] for s in _INTERPRETER_SOURCES):
                return f"{last} (in {_short_jax_path(files[-1])})"
            misjudged = _in_bounds_masked_swap(text)
            if misjudged:
                return misjudged
        current = current.__cause__ or current.__context__
    return None


_MASKED_SWAP = (r"Out-of-bounds masked swap of [^:]*: swapping \[\((.*?)\)\] "
                r"but buffer has shape \(([\d, ]*)\)")


def _in_bounds_masked_swap(text: str) -> str | None:
    """The crash line when the TPU interpreter refused a masked store that is in bounds.

    jax 0.10's ``swap_buffer_content`` marks a mask's out-of-bounds part with
    ``in_bounds_mask[in_bounds_shape[i]:] = False`` for every axis i, which always
    slices axis 0: a masked store of rows 0:8, columns 0:2 into an (8, 4, 128)
    buffer is refused as out of bounds (JAX's ragged paged attention makes one).
    """
    import re

    found = re.search(_MASKED_SWAP, text)
    if not found:
        return None
    shape = [int(size) for size in found.group(2).replace(" ", "").split(",") if size]
    ranges = re.findall(r"slice\((\d+), (\d+), (?:\d+|None)\)|(\d+)", found.group(1))
    if len(ranges) > len(shape):
        return None
    for (start, stop, index), size in zip(ranges, shape):
        if (index and int(index) >= size) or (stop and (int(stop) > size or int(start) > size)):
            return None  # truly out of bounds: the kernel's bug
    return (f"ValueError: {found.group(0)} (in jax/_src/pallas/mosaic/interpret/shared_memory.py:"
            " its masked-store bounds check slices the first axis for every axis)")


def _short_jax_path(path: str) -> str:
    path = path.replace("\\", "/")
    return path[path.index("jax/_src/"):] if "jax/_src/" in path else path


# --- Compiling one traced pallas_call on its own ---------------------------------


def bind_pallas_call(params: dict[str, Any], *args: Any) -> Any:
    """Bind the ``pallas_call`` primitive with a traced call's params, for the TPU compiler.

    ``interpret`` is dropped: a call traced under a forced interpreter records it
    in its params, and the compiler must see the kernel Mosaic would lower.
    """
    return pallas_call_primitive().bind(*args, **{**params, "interpret": False})


def as_compiled_for_the_chip(closed: Any) -> Callable[..., Any]:
    """A function that runs a traced (closed) jaxpr with every ``pallas_call`` in it, nested
    ones included, as Mosaic compiles it: ``interpret`` dropped.

    jax 0.10 reads a forced interpreter when ``pl.pallas_call(...)`` is *built*, not when it
    is called: a pallas_call object made inside a Pallas test keeps the TPU interpreter in
    its params whatever mode is forced when it is traced later, and lowering it for the TPU
    then lowers the interpreter's host callbacks ("the platform for the specified backend
    cpu is different from the lowering platform tpu"), or, for the plain interpreter, the
    kernel as plain XLA with no Mosaic check at all. Takes the arguments flat, as
    ``jax.make_jaxpr`` traced them.
    """
    as_function = _private(_CORE, "jaxpr_as_fun")
    primitive = pallas_call_primitive()

    # The interpreter's host callbacks gave the call (and every jaxpr around it) I/O effects
    # that Mosaic's kernel does not have: each rewritten level drops the effects that went
    # away below it and that nothing else at that level still has.
    def compiled_effects(equation: Any, params: dict[str, Any]) -> Any:
        _, effects = primitive.abstract_eval(*(v.aval for v in equation.invars), **params)
        return effects

    def jaxpr_without(jaxpr: Any) -> tuple[Any, set[Any]]:
        equations, dropped, changed = [], set(), False
        for equation in jaxpr.eqns:
            if equation.primitive is primitive:
                if equation.params.get("interpret") in (False, None):
                    equations.append(equation)
                    continue
                params = {**equation.params, "interpret": False}
                effects = compiled_effects(equation, params)
            else:
                params, gone = {}, set()
                for name, value in equation.params.items():
                    params[name], lost = value_without(value)
                    gone |= lost
                if all(params[n] is equation.params[n] for n in params):
                    equations.append(equation)
                    continue
                effects = set(equation.effects) - gone
            dropped |= set(equation.effects) - set(effects)
            equations.append(equation.replace(params=params, effects=effects))
            changed = True
        if not changed:
            return jaxpr, set()
        dropped -= set().union(*(e.effects for e in equations))
        return jaxpr.replace(eqns=equations, effects=set(jaxpr.effects) - dropped), dropped

    def value_without(value: Any) -> tuple[Any, set[Any]]:
        if hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):  # a ClosedJaxpr
            inner, dropped = jaxpr_without(value.jaxpr)
            return (value if inner is value.jaxpr else value.replace(jaxpr=inner)), dropped
        if hasattr(value, "eqns"):
            return jaxpr_without(value)
        if isinstance(value, (tuple, list)):
            pairs = [value_without(item) for item in value]
            if any(new is not old for (new, _), old in zip(pairs, value)):
                return type(value)(new for new, _ in pairs), set().union(*(d for _, d in pairs))
        return value, set()

    try:
        return as_function(value_without(closed)[0])
    except (AttributeError, TypeError) as error:
        raise JaxInternalsChanged(
            f"jaxprs can no longer be rewritten here ({error!r}); check_kernel lowers the "
            "function as traced") from error


def pallas_call_fingerprint(params: dict[str, Any]) -> str:
    """Text that is equal for two traces of the same kernel with the same grid and params.

    The kernel jaxpr, grid mapping (block shapes, index maps) and compiler params
    print without source locations, so a kernel traced again for another example
    of the same shapes prints the same. The interpreter choice is left out.
    """
    return "\n".join(f"{name}={params[name]!r}" if name != "jaxpr" else f"jaxpr={params[name]}"
                     for name in sorted(params) if name not in ("interpret", "debug"))


def manual_mesh_axes() -> tuple[tuple[str, int], ...]:
    """The mesh axes (name, size) of the ``shard_map`` being traced now; () outside one."""
    import jax

    get_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
    if get_mesh is None:
        return ()
    mesh = get_mesh()
    if mesh is None or getattr(mesh, "empty", True):
        return ()
    manual = set(getattr(mesh, "manual_axes", ()) or ())
    return tuple((str(name), int(size)) for name, size in zip(mesh.axis_names, mesh.axis_sizes)
                 if not manual or name in manual)


def pallas_call_communicates(params: dict[str, Any]) -> bool:
    """Whether a pallas_call's kernel names mesh axes or talks to other devices.

    Mosaic's own test (``MosaicGridMapping.has_communication``): such a kernel
    lowers only inside ``shard_map``, with the mesh.
    """
    names = {"NamedAxisEffect", "CommsEffect"}
    jaxprs = [params.get("jaxpr")]
    grid_mapping = params.get("grid_mapping")
    for mapping in getattr(grid_mapping, "block_mappings", ()):
        jaxprs.append(getattr(getattr(mapping, "index_map_jaxpr", None), "jaxpr", None))
    return any(type(effect).__name__ in names
               for jaxpr in jaxprs for effect in getattr(jaxpr, "effects", ()))


@contextlib.contextmanager
def outside_current_trace() -> Iterator[None]:
    """Run the block as at top level: no enclosing trace, axis environment or shard_map mesh.

    The compile check compiles a kernel while the test's function is being
    traced (inside ``shard_map``, say); that compile is a computation of its
    own and must not see the enclosing trace's state.
    """
    import jax

    core = _private(_CORE)
    context = getattr(core, "trace_ctx", None)
    top_axis_env = getattr(core, "top_axis_env", None)
    if context is None or top_axis_env is None or not hasattr(core, "eval_context"):
        raise JaxInternalsChanged(
            f"{_CORE} no longer has trace_ctx/top_axis_env/eval_context; the TPU compile "
            "check cannot step out of a trace on this JAX.")
    saved_axis_env = context.axis_env
    with core.eval_context(), jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
        context.set_axis_env(top_axis_env)
        try:
            yield
        finally:
            context.set_axis_env(saved_axis_env)


def pallas_call_equations_in(
        jaxpr: Any, mesh_axes: tuple[tuple[str, int], ...] = ()
) -> Iterator[tuple[dict[str, Any], tuple[Any, ...], tuple[tuple[str, int], ...]]]:
    """Each ``pallas_call`` of a (closed) jaxpr: its params, operand avals and enclosing mesh.

    As :func:`pallas_call_params_in`, with the abstract values of the call's
    operands and the axes (name, size) of the ``shard_map`` it sits in, if any.
    """
    inner = getattr(jaxpr, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        jaxpr = inner
    for equation in getattr(jaxpr, "eqns", ()):
        if equation.primitive is pallas_call_primitive():
            yield equation.params, tuple(v.aval for v in equation.invars), mesh_axes
            continue
        axes = mesh_axes
        mesh = equation.params.get("mesh") if equation.primitive.name == "shard_map" else None
        if mesh is not None and hasattr(mesh, "axis_names"):
            axes = tuple((str(n), int(s)) for n, s in zip(mesh.axis_names, mesh.axis_sizes))
        for value in equation.params.values():
            for sub in _sub_jaxprs(value):
                yield from pallas_call_equations_in(sub, axes)


def exported_pallas_call(params: dict[str, Any], avals: Sequence[Any], tpu_info: Any) -> Any:
    """One traced pallas_call, lowered for the TPU with ``jax.export``, ready to pickle.

    Lowering needs no TPU; ``pltpu.get_tpu_info()`` answers for the chip meanwhile.
    An ``Exported`` holds a local function (``_get_vjp``, for differentiation,
    which the schedule does not need) that pickle refuses; it is dropped.
    """
    import jax
    from jax import export
    from jax.experimental.pallas import tpu as pltpu

    def call(*args: Any) -> Any:
        return bind_pallas_call(params, *args)

    shapes = [jax.ShapeDtypeStruct(aval.shape, aval.dtype) for aval in avals]
    host_kind = jax.devices()[0].device_kind
    with (outside_current_trace(), suspend_pallas_call_observers(),
          pltpu.force_tpu_interpret_mode(None),
          device_kind_answers_as(host_kind, lambda: tpu_info)):
        exported = export.export(jax.jit(call), platforms=["tpu"])(*shapes)
    if dataclasses.is_dataclass(exported) and hasattr(exported, "_get_vjp"):
        exported = dataclasses.replace(exported, _get_vjp=None)
    return exported
