"""The TPU compiler's verdict on one traced ``pallas_call``, on a machine without a TPU.

With libtpu installed (the ``tpu`` extra), ``jax.experimental.topologies``
describes TPU devices of any generation without a TPU, and
``jax.jit(f).lower(...).compile()`` for them runs Mosaic and XLA's TPU compiler
ahead of time. :func:`compile_pallas_call` compiles one traced ``pallas_call``
alone, with the abstract shapes and dtypes it was traced with, for one chip,
and turns a rejection into a :class:`TpuRuleViolation` whose rule says what the
compiler rejected:

``compiler-unimplemented``  an operation Pallas cannot lower for the TPU
                            (``jnp.sort``, ``jnp.cumsum``, a lane reversal, ...)
``compiler-tiling``         a block or an access the compiler cannot prove aligned
                            to the (8, 128) tile
``compiler-vmem``           scoped VMEM over the limit, with the compiler's numbers
``compiler-layout``         a vector layout Mosaic cannot make (a reshape across
                            tiles, ...)
``compiler-other``          any other rejection, the compiler's message as is

:func:`compiling_pallas_calls` does this for every ``pallas_call`` traced while
it is active (how the plugin compiles a Pallas test's kernels), with a cache
keyed by the kernel, its abstract arguments and the chip, so that a property
drawing many examples of one shape compiles its kernel once.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import topologies
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from .._compat import device_kinds, gpu_interpreter, jax_internals, pallas_call_hooks
from ..hosts import installed_libtpu
from . import jaxpr_analysis, kernel_model
from .libtpu_environment import host_has_tpu, quiet_libtpu_environment_for  # noqa: F401
from .violations import MIB, Violation, raised_by_the_lowering, rule_violation
from .vmem_footprint import tpu_info_for

UNIMPLEMENTED = "compiler-unimplemented"
TILING = "compiler-tiling"
VMEM = "compiler-vmem"
LAYOUT = "compiler-layout"
OTHER = "compiler-other"
RULES = (UNIMPLEMENTED, TILING, VMEM, LAYOUT, OTHER)

#: The plugin's chip names the check compiles for, mapped to libtpu's topology name.
#: Not v2 and v3: libtpu 0.0.42.1 aborts the process compiling some Pallas kernels
#: for them ("jellyfish_dma_descriptor_state.cc: Check failed"), and Pallas TPU
#: targets v4 and later.
COMPILER_CHIPS = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "7x": "tpu7x"}

# Topologies to try, smallest first; the first with enough devices for the
# kernel's mesh is used (a single-device kernel compiles on its first device).
_TOPOLOGY_SHAPES = {
    "v4": ("2x2x1", "2x2x2", "2x2x4"), "v5p": ("2x2x1", "2x2x2", "2x2x4"),
    "v5e": ("2x2", "2x4", "4x4"), "v6e": ("2x2", "2x4", "4x4"),
    "tpu7x": ("2x2x1", "2x2x2", "2x2x4"),
}

# --- Is the compiler there? ---------------------------------------------------------


def libtpu_version() -> str | None:
    """The installed libtpu's version, or None when libtpu is not installed (not imported:
    see ``hosts.installed_libtpu``)."""
    return installed_libtpu()


def libtpu_platform_version(chip: str) -> str | None:
    """What the installed libtpu's client says of itself ("... Built on Jun 17 2026 ...",
    the text JAX's ``jtu.is_cloud_tpu_at_least`` reads on a TPU), or None without libtpu."""
    if libtpu_version() is None or chip not in COMPILER_CHIPS:
        return None
    try:
        return str(topology_devices(chip, 1)[0].client.platform_version)
    except (RuntimeError, AttributeError):
        return None


def quiet_libtpu_environment(environ: Any = os.environ) -> None:
    """Before JAX starts on a host without a TPU: keep libtpu's start-up warnings away.

    A value the user set wins. Does nothing when libtpu is not installed or a TPU
    is present (the runtime then needs its own view of the host).
    """
    quiet_libtpu_environment_for(libtpu_version(), environ)


# --- Topologies ------------------------------------------------------------------------


_topologies: dict[str, Any] = {}
_topology_lock = threading.Lock()


def topology_devices(chip: str, needed: int = 1) -> Sequence[Any]:
    """TPU devices of ``chip`` (a name of :data:`COMPILER_CHIPS`), at least ``needed`` of them."""
    name = COMPILER_CHIPS[chip]
    last_error: Exception | None = None
    for shape in _TOPOLOGY_SHAPES[name]:
        key = f"{name}:{shape}"
        with _topology_lock:
            devices = _topologies.get(key)
            if devices is None:
                try:
                    devices = tuple(topologies.get_topology_desc(key, "tpu").devices)
                except Exception as error:  # noqa: BLE001  # try the next shape
                    last_error = error
                    continue
                _topologies[key] = devices
        if len(devices) >= needed:
            return devices
    raise RuntimeError(f"libtpu describes no {chip} topology of {needed} devices ({last_error})")


# --- One compile ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CompileVerdict:
    """What the TPU compiler said of one pallas_call for one chip."""

    chip: str
    kernel: str  # the kernel's title: "'name' (body at file.py:12)"
    compiled: bool
    rule: str | None = None  # one of RULES when rejected
    message: str = ""  # the compiler's own message, shortened
    seconds: float = 0.0  # wall time of the compile (lowering included)
    vmem_bytes: int | None = None  # scoped VMEM the compiler asked for, when it says
    vmem_limit_bytes: int | None = None
    raised: str | None = None  # the Python exception Mosaic's lowering raised, if it did
    compiler_output: str = ""  # the compiler's whole message, when ``message`` shortens it

    def violation(self) -> Violation:
        problem = f"the TPU compiler (libtpu {libtpu_version()}) rejects it for {self.chip}: "
        if self.rule == VMEM and self.vmem_bytes and self.vmem_limit_bytes:
            problem += (f"it needs {mib_text(self.vmem_bytes)} of scoped VMEM, the limit is "
                        f"{mib_text(self.vmem_limit_bytes)}. ")
        problem += f"Compiler: {self.message}"
        detail = (f"The compiler's whole message:\n{self.compiler_output}"
                  if self.compiler_output else "")
        return Violation(self.rule or OTHER, self.kernel, None, problem, _FIXES[self.rule or OTHER],
                         raised=self.raised, detail=detail)


_FIXES = {
    UNIMPLEMENTED: "compute it outside the kernel or with operations Pallas TPU lowers "
    "(elementwise math, reductions, jnp.dot, static slices); interpret mode runs any jnp "
    "function, the TPU compiler does not.",
    TILING: "make the block's last two dimensions multiples of (8, 128) (or the whole array), "
    "and give dynamic slices on the lane axis a start that is visibly a multiple of 128 "
    "(pl.multiple_of(start, 128)).",
    VMEM: "use smaller blocks, pipeline_mode=pl.Buffered(1) for blocks that do not change, or "
    "raise pltpu.CompilerParams(vmem_limit_bytes=...) up to the chip's VMEM.",
    LAYOUT: "keep reshapes and transposes within the (8, 128) tile: reshape only leading "
    "dimensions, or do the reshape outside the kernel.",
    OTHER: "change what the compiler's message names; interpret mode accepts it, the TPU "
    "compiler does not.",
}

_VMEM_NUMBERS = re.compile(r"size ([\d.]+)([KMG]) and limit ([\d.]+)([KMG])")
_UNITS = {"K": 1024, "M": MIB, "G": 1024 * MIB}


def classify_rejection(message: str) -> tuple[str, int | None, int | None]:
    """The rule a compiler message is about, and the VMEM size and limit it names."""
    vmem = _VMEM_NUMBERS.search(message)
    if vmem:
        size = int(float(vmem.group(1)) * _UNITS[vmem.group(2)])
        limit = int(float(vmem.group(3)) * _UNITS[vmem.group(4)])
        return VMEM, size, limit
    lowered = message.lower()
    if "vmem" in lowered and ("out of memory" in lowered or "exceed" in lowered
                              or "resource_exhausted" in lowered):
        return VMEM, None, None
    if "unimplemented primitive" in lowered or "not implemented" in lowered:
        return UNIMPLEMENTED, None, None
    if ("e2003" in lowered or "multiple of" in lowered or "divisible by" in lowered
            or "alignment" in lowered or "aligned" in lowered or "tiling" in lowered
            or "block shape" in lowered):
        return TILING, None, None
    if "layout" in lowered or "shape cast" in lowered or "relayout" in lowered:
        return LAYOUT, None, None
    return OTHER, None, None


def mib_text(n: float) -> str:
    return f"{n / MIB:.2f} MiB"


def _short(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("Please report a bug",
                                                            "Please file an issue",
                                                            "See https://openxla.org"))]
    text = " ".join(lines[:4])
    text = text.replace(" Please file an issue at https://github.com/jax-ml/jax/issues/new/"
                        "choose.", "")
    return text if len(text) <= 700 else text[:700] + " ..."


def compile_pallas_call(params: dict[str, Any], avals: Sequence[Any], chip: str,
                        mesh_axes: tuple[tuple[str, int], ...] = ()) -> CompileVerdict:
    """Compile one traced pallas_call alone for ``chip``; the compiler's verdict.

    ``avals`` are its operands' abstract values as traced; ``mesh_axes`` the
    ``shard_map`` axes it was traced inside (remote copies need them), which get
    a topology with as many devices. The caller may be inside a trace, whose
    context (a shard_map's mesh, a forced interpreter) must not leak into this
    compile.
    """
    kernel = kernel_model.describe_pallas_call(params).title
    start = time.perf_counter()
    try:
        # The compile binds the call again: no observer (this one included) sees it.
        with (
            jax_internals.outside_current_trace(),
            pallas_call_hooks.suspend_pallas_call_observers(),
        ):
            _compile(params, avals, chip, mesh_axes)
    except (jax_internals.JaxInternalsChanged, NotTheCompiler):
        raise
    except Exception as failure:  # noqa: BLE001  # the compiler's rejection, judged below
        if not _raised_by_jax_or_python(failure):
            raise  # a test's own time limit, say, that fired during the compile: no verdict
        error: Exception | None = failure
    else:
        error = None
    seconds = time.perf_counter() - start
    if error is None:
        return CompileVerdict(chip, kernel, True, seconds=seconds)
    message = _short(error)
    # The compiler's words without the note JAX appends on its filtered traceback.
    whole = str(error).split(_JAX_TRACEBACK_NOTE)[0].strip()
    rule, size, limit = classify_rejection(whole)
    shortened = " ".join(line.strip() for line in whole.splitlines() if line.strip()) != message
    return CompileVerdict(chip, kernel, False, rule, message, seconds, size, limit,
                          raised_by_the_lowering(error),
                          whole[:_WHOLE_MESSAGE_CHARS] if shortened else "")


_JAX_TRACEBACK_NOTE = "\n--------------------\nFor simplicity, JAX has removed"


# The compiler's whole message is kept up to this long (a VMEM overflow lists allocations).
_WHOLE_MESSAGE_CHARS = 20_000


def _raised_by_jax_or_python(error: BaseException) -> bool:
    """Whether ``error`` is of a type JAX, jaxlib (Mosaic, XLA) or Python defines: what a
    compile raises when the compiler rejects a kernel."""
    module = type(error).__module__ or ""
    return module == "builtins" or module.split(".")[0] in ("jax", "jaxlib")


class NotTheCompiler(RuntimeError):
    """The check itself could not run (no topology, ...): not a verdict on the kernel."""


def _compile(params: dict[str, Any], avals: Sequence[Any], chip: str,
             mesh_axes: tuple[tuple[str, int], ...]) -> None:
    needed = 1
    for _, size in mesh_axes:
        needed *= size
    try:
        devices = topology_devices(chip, needed)
    except RuntimeError as error:
        raise NotTheCompiler(str(error)) from error
    shapes = [jax.ShapeDtypeStruct(aval.shape, aval.dtype) for aval in avals]
    params = _without_shardings(params)

    def call(*args: Any) -> Any:
        return jax_internals.bind_pallas_call(params, *args)

    if mesh_axes:
        mesh = Mesh(np.array(devices[:needed]).reshape([size for _, size in mesh_axes]),
                    tuple(name for name, _ in mesh_axes))
        # Every device gets operands of the traced (per-device) shape.
        spec = PartitionSpec(tuple(name for name, _ in mesh_axes))
        shapes = [jax.ShapeDtypeStruct((needed * s.shape[0], *s.shape[1:]) if s.shape else (),
                                       s.dtype, sharding=NamedSharding(mesh, spec if s.shape
                                                                       else PartitionSpec()))
                  for s in shapes]
        in_specs = tuple(spec if s.shape else PartitionSpec() for s in shapes)
        target = jax.shard_map(call, mesh=mesh, in_specs=in_specs, out_specs=spec,
                               check_vma=False)
    else:
        sharding = SingleDeviceSharding(devices[0])
        shapes = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in shapes]
        # The outputs on the chip too: a kernel without operands would otherwise be
        # placed on JAX's default device, the CPU, which compiles no Mosaic kernel.
        target = jax.jit(call, out_shardings=sharding)
    info = tpu_info_for(chip)
    host_kind = jax.devices()[0].device_kind
    with (pltpu.force_tpu_interpret_mode(None),
          device_kinds.device_kind_answers_as(host_kind, lambda: info),
          warnings.catch_warnings()):
        # JAX's persistent cache (kept in pytest's cache directory) holds this executable
        # if another process compiled the same kernel (a pytest-xdist worker, or a run whose
        # verdicts are gone). Compiled for a chip this host lacks, it cannot be loaded: JAX
        # warns and compiles again, which is the verdict wanted. Not the user's concern.
        warnings.filterwarnings("ignore", _UNLOADABLE_CACHE_ENTRY, UserWarning)
        jax.jit(target).lower(*shapes).compile()


_UNLOADABLE_CACHE_ENTRY = r"Error reading persistent compilation cache entry"


def _without_shardings(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with output avals on no mesh of explicit axes. Traced under
    ``jax.set_mesh`` with explicit axes (a vmap over a sharded axis, say), a kernel's outputs
    carry the mesh's sharding, and a compile on the one device here refuses them ("Length of
    device assignment 1 is not equal to the size of the mesh 4"); Mosaic compiles the kernel
    for its shapes, whatever the program around it shards. The manual axes of a
    ``shard_map`` stay: the compile rebuilds that mesh (``mesh_axes``)."""
    out_avals = params.get("out_avals")
    if not out_avals or not any(map(_on_an_explicit_mesh, out_avals)):
        return params
    return {**params, "out_avals": tuple(a.update(sharding=None) if _on_an_explicit_mesh(a)
                                         else a for a in out_avals)}


def _on_an_explicit_mesh(aval: Any) -> bool:
    """Whether ``aval`` carries a mesh with explicit axes and no manual ones."""
    kinds = tuple(getattr(getattr(getattr(aval, "sharding", None), "mesh", None),
                          "axis_types", ()) or ())
    return AxisType.Explicit in kinds and AxisType.Manual not in kinds


# --- Every pallas_call a block traces, cached -------------------------------------------


@dataclasses.dataclass
class CompileStats:
    """How many compiles ran and how many verdicts came from the cache, in this process."""

    compiles: int = 0
    cached: int = 0
    seconds: float = 0.0


STATS = CompileStats()
_cache: collections.OrderedDict[str, CompileVerdict] = collections.OrderedDict()
_cache_lock = threading.Lock()
CACHE_SIZE = 4096


def cache_key(params: dict[str, Any], avals: Sequence[Any], chip: str,
              mesh_axes: tuple[tuple[str, int], ...]) -> str:
    """A stable fingerprint of (kernel and its params, abstract arguments, mesh, chip)."""
    text = "\n".join([
        jaxpr_analysis.pallas_call_fingerprint(params),
        repr([(tuple(a.shape), str(a.dtype)) for a in avals]),
        repr(mesh_axes),
        chip,
    ])
    return hashlib.sha256(text.encode()).hexdigest()


def verdict_for(params: dict[str, Any], avals: Sequence[Any], chip: str,
                mesh_axes: tuple[tuple[str, int], ...] = ()) -> CompileVerdict:
    """:func:`compile_pallas_call`, answered from the cache when this kernel was compiled."""
    key = cache_key(params, avals, chip, mesh_axes)
    with _cache_lock:
        verdict = _cache.get(key)
        if verdict is not None:
            STATS.cached += 1
            _cache.move_to_end(key)
            return verdict
    verdict = compile_pallas_call(params, avals, chip, mesh_axes)
    with _cache_lock:
        STATS.compiles += 1
        STATS.seconds += verdict.seconds
        _cache[key] = verdict
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return verdict


def remember_verdicts(verdicts: dict[str, CompileVerdict]) -> None:
    """Verdicts of an earlier run (``plugin.persistent_cache``), answered as if compiled in this
    one."""
    with _cache_lock:
        for key, verdict in verdicts.items():
            _cache.setdefault(key, verdict)


def remembered_verdicts() -> dict[str, CompileVerdict]:
    """Every verdict this process knows, by cache key (``plugin.persistent_cache`` stores them)."""
    with _cache_lock:
        return dict(_cache)


def _passes_semaphores(params: dict[str, Any], avals: Sequence[Any]) -> bool:
    """Whether a pallas_call takes or returns a semaphore (``pltpu.SemaphoreType`` as an
    ``out_shape``, handed from the kernel that starts a copy to the one that waits)."""
    out_avals = tuple(params.get("out_avals", ()) or ())
    return any("sem" in str(getattr(getattr(aval, "dtype", None), "name", ""))
               for aval in (*avals, *out_avals))


def verdict_if_judged(params: dict[str, Any], avals: Sequence[Any],
                      chip: str) -> CompileVerdict | None:
    """:func:`verdict_for` a pallas_call as traced (inside a ``shard_map``, for its mesh), or
    None where the TensorCore's compiler does not judge it."""
    described = kernel_model.describe_pallas_call(params)
    if not described.for_tensor_core:
        return None  # GPU compiler params or a SparseCore mesh: not the TensorCore's compiler
    if any(getattr(aval, "is_high", False) is True for aval in avals):
        # An operand of a hijax type (a pair of arrays as one, JAX's test_emit_pipeline_hijax)
        # is lowered to several arrays: compiled alone from its shape and dtype it is not
        # the kernel the program compiles ("Cannot infer the memory space of main's
        # argument 3"). Not asked.
        return None
    if any(operand.memory_space == "host" for operand in described.operands):
        # libtpu's ahead-of-time compiler aborts the whole process compiling a kernel with
        # an operand in host memory (pl.HOST; libtpu 0.0.42.1, for v5e): not asked.
        return None
    if _passes_semaphores(params, avals):
        # libtpu's ahead-of-time compiler aborts the whole process on a program whose
        # operands or results are semaphores (JAX's asynchronous-copy kernels): such a
        # kernel keeps the static rules' verdict.
        return None
    mesh_axes = (jax_internals.manual_mesh_axes()
                 if jaxpr_analysis.pallas_call_communicates(params) else ())
    return verdict_for(params, avals, chip, mesh_axes)


def pallas_call_compiler(
    chips: Sequence[str],
    verdicts: list[CompileVerdict] | None = None,
    on_verdict: Callable[[CompileVerdict], None] | None = None,
) -> Callable[[dict[str, Any], tuple[Any, ...]], None]:
    """An observer (``observe_pallas_calls(..., with_avals=True)``) compiling each call traced.

    Raises :class:`TpuRuleViolation` from inside the trace for the first chip
    whose compiler rejects the kernel (the trace is aborted, so the kernel is not
    cached and fails again on the next call).
    """
    def observe(params: dict[str, Any], avals: tuple[Any, ...]) -> None:
        rejected = []
        for chip in chips:
            verdict = verdict_if_judged(params, avals, chip)
            if verdict is None:
                return
            if verdicts is not None:
                verdicts.append(verdict)
            if on_verdict is not None:
                on_verdict(verdict)
            if not verdict.compiled:
                rejected.append(verdict.violation())
        if rejected:
            raise rule_violation(rejected, by_the_compiler=True)

    return observe


@contextlib.contextmanager
def compiling_pallas_calls(
    chips: Sequence[str],
    on_verdict: Callable[[CompileVerdict], None] | None = None,
) -> Iterator[list[CompileVerdict]]:
    """Compile every pallas_call traced inside the block for each chip; yields the verdicts.

        with compiling_pallas_calls(["v5e"]) as verdicts:
            my_kernel(x)  # raises TpuRuleViolation at trace time if the compiler rejects it
    """
    verdicts: list[CompileVerdict] = []
    # The TPU compiler never judges a GPU kernel (Mosaic GPU, Triton).
    observer = gpu_interpreter.tpu_kernels_only(
        pallas_call_compiler(tuple(chips), verdicts, on_verdict))
    with pallas_call_hooks.observe_pallas_calls(observer, with_avals=True):
        yield verdicts
