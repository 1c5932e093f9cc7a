"""Accessors of private JAX internals: this package (``_compat``) holds every use of one.

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

import contextlib
import dataclasses
import importlib
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class JaxInternalsChanged(RuntimeError):
    """A private JAX internal that pytest-pallas relies on is not where it was."""


class InterpreterLimit(NotImplementedError):
    """What one of JAX's interpreters cannot run, found by the plugin before JAX crashes on it
    (a kernel in a ``custom_partitioning`` body on several devices, a SparseCore DMA indexed by
    a vector): JAX's limit, not the kernel's bug, and one line that says which."""


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


@contextlib.contextmanager
def attributes_replaced(owner: Any, replacements: dict[str, Any]) -> Iterator[None]:
    """Within the block, each named attribute of ``owner`` (a JAX module or class) is its
    replacement; the originals are put back on exit, whatever happened."""
    originals = {name: getattr(owner, name) for name in replacements}
    for name, value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(owner, name, original)


PIPELINE_MODULE = "jax._src.pallas.mosaic.pipeline"


@contextlib.contextmanager
def emit_pipeline_replaced(replacement: Callable[..., Any]) -> Iterator[None]:
    """Within the block, ``pltpu.emit_pipeline`` and the name in JAX's pipeline module (which
    JAX's own helpers call) are ``replacement``; the public name only where it is JAX's
    function (another wrapper, a harness's, is left to its owner)."""
    # lazy: imported before JAX starts (keep_jax_on_cpu)
    from jax.experimental.pallas import tpu as pltpu

    module = private_attribute(PIPELINE_MODULE)
    public_is_jaxs = getattr(pltpu, "emit_pipeline", None) is module.emit_pipeline
    with (attributes_replaced(module, {"emit_pipeline": replacement}),
          attributes_replaced(pltpu, {"emit_pipeline": replacement} if public_is_jaxs else {})):
        yield


def private_attribute(module_name: str, attribute: str | None = None) -> Any:
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


INTERPRETER_MODULE = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"


PALLAS_CALL_MODULE = "jax._src.pallas.pallas_call"


_XLA_BRIDGE = "jax._src.xla_bridge"


@contextlib.contextmanager
def cpu_lowerings(module_name: str,
                  rules: dict[str, tuple[Callable[..., Any], bool]]) -> Iterator[bool]:
    """Each primitive of ``module_name`` that ``rules`` names (name: (its computation in
    jnp, whether it has several results)) lowered on the CPU by that computation while the
    block runs, where this JAX has it and no CPU rule for it. Yields whether one was added;
    False where JAX's registry of lowerings or the module moved."""
    try:
        mlir = private_attribute("jax._src.interpreters.mlir")
        cpu_rules = mlir._platform_specific_lowerings["cpu"]
        module = private_attribute(module_name)
    except (JaxInternalsChanged, AttributeError, KeyError):
        yield False
        return
    added = []
    for name, (implementation, several) in rules.items():
        primitive = getattr(module, name, None)
        if primitive is not None and primitive not in cpu_rules:
            mlir.register_lowering(primitive, mlir.lower_fun(
                implementation, multiple_results=several), platform="cpu")
            added.append(primitive)
    try:
        yield bool(added)
    finally:
        for primitive in added:
            cpu_rules.pop(primitive, None)


def scan_operand_counts(params: dict[str, Any]) -> tuple[int, int]:
    """(constants, carries) among a ``scan`` equation's operands, the rest its ``xs``: its
    ``num_consts`` and ``num_carry`` before JAX 0.12; from 0.12 its ``ft_in`` tree, in three
    parts (constants, carries, xs)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    tree = params.get("ft_in")
    try:
        constants, carries, _ = tree.unpack()
        return len(list(constants.vals)), len(list(carries.vals))
    except (AttributeError, TypeError, ValueError) as error:
        raise JaxInternalsChanged(
            f"a scan's parameters name neither num_consts nor an ft_in tree ({error})"
        ) from error


def interpret_params(**fields: Any) -> Any:
    """``pltpu.InterpretParams(**fields)``, with races recorded rather than raised.

    Up to jax 0.10 the race detector records a race (``races_found``) and the
    kernel runs on; from 0.11 it raises inside the interpreter's callback by
    default (``on_race="raise"``), which surfaces as an ``INTERNAL:
    CpuCallback error`` that names neither the rule nor the kernel. The
    plugin fails a racy kernel itself, with a ``data-race`` message, so it
    asks for the recording behaviour wherever this JAX can be told.
    """
    from jax.experimental.pallas import tpu as pltpu  # lazy: before JAX starts, as above

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
    from jax.experimental.pallas import tpu as pltpu  # lazy: before JAX starts, as above

    mesh_class = getattr(pltpu, "TensorCoreMesh", None)  # not exported by jax 0.10
    if dataclasses.is_dataclass(mesh_class) and "num_cores" in {
            field.name for field in dataclasses.fields(mesh_class)}:
        return mesh_class(axis_name=axis_name, num_cores=num_cores)
    return pltpu.create_tensorcore_mesh(axis_name, num_cores=num_cores)


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
    fields = ({f.name for f in dataclasses.fields(params)}
              if dataclasses.is_dataclass(params) else set())
    if "buffer_bounds" not in fields:
        return params
    return dataclasses.replace(params, buffer_bounds="padded")


def backends_are_initialized() -> bool:
    """Whether JAX has created its device clients (after which the CPU device count is fixed)."""
    return bool(private_attribute(_XLA_BRIDGE, "backends_are_initialized")())


def restrict_imported_jax_to_cpu() -> str | None:
    """Keep a JAX that was imported before the plugin acted on the CPU, if still possible.

    JAX reads ``JAX_PLATFORMS`` into its config when it is imported and uses it when it
    creates its backends: an imported JAX is told through ``jax.config`` instead. Returns
    the platform JAX already started on when that is not the CPU (too late to change: its
    backends exist), else None. A JAX that is not imported reads the environment itself.
    """
    jax = sys.modules.get("jax")
    if jax is None or not hasattr(jax, "config"):
        return None
    if backends_are_initialized():
        platform = default_platform()
        return None if platform == "cpu" else platform
    jax.config.update("jax_platforms", "cpu")
    return None


def default_platform() -> str:
    """The platform of JAX's default backend, as JAX's own modules read it: unlike the
    public ``jax.default_backend``, never the stand-in chip's answer (``device_under_test``)."""
    return private_attribute("jax._src.xla_bridge", "default_backend")()


def start_persistent_compilation_cache() -> None:
    """Open JAX's persistent compilation cache now, not at the first compile.

    JAX opens it lazily, inside whichever test compiles first, and then changes a config
    value of its own; JAX's test cases (``jtu.JaxTestCase``) fail a test in which the cache
    object or a config value changed.
    """
    private_attribute("jax._src.compilation_cache", "_initialize_cache")()


def pallas_call_primitive() -> Any:
    """The ``pallas_call`` primitive, whose equations carry grid mappings and compiler params."""
    return private_attribute(PALLAS_CALL_MODULE, "pallas_call_p")


CORE_MODULE = "jax._src.core"


def eager_evaluation() -> contextlib.AbstractContextManager[Any]:
    """JAX's eager context (``core.eval_context``): code running inside a trace (an observer
    of a pallas_call being traced) computes concrete values there, where jax >= 0.11 stages
    even ``jnp.asarray`` under ``jax.ensure_compile_time_eval``. A null context on a JAX
    without it, where ``ensure_compile_time_eval`` alone is eager."""
    eager = getattr(private_attribute(CORE_MODULE), "eval_context", None)
    return eager() if eager is not None else contextlib.nullcontext()


def mesh_kernel_primitive_names() -> tuple[str, ...]:
    """Names of the primitives ``pl.kernel`` and ``pl.core_map`` bind.

    jax 0.10 binds ``mpmd_map`` for ``pl.kernel`` and ``core_map`` for
    ``pl.core_map``; a name a later JAX renames is simply not found (the kernel is
    then not estimated, never an error).
    """
    return ("mpmd_map", "core_map")


SOURCE_INFO_MODULE = "jax._src.source_info_util"


def kernel_name(params: Mapping[str, Any]) -> str:
    """A kernel's name for messages, from a ``pallas_call``'s params (or ``{"jaxpr": ...}``):
    the name it was given, else its body's 'name at file:line' from the jaxpr's debug info."""
    named = params.get("name_and_src_info")
    name = getattr(named, "name", None) or params.get("name")
    for jaxpr in (params.get("jaxpr"), *(params.get("jaxprs") or ())):
        if name:
            break
        info = getattr(jaxpr, "debug_info", None)
        name = getattr(info, "func_src_info", None) or getattr(info, "func_name", None)
    return short_source(str(name or "<kernel>"))


def short_source(kernel: str) -> str:
    """JAX's 'body at /home/me/repo/kernels.py:12' as 'body at kernels.py:12' under the cwd."""
    name, at, path = kernel.rpartition(" at ")
    if not at or not os.path.isabs(path):
        return kernel
    relative = os.path.relpath(path)
    return f"{name} at {path if relative.startswith('..') else relative}"


_INTERPRETER_SOURCES = (
    "jax/_src/pallas/mosaic/interpret/",  # the TPU interpreter
    "jax/_src/pallas/mosaic_gpu/interpret/",  # the GPU interpreter (Mosaic GPU kernels)
    "jax/_src/pallas/hlo_interpreter.py",  # the plain interpreter (interpret=True)
    "jax/_src/state/discharge.py",  # the plain interpreter's discharge of kernel state
    # The plugin's extension of the TPU interpreter to reshaped and bitcast refs: what it
    # cannot do yet (half of a packed word) is the interpreter's limit, not the kernel's bug.
    "pytest_pallas/_compat/ref_views.py",
)


_INTERNAL_ERROR_TYPES = ("AttributeError", "TypeError", "KeyError", "IndexError",
                         "NotImplementedError", "UnboundLocalError", "NameError")


_NO_CPU_RULE = "MLIR translation rule for primitive"


def interpreter_crash(error: BaseException) -> str | None:
    """One line naming the failure if ``error`` is a crash inside one of JAX's Pallas
    interpreters (not a check of theirs, not the kernel's own error); else None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        limit = _named_limit(current)
        if limit is not None:
            return limit
        frames = traceback.extract_tb(current.__traceback__)
        first = (str(current).strip().splitlines() or [""])[0]
        if name in _INTERNAL_WHEN_RAISED_INSIDE or name == "AssertionError":
            inside = frames and (_in_interpreter(frames[-1].filename)
                                 if name != "AssertionError" else _GPU_INTERPRETER_SOURCE
                                 in frames[-1].filename.replace("\\", "/"))
            if inside:
                return f"{name}: {first} (in {_short_jax_path(frames[-1].filename)})"
        if name in ("ValueError", "NotImplementedError") and any(
                refusal in str(current) for refusal in _JAX_REFUSES_THE_INTERPRETER):
            # JAX refused what its interpreter built: its limit, not the kernel's bug, where
            # the interpreter's own frames, or pallas_call's lowering of an interpreted
            # kernel (which traces the interpreter and checks the result after it
            # returned), called what raised it.
            called_from = next((f.filename for f in reversed(frames)
                                if _in_interpreter(f.filename)
                                or _PALLAS_CALL_LOWERING in f.filename.replace("\\", "/")),
                               None)
            if called_from is not None:
                return f"{name}: {first} (in {_short_jax_path(called_from)})"
        if name in _INTERNAL_ERROR_TYPES or _NO_CPU_RULE in str(current):
            where = next((f.filename for f in reversed(frames)
                          if any(s in f.filename.replace("\\", "/") for s in _INTERPRETER_SOURCES)
                          ), None)
            if where is not None or _NO_CPU_RULE in str(current):
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


# A pinned buffer (``jax._src.state.primitives.pin``, a kernel operand aliased in place) is an
# AbstractLinVal: JAX's callbacks have no shape for one (the TPU interpreter hands them the
# kernel's operands: "No xla_shape_handler for type"), nor do the plain interpreter's slices
# take one ("Attempting to pass an unexpected type AbstractLinVal").
_PINNED_BUFFER = "AbstractLinVal"


def _named_limit(error: BaseException) -> str | None:
    """The line of an :class:`InterpreterLimit`, raised here or, through XLA, quoted in
    ``error``'s text; or of a pinned buffer handed to the TPU interpreter's callbacks."""
    text = str(error)
    if isinstance(error, InterpreterLimit):
        return f"{InterpreterLimit.__name__}: {text.strip().splitlines()[0]}"
    quoted = f"{InterpreterLimit.__name__}: "
    if quoted in text:
        line = next(line for line in text.splitlines() if quoted in line)
        return line[line.index(quoted):].strip()
    if _refuses_a_pinned_buffer(error):
        return (f"{type(error).__name__}: {text.strip().splitlines()[0]} (a pinned buffer, "
                "which JAX's interpreters do not take)")
    return None


def _refuses_a_pinned_buffer(error: BaseException) -> bool:
    return isinstance(error, (TypeError, ValueError)) and _PINNED_BUFFER in str(error)


def pinned_buffer_refused(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is JAX refusing a pinned buffer that a kernel
    takes (``jax._src.state.primitives.pin``) in the TPU interpreter's callbacks."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if _refuses_a_pinned_buffer(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _short_jax_path(path: str) -> str:
    path = path.replace("\\", "/")
    return path[path.index("jax/_src/"):] if "jax/_src/" in path else path


def bind_pallas_call(params: dict[str, Any], *args: Any) -> Any:
    """Bind the ``pallas_call`` primitive with a traced call's params, for the TPU compiler.

    ``interpret`` is dropped: a call traced under a forced interpreter records it
    in its params, and the compiler must see the kernel Mosaic would lower.
    """
    return pallas_call_primitive().bind(*args, **{**params, "interpret": False})


def as_compiled_for_the_chip(closed: Any) -> Callable[..., Any]:
    """A function that runs a traced (closed) jaxpr with every ``pallas_call`` in it (and every
    ``pl.kernel`` and ``pl.core_map``), nested ones included, as Mosaic compiles it:
    ``interpret`` dropped.

    jax 0.10 reads a forced interpreter when ``pl.pallas_call(...)`` is *built*, not when it
    is called: a pallas_call object made inside a Pallas test keeps the TPU interpreter in
    its params whatever mode is forced when it is traced later, and lowering it for the TPU
    then lowers the interpreter's host callbacks ("the platform for the specified backend
    cpu is different from the lowering platform tpu"), or, for the plain interpreter, the
    kernel as plain XLA with no Mosaic check at all. Takes the arguments flat, as
    ``jax.make_jaxpr`` traced them.
    """
    as_function = private_attribute(CORE_MODULE, "jaxpr_as_fun")
    primitive = pallas_call_primitive()
    mesh_kernels = mesh_kernel_primitive_names()

    def is_kernel(equation: Any) -> bool:
        # pl.kernel and pl.core_map record a forced interpreter too (mpmd_map, core_map).
        return equation.primitive is primitive or (
            equation.primitive.name in mesh_kernels and "interpret" in equation.params)

    # The interpreter's host callbacks gave the call (and every jaxpr around it) I/O effects
    # that Mosaic's kernel does not have: each rewritten level drops the effects that went
    # away below it and that nothing else at that level still has.
    def compiled_effects(equation: Any, params: dict[str, Any]) -> Any:
        _, effects = equation.primitive.abstract_eval(*(v.aval for v in equation.invars),
                                                      **params)
        return effects

    def jaxpr_without(jaxpr: Any) -> tuple[Any, set[Any]]:
        equations, dropped, changed = [], set(), False
        for equation in jaxpr.eqns:
            if is_kernel(equation):
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


def manual_mesh_axes() -> tuple[tuple[str, int], ...]:
    """The mesh axes (name, size) of the ``shard_map`` being traced now; () outside one."""
    import jax  # lazy: before JAX starts, as above

    get_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
    if get_mesh is None:
        return ()
    mesh = get_mesh()
    if mesh is None or getattr(mesh, "empty", True):
        return ()
    manual = set(getattr(mesh, "manual_axes", ()) or ())
    return tuple((str(name), int(size)) for name, size in zip(mesh.axis_names, mesh.axis_sizes)
                 if not manual or name in manual)


@contextlib.contextmanager
def outside_current_trace() -> Iterator[None]:
    """Run the block as at top level: no enclosing trace, axis environment or shard_map mesh.

    The compile check compiles a kernel while the test's function is being
    traced (inside ``shard_map``, say); that compile is a computation of its
    own and must not see the enclosing trace's state.
    """
    import jax  # lazy: before JAX starts, as above

    core = private_attribute(CORE_MODULE)
    context = getattr(core, "trace_ctx", None)
    top_axis_env = getattr(core, "top_axis_env", None)
    if context is None or top_axis_env is None or not hasattr(core, "eval_context"):
        raise JaxInternalsChanged(
            f"{CORE_MODULE} no longer has trace_ctx/top_axis_env/eval_context; the TPU compile "
            "check cannot step out of a trace on this JAX.")
    saved_axis_env = context.axis_env
    with core.eval_context():
        context.set_axis_env(top_axis_env)
        try:
            # No mesh either: the abstract one of a shard_map, nor the test's own
            # `with jax.set_mesh(mesh)` of CPU devices, under which a compile for the chip's
            # devices fails ("Received incompatible devices for jitted computation").
            with jax.set_mesh(None):
                yield
        finally:
            context.set_axis_env(saved_axis_env)


# A ValueError is often the kernel's own (a shape it rejects), so it counts only when
# the interpreter's code raised it: the plain interpreter's discharge of a remote copy
# fails in safe_zip ("argument 2 has length 8 but argument 0 has length 10") on
# tpu-inference's all-gather matmul.
_INTERNAL_WHEN_RAISED_INSIDE = ("ValueError",)
# Raised by JAX's tracing against what its interpreter hands it, the interpreter's frames
# below: a ref view passed to io_callback; the emit_pipeline primitive's state effects.
_PALLAS_CALL_LOWERING = "jax/_src/pallas/pallas_call.py"
_JAX_REFUSES_THE_INTERPRETER = (
    "Triggering __jax_array__() during abstractification",
    "does not have a corresponding jaxpr input",
    # The TPU interpreter's host callbacks in a program under jax.set_mesh whose axes are
    # not all manual (jax 0.12: a kernel vmapped over an explicit axis).
    "callbacks are only supported in spmd computations when all mesh axes are partitioned",
)

# JAX's GPU interpreter asserts what it cannot run (a BlockSpec with an index map, jax
# 0.10.2 to 0.12): raised inside it, an AssertionError is JAX's limit, not the kernel's bug.
_GPU_INTERPRETER_SOURCE = "jax/_src/pallas/mosaic_gpu/interpret/"


def _in_interpreter(filename: str) -> bool:
    return any(s in filename.replace("\\", "/") for s in _INTERPRETER_SOURCES)


_MASKED_SWAP = (r"Out-of-bounds masked swap of [^:]*: swapping \[\((.*?)\)\] "
                r"but buffer has shape \(([\d, ]*)\)")


def _in_bounds_masked_swap(text: str) -> str | None:
    """The crash line when the TPU interpreter refused a masked store that is in bounds.

    jax 0.10's ``swap_buffer_content`` marks a mask's out-of-bounds part with
    ``in_bounds_mask[in_bounds_shape[i]:] = False`` for every axis i, which always
    slices axis 0: a masked store of rows 0:8, columns 0:2 into an (8, 4, 128)
    buffer is refused as out of bounds (JAX's ragged paged attention makes one).
    """
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
