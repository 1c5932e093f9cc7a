"""GPU kernels on the CPU: which kernels are GPU kernels, JAX's GPU interpreter and its state.

A Pallas GPU kernel says what it is in its traced call: Mosaic GPU compiler parameters
(``plgpu.CompilerParams``) or a GPU mesh (``plgpu.kernel``, ``pl.core_map`` over a
``plgpu.Mesh``), or Triton compiler parameters. Without a GPU, JAX can run the first kind
in its GPU interpreter (``InterpretGPUParams``, private: simulated GMEM and SMEM, threads,
barriers, TMA, NaN-poisoned memory, race detection) and the second in the plain
interpreter (``interpret=True``). Neither kind may meet the TPU interpreter: it asserts
that the compiler parameters are Mosaic TPU's, or fails on ``MemorySpace.GMEM``.

The plugin forces the TPU interpreter with JAX's one interpret-mode setting
(``pallas_tpu_interpret_mode_context_manager``), which every entry point reads when a
kernel is built. :func:`gpu_kernels_routed` changes that setting, for the one call that
builds a GPU kernel, to the interpreter that kernel needs, and routes a call built
before (with ``interpret=False``) where it is bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

from . import jax_internals
from .jax_internals import PALLAS_CALL_MODULE, JaxInternalsChanged

MOSAIC_GPU = "mosaic_gpu"
TRITON = "triton"

# Where JAX keeps InterpretGPUParams: jax 0.10.2 to 0.12 (mosaic_gpu/interpret/params.py);
# later JAX source moves it beside the TPU interpreter's utilities.
_PARAMS_HOMES = (
    "jax._src.pallas.mosaic_gpu.interpret.params",
    "jax._src.pallas.mosaic.interpret.utils",
)
_CALLBACKS = "jax._src.pallas.mosaic_gpu.interpret.gpu_callbacks"
_CONFIG = "jax._src.config"

# JAX's GPU interpreter takes each operand whole: it asserts that every BlockSpec is the
# trivial window (jax 0.10.2 to 0.12, mosaic_gpu/interpret/interpret_pallas_call.py).
BLOCKED_GRID_LIMIT = (
    "JAX's GPU interpreter runs only whole-array blocks (no BlockSpec index maps); this "
    "Mosaic GPU pallas_call has blocked operands, so it runs in the plain interpreter, "
    "which checks its values but not its SMEM, barriers or races"
)


def kernel_target(compiler_params: Any = None, mesh: Any = None) -> str | None:
    """``"mosaic_gpu"``, ``"triton"`` or None (not a GPU kernel), from a kernel's compiler
    parameters and mesh, read by the module of their types (no GPU module is imported)."""
    for value in (compiler_params, mesh):
        if value is None:
            continue
        module = type(value).__module__
        if module.startswith("jax._src.pallas.mosaic_gpu"):
            return MOSAIC_GPU
        if module.startswith("jax._src.pallas.triton"):
            return TRITON
    return None


# Where Pallas's GPU and TPU kernels are written from (public modules, and their homes).
_GPU_MODULES = ("jax.experimental.pallas.mosaic_gpu", "jax.experimental.pallas.triton",
                "jax.experimental.pallas.ops.gpu", "jax._src.pallas.mosaic_gpu",
                "jax._src.pallas.triton")
_TPU_MODULES = ("jax.experimental.pallas.tpu", "jax.experimental.pallas.ops.tpu",
                "jax._src.pallas.mosaic")


def module_writes_gpu_kernels(module: Any) -> bool:
    """Whether a test module's names come from Pallas's GPU modules (``plgpu``, a Triton
    kernel of ``pallas.ops.gpu``) and none from its TPU ones, read from its globals."""
    if module is None:
        return False
    homes = set()
    for value in list(vars(module).values()):
        name = value.__name__ if isinstance(value, types.ModuleType) else getattr(
            value, "__module__", None)
        if isinstance(name, str) and name.startswith("jax"):
            homes.add(name)

    def under(prefixes: tuple[str, ...]) -> bool:
        return any(home == prefix or home.startswith(prefix + ".")
                   for home in homes for prefix in prefixes)

    return under(_GPU_MODULES) and not under(_TPU_MODULES)


def call_target(params: dict[str, Any]) -> str | None:
    """:func:`kernel_target` of one traced ``pallas_call`` equation's params."""
    return kernel_target(params.get("compiler_params"), params.get("mesh"))


def tpu_kernels_only(observer: Callable[..., None]) -> Callable[..., None]:
    """``observer`` of ``pallas_call`` params (and more arguments), deaf to GPU kernels: the
    TPU rules and the TPU compiler never judge a Mosaic GPU or Triton kernel."""

    @functools.wraps(observer, updated=())  # an observer may be an object (PallasCallChecker)
    def observe(params: dict[str, Any], *rest: Any) -> None:
        if call_target(params) is None:
            observer(params, *rest)

    return observe


def gpu_params_class() -> Any:
    """JAX's ``InterpretGPUParams`` class; raises ``JaxInternalsChanged`` if this JAX has none."""
    for home in _PARAMS_HOMES:
        try:
            found = getattr(jax_internals.private_attribute(home), "InterpretGPUParams", None)
        except JaxInternalsChanged:
            continue
        if found is not None:
            return found
    raise JaxInternalsChanged(
        "JAX's GPU interpreter (InterpretGPUParams) is in none of "
        f"{', '.join(_PARAMS_HOMES)}; Mosaic GPU kernels cannot be interpreted on the CPU "
        "with this JAX.")


def is_gpu_params(value: Any) -> bool:
    return type(value).__name__ == "InterpretGPUParams"


def make_gpu_params(*, detect_races: bool) -> Any:
    """``InterpretGPUParams`` with NaN-poisoned memory, and race detection when asked for.

    Races are recorded, not raised (``on_race="warn"`` where this JAX has the field, as
    ``jax_internals.interpret_params`` asks of the TPU interpreter): from jax 0.11 the
    detector raises inside the interpreter's callback by default, which names neither the
    rule nor the kernel; the plugin fails a racy kernel itself, naming both.
    """
    cls = gpu_params_class()
    fields = {"detect_races": detect_races, "uninitialized_memory": "nan"}
    if detect_races and "on_race" in {field.name for field in dataclasses.fields(cls)}:
        fields["on_race"] = "warn"
    return cls(**fields)


def has_whole_array_blocks(params: dict[str, Any]) -> bool:
    """Whether every operand of a traced ``pallas_call`` is one whole-array block."""
    mapping = params.get("grid_mapping")
    blocks = getattr(mapping, "block_mappings", ())
    try:
        return all(block.has_trivial_window() for block in blocks)
    except AttributeError:
        return True


@dataclasses.dataclass
class RoutedKernel:
    """One GPU kernel this test ran on the CPU, and where."""

    name: str
    target: str  # MOSAIC_GPU or TRITON
    interpreter: str  # "gpu" or "plain"
    note: str = ""


def _interpret_setting() -> Any:
    return jax_internals.private_attribute(_CONFIG, "pallas_tpu_interpret_mode_context_manager")


@contextlib.contextmanager
def _interpret_mode(setting: Any, value: Any) -> Iterator[None]:
    previous = setting.swap_local(value)
    try:
        yield
    finally:
        setting.set_local(previous)


_MPMD = "jax._src.pallas.mpmd"
_HELPERS = "jax._src.pallas.helpers"


@contextlib.contextmanager
def gpu_kernels_routed(gpu_params: Any, routed: Callable[[RoutedKernel], None],
                       judge: Callable[[str, Any], None] | None = None) -> Iterator[None]:
    """Inside the block (under a forced TPU interpret mode), GPU kernels run in the
    interpreter that can run them: Mosaic GPU in ``gpu_params``'s GPU interpreter (a kernel
    with blocked operands, which it cannot run, in the plain one), Triton in the plain one.
    A kernel's own ``InterpretGPUParams`` is kept (with race detection added when
    ``gpu_params`` has it). ``routed`` hears each kernel; ``judge(name, jaxprs)`` sees each
    Mosaic GPU kernel's jaxprs first and may raise. Raises ``JaxInternalsChanged`` when the
    entry points moved.

    Hooked: ``pallas_call`` where it is built (JAX reads the interpret setting there, and
    keeps a GPU-interpreted kernel's ref transforms) and where it is bound (a call built
    before the run forced an interpreter); ``mpmd_map`` (``plgpu.kernel``, ``pl.kernel`` and
    ``pl.core_map`` over a GPU mesh) where it is bound; ``pl.kernel``'s builder, so that a
    ``plgpu.kernel`` keeps its own ``InterpretGPUParams``.
    """
    module = jax_internals.private_attribute(PALLAS_CALL_MODULE)
    primitive = jax_internals.pallas_call_primitive()
    setting = _interpret_setting()
    original_call = getattr(module, "_pallas_call", None)
    if not callable(original_call) or not hasattr(setting, "swap_local"):
        raise JaxInternalsChanged(
            f"{PALLAS_CALL_MODULE}._pallas_call or JAX's interpret-mode setting moved; GPU kernels "
            "cannot be routed to JAX's GPU interpreter on this JAX.")
    restore: list[Callable[[], None]] = []

    def chosen(target: str, own: Any) -> Any:
        if target == TRITON or (gpu_params is None and not is_gpu_params(own)):
            return True  # no GPU interpreter on this JAX: the plain one
        if is_gpu_params(own):
            if gpu_params is not None and gpu_params.detect_races and not own.detect_races:
                # The run's --pallas-detect-races on a kernel's own params: recorded as the
                # run records every race (a kernel that asked for races itself keeps its own
                # on_race, and reads its verdict itself).
                extra = ({"on_race": gpu_params.on_race} if hasattr(gpu_params, "on_race")
                         and hasattr(own, "on_race") else {})
                return dataclasses.replace(own, detect_races=True, **extra)
            return own
        # The suite's written-output property runs a kernel on zeroed memory too.
        forced = setting.value
        fill = getattr(forced, "uninitialized_memory", None)
        if (fill is not None and not is_gpu_params(forced)
                and fill != gpu_params.uninitialized_memory):
            return dataclasses.replace(gpu_params, uninitialized_memory=fill)
        return gpu_params

    def forced_to(target: str, interpret: Any) -> Any:
        # interpret=False: built before the run forced an interpreter; TPU params: forced.
        if interpret is True and target == TRITON:
            return True
        return interpret if is_gpu_params(interpret) else chosen(target, None)

    def under(interpret: Any, function: Any) -> Any:
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            with _interpret_mode(setting, interpret):
                result = function(*args, **kwargs)
            return under(interpret, result) if callable(result) else result

        return call

    @functools.wraps(original_call)
    def routing_call(kernel: Any, out_shape: Any, **kwargs: Any) -> Any:
        target = kernel_target(kwargs.get("compiler_params"), kwargs.get("mesh"))
        if target is None or setting.value is None:
            return original_call(kernel, out_shape, **kwargs)
        interpret = chosen(target, kwargs.get("interpret"))
        # JAX reads the setting as it builds the call; a GPU-interpreted call also keeps its
        # kernel's ref transforms then.
        with _interpret_mode(setting, interpret):
            return original_call(kernel, out_shape, **{**kwargs, "interpret": interpret})

    def hook_bind(prim: Any, rewrite: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        had_own = "bind" in vars(prim)
        previous = prim.bind

        def bind(*args: Any, **params: Any) -> Any:
            if setting.value is not None:
                params = rewrite(params)
            return previous(*args, **params)

        prim.bind = bind

        def undo() -> None:
            if had_own:
                prim.bind = previous
            else:
                del prim.bind

        restore.append(undo)

    def rewrite_pallas_call(params: dict[str, Any]) -> dict[str, Any]:
        target = call_target(params)
        if target is None:
            return params
        interpret, note = forced_to(target, params.get("interpret")), ""
        if is_gpu_params(interpret) and not has_whole_array_blocks(params):
            interpret, note = True, BLOCKED_GRID_LIMIT
        params = {**params, "interpret": interpret}
        if not is_gpu_params(interpret):
            params.pop("kernel_arg_transforms", None)
        name = jax_internals.kernel_name(params)
        if judge is not None and target == MOSAIC_GPU:
            judge(name, (params.get("jaxpr"),))
        routed(RoutedKernel(name, target, "gpu" if is_gpu_params(interpret) else "plain", note))
        return params

    def rewrite_mpmd_map(params: dict[str, Any]) -> dict[str, Any]:
        meshes = params.get("meshes") or ()
        target = next((t for mesh in meshes if (t := kernel_target(
            params.get("compiler_params"), mesh)) is not None), None)
        if target is None:
            return params
        interpret = forced_to(target, params.get("interpret"))
        name = jax_internals.kernel_name(params)
        if judge is not None and target == MOSAIC_GPU:
            judge(name, tuple(params.get("jaxprs") or ()))
        routed(RoutedKernel(name, target, "gpu" if is_gpu_params(interpret) else "plain"))
        return {**params, "interpret": interpret}

    try:
        mpmd_primitive = jax_internals.private_attribute(_MPMD, "mpmd_map_p")
    except JaxInternalsChanged:
        mpmd_primitive = None  # no mpmd_map: GPU meshes lower through pallas_call
    try:
        helpers = jax_internals.private_attribute(_HELPERS)
        original_kernel = helpers.kernel
    except (JaxInternalsChanged, AttributeError):
        helpers = original_kernel = None

    module._pallas_call = routing_call
    restore.append(lambda: setattr(module, "_pallas_call", original_call))
    hook_bind(primitive, rewrite_pallas_call)
    if mpmd_primitive is not None:
        hook_bind(mpmd_primitive, rewrite_mpmd_map)
    if original_kernel is not None:
        @functools.wraps(original_kernel)
        def routing_kernel(*args: Any, **kwargs: Any) -> Any:
            target = kernel_target(kwargs.get("compiler_params"), kwargs.get("mesh"))
            if target is None or setting.value is None:
                return original_kernel(*args, **kwargs)
            interpret = chosen(target, kwargs.get("interpret"))
            return under(interpret, original_kernel)(*args, **{**kwargs, "interpret": interpret})

        helpers.kernel = routing_kernel
        restore.append(lambda: setattr(helpers, "kernel", original_kernel))
    try:
        yield
    finally:
        for undo in reversed(restore):
            undo()


_JAX_GPU_OPS = "jax/experimental/pallas/ops/gpu/"


def gpu_module_assertion(error: BaseException) -> str | None:
    """One line if ``error`` is an assertion of one of JAX's shipped GPU kernel modules
    (``jax.experimental.pallas.ops.gpu``) about the host, raised before any kernel is built
    (``attention_mgpu``: ``assert cuda_versions is not None`` on a CPU-only jaxlib)."""
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, AssertionError):
            frames = traceback.extract_tb(current.__traceback__)
            if frames and _JAX_GPU_OPS in frames[-1].filename.replace("\\", "/"):
                last = frames[-1]
                return (f"JAX's GPU kernel module {os.path.basename(last.filename)} needs a GPU "
                        f"build of jaxlib: it asserts `{(last.line or '').strip()}` (line "
                        f"{last.lineno}) before building its kernel")
        current = current.__cause__ or current.__context__
    return None


def abort_gpu_waits() -> bool:
    """Make every barrier wait of a GPU-interpreted kernel end with an error (for
    ``--pallas-timeout``). Returns False when no GPU-interpreted kernel is running.

    JAX's GPU interpreter waits on a barrier's condition until its phase reaches the one the
    thread awaits, with no timeout. From jax 0.12 a barrier has ``abort()``, which fails its
    waiters; before, the wait raises when the phase has run past the awaited one (the thread
    missed a completion): moving the phase past every awaited one ends the wait that way.
    """
    try:
        callbacks = jax_internals.private_attribute(_CALLBACKS)
    except (JaxInternalsChanged, ImportError):
        return False
    shared_memory = getattr(callbacks, "_shared_memory", None)
    if shared_memory is None:
        return False
    buffers = getattr(shared_memory, "mem", None)
    if not isinstance(buffers, dict):
        raise JaxInternalsChanged(
            "the GPU interpreter's shared memory no longer keeps its buffers in .mem; "
            "--pallas-timeout cannot stop a hung Mosaic GPU kernel on this JAX.")
    aborted = False
    for buffer in list(buffers.values()):
        if callable(getattr(buffer, "abort", None)) and hasattr(buffer, "aborted"):
            buffer.abort()  # jax 0.12: a barrier wakes its waiters and fails them itself
            aborted = True
            continue
        condition = getattr(buffer, "cv", None)
        awaited = getattr(buffer, "next_awaited_phase_by_thread", None)
        if condition is None or awaited is None or not hasattr(buffer, "phase"):
            continue  # not a barrier
        with condition:
            buffer.phase = max(awaited, default=0) + 1
            condition.notify_all()
        aborted = True
    return aborted


def reset_gpu_interpreter_state() -> None:
    """Drop the GPU interpreter's simulated memory and race state (a kernel that raised
    leaves them behind). A no-op when this JAX has no GPU interpreter."""
    try:
        jax_internals.private_attribute(_CALLBACKS, "reset_gpu_interpret_mode_state")()
    except (JaxInternalsChanged, ImportError):
        pass


@contextlib.contextmanager
def gpu_races_recorded() -> Iterator[list[bool]]:
    """Yields a list that gets ``True`` for each GPU-interpreted kernel that ended with a
    race found (the interpreter keeps only the newest kernel's race state)."""
    if not dependencies_installed():
        yield []  # no Mosaic GPU kernel can be built here: no race to read, nothing to say
        return
    callbacks = jax_internals.private_attribute(_CALLBACKS)
    original = getattr(callbacks, "_clear_shared_memory", None)
    if original is None or not hasattr(callbacks, "_races"):
        raise JaxInternalsChanged(
            f"{_CALLBACKS} has no _clear_shared_memory or _races; the GPU interpreter's "
            "races cannot be read on this JAX.")
    found: list[bool] = []

    def recording_clear() -> None:
        # Runs once per kernel, at its end (the clean-up barrier's action).
        races = getattr(callbacks, "_races", None)
        if races is not None and getattr(races, "races_found", False):
            found.append(True)
        original()

    callbacks._clear_shared_memory = recording_clear
    try:
        yield found
    finally:
        callbacks._clear_shared_memory = original


def dependencies_installed() -> bool:
    """Whether JAX's Mosaic GPU modules can be imported here: they need absl-py, which
    jax's CPU install does not bring. Without it no Mosaic GPU kernel can be written, so the
    GPU interpreter's features have nothing to do (and are not "off on this JAX")."""
    try:
        import absl  # noqa: F401
    except ImportError:
        return False
    return True


def races_pending() -> bool:
    """Whether the GPU interpreter's newest kernel found a race (read without clearing)."""
    try:
        races = getattr(jax_internals.private_attribute(_CALLBACKS), "_races", None)
    except (JaxInternalsChanged, ImportError):
        return False
    return bool(races is not None and getattr(races, "races_found", False))
