"""Which device runs the kernels, which interpreter, and the facts of the chip.

``select_backend`` turns the validated options into a ``Backend``;
``Backend.activate()`` is the context in which a test's kernels run: on the
CPU it forces every ``pallas_call`` traced inside it into interpret mode
(even one that never passes ``interpret=``) and makes ``pltpu.get_tpu_info()``
answer for the chip the run stands in for; a GPU kernel (Mosaic GPU or Triton) runs in
the interpreter that can run it instead (``_compat.gpu_interpreter``). On a TPU or a GPU
it changes nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import pytest
from jax.experimental.pallas import tpu as pltpu

from . import hosts
from ._compat import (
    chip_matmuls,
    device_kinds,
    device_objects,
    explicit_mxu,
    gpu_interpreter,
    indexed_dmas,
    interpreter_fixes,
    interpreter_memory,
    interpreter_speed,
    jax_internals,
    out_of_bounds,
    output_revisits,
    pallas_call_hooks,
    partitioned_kernels,
    plain_path,
    ref_views,
    sparsecore,
    tpu_interpreter,
    xla_cpu_options,
)
from ._compat.device_under_test import device_kind_of_chip
from .checks import gpu_rules, plain_equivalence, running
from .checks.running import active_backend  # noqa: F401  (the backend's public accessor)
from .checks.vmem_footprint import tpu_info_for
from .chip_topology import SliceTopology, slice_topology
from .numerics import run_rounding
from .settings import PallasOptions


@dataclasses.dataclass(frozen=True)
class Backend:
    """What the ``pallas_backend`` fixture gives a test.

    Attributes:
      platform: ``"tpu"`` or ``"gpu"`` (compiled for the device) or ``"cpu"`` (interpreted).
      interpreter: ``"tpu"``, ``"plain"``, or None on a TPU or a GPU (the interpreter of
        TPU kernels; GPU kernels take JAX's GPU interpreter or the plain one).
      chip: the chip name (``"v5e"``, ...): the real one on a TPU, else the one simulated.
      tpu_info: ``pltpu.TpuInfo`` of that chip (VMEM size, tiling, peak rates, cores).
      interpret_params: what ``pallas_call`` receives as ``interpret=`` on the CPU
        (a ``pltpu.InterpretParams``, ``True`` for the plain interpreter, None on a TPU).
      device_kind: ``jax.devices()[0].device_kind``.
      device_count: how many devices JAX sees.
      gpu_interpret_params: the ``InterpretGPUParams`` Mosaic GPU kernels run with on the
        CPU, or None (compiled, or this JAX has no GPU interpreter: the plain one then).
    """

    platform: str
    interpreter: str | None
    chip: str
    tpu_info: Any
    interpret_params: Any
    device_kind: str
    device_count: int
    gpu_interpret_params: Any = None
    numerics: str = "chip"  # --pallas-numerics: "chip" or "exact"
    # A test of GPU kernels: on the CPU its numbers are the GPU's (TF32), from its start.
    gpu_numbers: bool = False
    # Kernels that passed their own pltpu.InterpretParams: what the run changed in them.
    own_params_changed: ParamsChanges = dataclasses.field(
        default_factory=lambda: ParamsChanges(), compare=False, repr=False)

    @property
    def is_tpu(self) -> bool:
        return self.platform == "tpu"

    @property
    def is_gpu(self) -> bool:
        return self.platform == "gpu"

    @property
    def is_compiled(self) -> bool:
        """Compiled for a device (TPU or GPU), not interpreted on the CPU."""
        return self.platform in ("tpu", "gpu")

    @property
    def plain_path(self) -> bool:
        """Whether kernels the TPU interpreter would run no differently run in JAX's plain
        interpreter (``checks.plain_equivalence``; ``--pallas-interpret=tpu-always`` turns it
        off)."""
        return plain_path.is_routed(self.interpret_params)

    def with_tpu_interpreter_always(self) -> Backend:
        """This backend with every kernel in the TPU interpreter."""
        return dataclasses.replace(self, interpret_params=plain_path.tpu_only(
            self.interpret_params))

    @property
    def name(self) -> str:
        if self.is_compiled:
            return self.platform
        return f"cpu-interpret-{self.interpreter}"

    @property
    def matmul_precision(self) -> str:
        """The precision of a float32 ``jnp.dot`` inside a kernel on this backend.

        On a TPU the default precision rounds float32 operands to bfloat16 (one
        MXU pass); on a GPU, to TensorFloat-32 (tensor cores, JAX's default precision
        for float32 dots there); interpreted on the CPU, as the chip's or the GPU's
        (``--pallas-numerics=chip``, see :attr:`float32_dot_rounding`), else float32.
        """
        if self.is_compiled:
            return {"tpu": "bfloat16", "gpu": "tensorfloat32"}[self.platform]
        return self.float32_dot_rounding or "float32"

    @property
    def float32_dot_rounding(self) -> str | None:
        """What a run on the CPU rounds a default-precision float32 dot's operands to, in
        kernels and in the test's XLA dots (``numerics.run_rounding``), or None."""
        return run_rounding(self.platform, self.chip, self.numerics, gpu=self.gpu_numbers)

    def chip_devices(self) -> device_objects.ChipDevices:
        """What JAX's device objects report for this run's stand-in chip, opted in: its
        device kind, TensorCores per device and HBM per device (JAX's chip table), and each
        device's place in a slice of the chip with this run's device count
        (``chip_topology``)."""
        info = self.tpu_info
        cores = int(info.num_cores)
        topology = chip_slice(self.chip, info, self.device_count)
        return device_objects.ChipDevices(
            device_kind=device_kind_of_chip(self.chip), num_cores=cores,
            coords=topology.coords, core_on_chip=topology.core_on_chip,
            bytes_limit=int(info.hbm_capacity_bytes) * cores)

    def describe(self) -> str:
        if self.is_tpu:
            return f"TPU {self.chip} ({self.device_count} devices, compiled)"
        if self.is_gpu:
            return f"GPU {self.device_kind} ({self.device_count} devices, compiled)"
        vmem = self.tpu_info.vmem_capacity_bytes // 2**20
        return (
            f"CPU, {self.interpreter} interpreter, standing in for TPU {self.chip} "
            f"({vmem} MiB VMEM, {self.tpu_info.num_cores} core(s)); {self.device_count} devices"
        )

    @contextlib.contextmanager
    def activate(self, on_gpu_kernel: Callable[[Any], None] | None = None,
                 on_host_memory_shortage: Callable[[Any], None] | None = None,
                 on_plain_path_doubt: Callable[[str], None] | None = None,
                 ) -> Iterator[Backend]:
        """Run the body's kernels on this backend (see the module docstring).

        ``on_gpu_kernel`` hears each GPU kernel run on the CPU
        (a ``_compat.gpu_interpreter.RoutedKernel``), and may raise to stop it. With the
        TPU's numbers, the first GPU kernel turns the rest of the body to the GPU's (TF32).
        ``on_host_memory_shortage`` hears the ``interpreter_memory.HostMemoryShortage`` raised
        at the trace of a kernel whose copies in the interpreter would not fit in the host's
        memory. ``on_plain_path_doubt`` hears the name of a kernel run in the plain path that
        met what the TPU interpreter stops (``_compat.plain_path``): the body's values are
        then not the TPU interpreter's.
        """
        if self.is_compiled:
            yield self
            return

        optional = jax_internals.optional_feature
        with contextlib.ExitStack() as stack:
            rounding = self.float32_dot_rounding
            if rounding is not None:
                # Both sides round, as on the chip: the kernels and the test's own XLA dots.
                _enter_numbers(stack, rounding)
            stack.enter_context(optional(
                "pltpu.get_tpu_info() answering for the chip on the CPU",
                lambda: device_kinds.device_kind_answers_as(self.device_kind,
                                                           lambda: self.tpu_info)))
            # TensorCoreMesh, pl.kernel and pl.core_map count the chip's TensorCores.
            stack.enter_context(optional(
                "the stand-in chip as JAX's abstract device",
                lambda: interpreter_fixes.chip_as_abstract_device(
                    self.device_kind, self.tpu_info.num_cores)))

            if (jax_internals.default_platform() != "cpu"
                    and hosts.user_jax_platforms() is None):
                # JAX started on an accelerator before the plugin could keep it on the CPU
                # (plugin.session's header line says so): the test's arrays stay on the CPU.
                stack.enter_context(jax.default_device(jax.devices("cpu")[0]))
            token = running.ACTIVE_BACKEND.set(self)
            stack.callback(running.ACTIVE_BACKEND.reset, token)
            stack.enter_context(optional(
                "the TPU interpreter's vmap fix", tpu_interpreter.vmapped_grid_semantics_fixed))
            # The interpreter's callbacks must not wait on XLA's thread pool (a hang on
            # 8 simulated devices): see _compat.interpreter_fixes.
            stack.enter_context(interpreter_fixes.interpreter_callbacks_on_host_arrays())
            # Nor may a kernel's copies outgrow the host's memory (the process would be killed).
            stack.enter_context(interpreter_memory.kernels_weighed_against_host_memory(
                hosts.available_memory_bytes, on_host_memory_shortage))
            # Nor may a two-core chip's per-core computations queue behind the test's own work.
            stack.enter_context(interpreter_fixes.core_threads_off_the_kernels_device())
            # A kernel inside jax.custom_vjp: the interpreter's callback effects are its own.
            stack.enter_context(
                interpreter_fixes.interpreter_effects_allowed_in_custom_derivatives())
            # An empty slice at a dimension's end is in bounds, as on the chip.
            stack.enter_context(interpreter_fixes.empty_slices_in_bounds())
            stack.enter_context(interpreter_fixes.zero_byte_waits_return())
            stack.enter_context(interpreter_fixes.empty_accesses_race_with_nothing())
            # Fresh integer memory reads the chip's poison under pl.enable_poison_buffers.
            stack.enter_context(interpreter_fixes.buffers_poisoned_as_the_chip_poisons())
            if self.plain_path:
                # Kernels the TPU interpreter would run no differently: one XLA loop each
                # (its lowering entered before the next, which then lowers it unchecked too).
                stack.enter_context(optional(PLAIN_PATH, lambda: plain_path.kernels_routed(
                    plain_equivalence.decide)))
                if on_plain_path_doubt is not None:
                    stack.enter_context(plain_path.plain_path_doubts(on_plain_path_doubt))
            # JAX's checks of its own invariants (jax_enable_checks, on in JAX's test cases)
            # off inside kernels: they check JAX, not the kernel, at a sixth of a test's CPU.
            stack.enter_context(optional(
                "JAX's own checks off inside kernels", interpreter_speed.jax_checks_off_in_kernels))
            # A read past a buffer stops where the chip halts (a DMA) and reads poison where
            # the chip has no check (a load from SMEM or VMEM): _compat.out_of_bounds.
            stack.enter_context(out_of_bounds.reads_as_the_chip_reads())
            # An output block the grid comes back to holds poison, as the chip's holds
            # whatever its buffer held, and runs on: _compat.output_revisits.
            stack.enter_context(output_revisits.revisits_run_as_on_the_chip())
            # XLA's fast CPU compiles for the test's own jits, where its kernels are
            # interpreted: their compile time is most of an interpreted test's.
            stack.enter_context(xla_cpu_options.fast_cpu_compiles())
            # pltpu.pack_elementwise, unpack_elementwise and stochastic_round, which JAX's
            # CPU cannot run.
            stack.enter_context(interpreter_fixes.tpu_primitives_on_the_cpu())
            # Every instance of a SparseCore kernel (vector or scalar subcore mesh), with the
            # SparseCore's memories, barriers and primitives; a kernel it cannot model skips.
            stack.enter_context(sparsecore.sparsecore_kernels_interpreted())
            # TPU 7x's explicit MXU (pltpu.matmul_push_rhs, matmul_acc_lhs, matmul_pop).
            stack.enter_context(explicit_mxu.explicit_mxu_interpreted())
            # Operands constrained to SMEM or VMEM, as to HBM.
            stack.enter_context(interpreter_fixes.memory_space_constraints_accepted())
            # Loads, stores and DMAs from and to ref.reshape(...) and ref.bitcast(...) views.
            stack.enter_context(ref_views.reshaped_and_bitcast_refs())
            # A DMA indexed by a vector of indices stops at its trace with one line.
            stack.enter_context(indexed_dmas.indexed_dmas_named())
            # A load through pl.ds(i, n, stride=0) reads element i n times, as on the chip
            # (after the views: it rewrites the load before they see it).
            stack.enter_context(interpreter_fixes.zero_stride_reads_broadcast())
            # pltpu.emit_pipeline under jax_use_emit_pipeline_primitive, before JAX 0.12.
            stack.enter_context(interpreter_fixes.emit_pipeline_traced_for_the_interpreter())
            stack.enter_context(pltpu.force_tpu_interpret_mode(self.interpret_params))
            # A kernel in a custom_partitioning body too: XLA's partitioner traces it on a
            # thread of its own, and lowers it with no token for the interpreter's effect.
            stack.enter_context(partitioned_kernels.partitioned_kernels_interpreted())
            # A pallas_call built before (at import time) is interpreted too.
            stack.enter_context(pallas_call_hooks.forced_interpreter_when_called())
            stack.enter_context(pallas_call_hooks.own_interpret_params_kept(
                merge_interpret_params, self.own_params_changed.append_change))
            stack.enter_context(interpreter_fixes.own_interpret_params_kept_on_meshes(
                merge_interpret_params, self.own_params_changed.append_change))
            seen: list[Any] = []
            seen_token = _GPU_KERNELS_RUN.set(seen)
            stack.callback(_GPU_KERNELS_RUN.reset, seen_token)

            def heard(kernel: Any) -> None:
                if rounding == "bfloat16" and not seen:
                    # A GPU kernel: the TPU's rounding is not its own; the rest of the body
                    # computes the GPU's (KernelRun runs a test that needs them from its
                    # start again).
                    _enter_numbers(stack, "tensorfloat32")
                seen.append(kernel)
                if on_gpu_kernel is not None:
                    on_gpu_kernel(kernel)

            # Entered last, so it sees a GPU kernel first: never the TPU interpreter for one.
            stack.enter_context(optional(
                GPU_KERNEL_ROUTING, lambda: gpu_interpreter.gpu_kernels_routed(
                    self.gpu_interpret_params, heard,
                    # What the GPU enforces and the interpreter does not: SMEM per block.
                    judge=gpu_rules.check_smem)))
            yield self


CHIP_NUMBERS = "float32 matmuls rounded as the chip's (--pallas-numerics=chip)"
GPU_WGMMA_NUMBERS = "Mosaic GPU's wgmma with TF32 operands in JAX's GPU interpreter"


def _enter_numbers(stack: contextlib.ExitStack, rounding: str) -> None:
    """Float32 dots rounded to ``rounding`` for the rest of ``stack``'s block (a GPU's: in
    XLA's and Triton's dots, and in Mosaic GPU's wgmma in JAX's GPU interpreter)."""
    optional = jax_internals.optional_feature
    stack.enter_context(optional(CHIP_NUMBERS, lambda: (
        chip_matmuls.float32_dots_rounded(rounding))))
    if rounding == "tensorfloat32" and gpu_interpreter.dependencies_installed():
        stack.enter_context(optional(GPU_WGMMA_NUMBERS, chip_matmuls.gpu_wgmma_rounded))


GPU_KERNEL_ROUTING = "GPU kernels in JAX's GPU interpreter and the plain one"
PLAIN_PATH = "the plain path for kernels the TPU interpreter would run no differently"


_GPU_KERNELS_RUN: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "pallas_gpu_kernels_run", default=None)


def gpu_interpreters_used() -> str | None:
    """Where the GPU kernels run so far inside ``Backend.activate`` went: ``"gpu"``,
    ``"plain"`` or ``"gpu,plain"``; None when none ran (or outside)."""
    seen = _GPU_KERNELS_RUN.get()
    if not seen:
        return None
    return ",".join(sorted({kernel.interpreter for kernel in seen}))


class ParamsChanges(list):
    """What the run changed in kernels' own ``pltpu.InterpretParams`` (one line each)."""

    def append_change(self, kernel: str, changes: list[str]) -> None:
        line = f"kernel {kernel!r} kept its own pltpu.InterpretParams; the run changed " + (
            ", ".join(changes))
        if line not in self:
            self.append(line)


def merge_interpret_params(own: Any, forced: Any) -> tuple[Any, list[str]]:
    """A kernel's own ``pltpu.InterpretParams`` with only what this run must add.

    Everything the kernel chose is kept (out_of_bounds_reads, buffer_bounds,
    random_seed, num_cores_or_threads, uninitialized_memory, ...); the one thing a
    run adds is race detection when ``--pallas-detect-races`` asked for it.
    Returns ``(params, changes)``.
    """
    changes = []
    if forced.detect_races and not own.detect_races:
        own = dataclasses.replace(own, detect_races=True)
        changes.append("detect_races=False -> True (--pallas-detect-races)")
    return own, changes


def chip_info(chip: str) -> Any:
    """``pltpu.TpuInfo`` for a chip name, from JAX's own table of chip facts.

    Megacore chips (v4, v5p) are described as one logical device of two
    TensorCores, which is how JAX runs them by default.
    """
    return tpu_info_for(chip)


def chip_slice(chip: str, tpu_info: Any, device_count: int) -> SliceTopology:
    """The slice of ``chip`` that ``device_count`` devices of ``tpu_info``'s configuration make:
    a chip holds its TensorCores over those one device drives (JAX's chip table)."""
    per_chip = tpu_info.chip_version.num_physical_tensor_cores_per_chip // int(tpu_info.num_cores)
    return slice_topology(chip, device_count, devices_per_chip=max(1, per_chip))


def make_interpret_params(options: PallasOptions, tpu_info: Any) -> Any:
    """What a run forces ``pallas_call``'s ``interpret=`` to: ``True`` (the plain
    interpreter), or the TPU interpreter's parameters, which route the kernels it would run
    no differently to the plain path (``_compat.plain_path``) unless the run asks for the
    TPU interpreter always or for race detection."""
    if options.interpreter == "plain":
        return True
    params = _tpu_interpret_params(options, tpu_info)
    if options.tpu_interpreter_always or options.detect_races:
        return params
    try:
        return plain_path.routing_params(params)
    except jax_internals.JaxInternalsChanged as error:
        jax_internals.feature_off(PLAIN_PATH, error)
        return params


def _tpu_interpret_params(options: PallasOptions, tpu_info: Any) -> Any:
    return jax_internals.with_tile_padded_bounds(jax_internals.interpret_params(
        detect_races=options.detect_races,
        # NaN-poisoned scratch and outputs: an accumulator that is read before
        # it is initialised turns the result into NaN instead of passing by luck.
        uninitialized_memory="nan",
        # Megacore chips run "parallel" grid axes on two TensorCores.
        num_cores_or_threads=tpu_info.num_cores,
        # Visit "parallel" grid axes in a seeded random order, as the chip may.
        random_seed=options.seed,
        # out_of_bounds_reads stays JAX's "raise": _compat.out_of_bounds answers per read,
        # a stop where the chip halts (a DMA), poison where it has no check (a load).
    ))


def make_gpu_interpret_params(options: PallasOptions) -> Any:
    """The ``InterpretGPUParams`` Mosaic GPU kernels run with on the CPU (NaN-poisoned
    memory; race detection under ``--pallas-detect-races``), or None when this JAX has no
    GPU interpreter (one warning; Mosaic GPU kernels then run in the plain interpreter)."""
    try:
        return gpu_interpreter.make_gpu_params(detect_races=options.detect_races)
    except jax_internals.JaxInternalsChanged as error:
        jax_internals.feature_off("JAX's GPU interpreter for Mosaic GPU kernels", error)
        return None


def visible_gpu_devices() -> list:
    """The GPU devices JAX sees, or [] (never raises)."""
    try:
        return list(jax.devices("gpu"))
    except RuntimeError:
        return []


def visible_tpu_devices() -> list:
    """The TPU devices JAX sees, or [] (never raises)."""
    try:
        return list(jax.devices("tpu"))
    except RuntimeError:
        return []


def select_backend(
    options: PallasOptions,
    *,
    tpu_devices: Callable[[], Sequence[Any]] = visible_tpu_devices,
    gpu_devices: Callable[[], Sequence[Any]] = visible_gpu_devices,
) -> Backend:
    """Decide the backend; raise ``pytest.UsageError`` when the request cannot be met."""
    if options.gpu:
        devices = list(gpu_devices())
        if not devices:
            raise pytest.UsageError(
                "--pallas-gpu: JAX sees no GPU; install jax with CUDA on a GPU host "
                "(pip install 'jax[cuda13]'), or drop the flag to interpret on the CPU."
            )
        return Backend(
            platform="gpu",
            interpreter=None,
            chip=options.chip,
            tpu_info=chip_info(options.chip),
            interpret_params=None,
            device_kind=devices[0].device_kind,
            device_count=len(devices),
        )
    if options.tpu:
        devices = list(tpu_devices())
        if not devices:
            raise pytest.UsageError(
                "--pallas-tpu: JAX sees no TPU; run on a TPU VM with "
                "`pip install 'pytest-pallas[tpu]'`, or drop the flag to interpret on the CPU."
            )
        kind = devices[0].device_kind
        version = device_kinds.chip_version_of_device_kind(kind)
        if version is None:
            raise pytest.UsageError(
                f"--pallas-tpu: JAX does not know the chip of device kind {kind!r}; "
                "upgrade jax (pip install -U 'pytest-pallas[tpu]')."
            )
        if options.chip_given and options.chip != version.value:
            raise pytest.UsageError(
                f"--pallas-chip={options.chip} disagrees with the TPU JAX sees ({kind}, chip "
                f"{version.value}); drop --pallas-chip on a TPU."
            )

        return Backend(
            platform="tpu",
            interpreter=None,
            chip=version.value,
            tpu_info=pltpu.get_tpu_info_for_chip(version, getattr(devices[0], "num_cores", 1)),
            interpret_params=None,
            device_kind=kind,
            device_count=len(devices),
        )

    info = chip_info(options.chip)
    cpu_devices = jax.devices("cpu")
    return Backend(
        platform="cpu",
        interpreter=options.interpreter,
        chip=options.chip,
        tpu_info=info,
        interpret_params=make_interpret_params(options, info),
        device_kind=cpu_devices[0].device_kind,
        device_count=len(cpu_devices),
        gpu_interpret_params=make_gpu_interpret_params(options),
        numerics=options.numerics,
    )


# --- What the TPU compiler's schedule needs to become seconds --------------------------


@dataclasses.dataclass(frozen=True)
class ChipTiming:
    """The constants ``pytest_pallas.estimate`` turns a chip's schedule into time with.

    One row per chip, each number with where it comes from (``sources``).
    """

    chip: str
    clock_hz: float
    hbm_bytes_per_second: float  # per TensorCore
    peak_flops_per_second: float  # bfloat16, per TensorCore
    tensorcores: int  # behind one JAX device (megacore: 2)
    branch_delay_slots: int
    dma_latency_seconds: float  # issue to completion of one step's copies, beyond bytes / bandwidth
    sources: dict[str, str]


# What JAX's chip table (pltpu.TpuInfo) does not hold. Delay slots: the bundles
# between the grid loop's backward `sbr.rel` and the end of the loop's region in
# libtpu 0.0.42.1's final_bundles dumps (v4: 1; v5e, v5p, v6e: 4). 7x: 1; its
# dump has 6 empty bundles there, read as padding after the loop (unverified).
# DMA latency: fitted once, on the two 128-block rows of JAX's published v5e
# matmul timings (docs/estimate.md); no chip publishes it, so the v5e value
# stands for every chip.
_DELAY_SLOTS = {"v4": 1, "v5e": 4, "v5p": 4, "v6e": 4, "7x": 1}
_DMA_LATENCY_SECONDS = 0.27e-6
# Multiply-adds libtpu's schedule completes per cycle, per MXU of JAX's table, in units of
# mxu_column_size^2. The clock is the published bf16 peak over what the schedule does per
# cycle, so this is read from the schedule of a large bf16 matmul block (libtpu 0.0.42.1,
# the calibration script's guide_matmul): v4, v5e, v5p finish 4 x 128^2 per bundle (65.1k
# to 66.9k measured), as many as their 4 MXUs of 128; v6e and 7x finish 237.5k per cycle
# of critical path on a 1024 x 2048 x 1024 block, still rising with the block, where
# their 2 MXUs of 256 make 131k: 2 x 256^2 x 2. With 1 there, a dense matmul's estimate on
# v6e or 7x beats the chip's published peak 1.6-fold (docs/estimate.md).
_SCHEDULE_MXU_PASSES = {"v4": 1, "v5e": 1, "v5p": 1, "v6e": 2, "7x": 2}


def chip_timing(chip: str) -> ChipTiming:
    """The :class:`ChipTiming` row of a chip the TPU compiler compiles for (``v5e``, ...).

        >>> round(chip_timing("v5e").clock_hz / 1e9, 2)
        1.5
    """
    if chip not in _DELAY_SLOTS:
        raise ValueError(f"no schedule timing for chip {chip!r}; known: {', '.join(_DELAY_SLOTS)}")
    info = chip_info(chip)
    passes = _SCHEDULE_MXU_PASSES[chip]
    macs_per_cycle = info.num_mxus * info.mxu_column_size ** 2 * passes
    peak = float(info.bf16_ops_per_second)
    jax_table = "JAX's chip table, pltpu.get_tpu_info_for_chip"
    return ChipTiming(
        chip=chip,
        # The schedule finishes macs_per_cycle multiply-adds (2 FLOPs each) per cycle.
        clock_hz=peak / (2 * macs_per_cycle),
        hbm_bytes_per_second=float(info.mem_bw_bytes_per_second),
        peak_flops_per_second=peak,
        tensorcores=int(info.num_cores),
        branch_delay_slots=_DELAY_SLOTS[chip],
        dma_latency_seconds=_DMA_LATENCY_SECONDS,
        sources={
            "clock_hz": f"derived: bf16 FLOP/s / (2 x {info.num_mxus} MXUs x "
                        f"{info.mxu_column_size}^2 x {passes}), the FLOP/s and MXUs from "
                        f"{jax_table}, x {passes} the multiply-adds per MXU and cycle of "
                        "libtpu's schedule of a large bf16 matmul",
            "hbm_bytes_per_second": jax_table,
            "peak_flops_per_second": jax_table,
            "tensorcores": jax_table,
            "branch_delay_slots": "libtpu's final_bundles dump (bundles after the loop's "
                                  "sbr.rel inside its region; 7x unverified)",
            "dma_latency_seconds": "fitted on JAX's published v5e matmul timings "
                                   "(docs/estimate.md)",
        },
    )
