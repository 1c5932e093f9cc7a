"""A kernel's time on a TPU, estimated on a CPU from the TPU compiler's own schedule.

``estimate(fn, *args, chip="v5e")`` traces ``fn``, compiles each ``pallas_call`` it
makes ahead of time for the chip (libtpu, no TPU), reads the compiler's schedule
of the grid loop (``_compat.libtpu_dump``) and turns it into seconds with the chip's
constants (``backend.chip_timing``). Per grid step the kernel costs the larger of

* its schedule: the loop body's bundles, ``pl.when`` regions weighted by the
  share of steps that take them, plus the cycles a basic block's critical path
  runs past its bundles (the MXU's result pops stall), at the chip's clock;
* its copies: the bytes Pallas' pipeline moves that step over HBM bandwidth, plus
  the DMA latency from issue to completion;

over the steps the loop runs on one TensorCore, plus filling the pipeline (the
first step's blocks) and draining it (the last output block). The model's
limits are stated in docs/estimate.md. The same kernel, arguments, chip and
libtpu give the same numbers.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any

INSTALL = "pip install 'pytest-pallas[tpu]'"
# A compile of one large kernel takes seconds; a child still busy after this is stuck.
_CHILD_TIMEOUT_SECONDS = 900


@dataclasses.dataclass(frozen=True)
class KernelEstimate:
    """One ``pallas_call`` on the chip; a metric is None where the dump was unreadable."""

    name: str
    grid_steps: int
    bundles_per_step: float | None
    critical_path_per_step: float | None  # cycles, pl.when regions weighted
    dma_bytes_per_step: float | None
    spills: int | None  # spill stores and fill loads in one step's bundles
    vmem_bytes: int | None
    bound: str | None  # "compute" | "memory" | "overhead"
    seconds: float | None
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What :func:`estimate` returns: per kernel, and the sum over them."""

    chip: str
    libtpu: str
    kernels: tuple[KernelEstimate, ...]

    @property
    def seconds(self) -> float | None:
        """Estimated time of one call on the chip (Pallas kernels only), None if any is unknown."""
        times = [k.seconds for k in self.kernels]
        return None if any(t is None for t in times) else float(sum(times))  # type: ignore[arg-type]

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(f"{k.name}: {note}" for k in self.kernels for note in k.notes)


class EstimateUnavailable(RuntimeError):
    """estimate() cannot run here (no libtpu, a chip libtpu does not compile for)."""


class KernelRejected(EstimateUnavailable):
    """The TPU compiler (or Mosaic's lowering) rejects the kernel for the chip."""


def estimate(fn: Callable[..., Any], *args: Any, chip: str = "v5e", **kwargs: Any) -> Estimate:
    """Estimate ``fn(*args, **kwargs)``'s Pallas kernels on TPU ``chip`` from its schedule.

    ``args`` may be arrays or ``jax.ShapeDtypeStruct``; nothing runs, so sizes a
    CPU could never hold are estimated too. Raises :class:`EstimateUnavailable`
    (one line, naming the fix) without libtpu or for a chip it does not compile for.
    """
    from ..checks import compile_check

    libtpu = compile_check.libtpu_version()
    if libtpu is None:
        raise EstimateUnavailable(f"estimate() needs libtpu, the TPU compiler: {INSTALL}")
    if chip not in compile_check.COMPILER_CHIPS:
        raise EstimateUnavailable(
            f"estimate(chip={chip!r}): the TPU compiler compiles for "
            f"{', '.join(compile_check.COMPILER_CHIPS)}; pick one of those ({INSTALL}).")
    compile_check.quiet_libtpu_environment()
    import jax

    from .._compat import jax_internals, pallas_call_hooks
    from ..backend import chip_info, chip_timing
    from ..checks import jaxpr_analysis, kernel_model
    from . import kernel_grid as _kernel_grid

    timing = chip_timing(chip)
    # From the traced program, not from observing binds: a kernel inside a jit whose
    # trace JAX cached binds nothing when traced again.
    jaxpr = jax.make_jaxpr(lambda *a: fn(*a, **kwargs))(*args)
    calls = []
    for params, avals, mesh_axes in jaxpr_analysis.pallas_call_equations_in(jaxpr):
        if not kernel_model.describe_pallas_call(params).for_tensor_core:
            continue
        if mesh_axes and jaxpr_analysis.pallas_call_communicates(params):
            title = kernel_model.describe_pallas_call(params).title
            raise EstimateUnavailable(
                f"kernel {title} copies between devices inside shard_map; estimate() reads "
                "single-device schedules only: estimate it without the remote copies")
        calls.append((params, avals))
    info = chip_info(chip)
    exported = []
    for params, avals in calls:
        try:
            exported.append(pallas_call_hooks.exported_pallas_call(params, avals, info))
        except jax_internals.JaxInternalsChanged:
            raise
        except Exception as error:  # noqa: BLE001  # Mosaic's lowering rejects the kernel
            title = kernel_model.describe_pallas_call(params).title
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise KernelRejected(f"kernel {title}: Mosaic cannot lower it for {chip}: "
                                 f"{first}") from None
    libtpu_seen, schedules = _compile_in_child(exported, chip, timing.branch_delay_slots)
    kernels = []
    for (params, _), schedule in zip(calls, schedules):
        described = kernel_model.describe_pallas_call(params)
        grid = tuple(g or 1 for g in described.grid)
        if isinstance(schedule, str):
            raise KernelRejected(f"kernel {described.title}: {schedule}")
        kernels.append(_kernel_estimate(described.name, grid, schedule, params, timing,
                                        _kernel_grid))
    return Estimate(chip, libtpu_seen or libtpu, tuple(kernels))


def _compile_in_child(exported: list[Any], chip: str, delay_slots: int) -> tuple[str, list[Any]]:
    if not exported:
        return "", []
    request = pickle.dumps({"chip": chip, "delay_slots": delay_slots, "kernels": exported})
    # The child's libtpu must start with the dump flags: a fresh interpreter, this package.
    # JAX_PLATFORMS=cpu: it compiles for topologies only and must not claim a TPU that this
    # process may hold.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [root, os.environ.get("PYTHONPATH", "")])), "JAX_PLATFORMS": "cpu"}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest_pallas.bench.estimate_worker"],
                              input=request, capture_output=True, env=env, check=False,
                              timeout=_CHILD_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise EstimateUnavailable(
            f"compiling for {chip} took over {_CHILD_TIMEOUT_SECONDS} s in the schedule reader "
            "and was stopped; estimate fewer or smaller kernels at a time") from None
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise EstimateUnavailable(f"compiling for {chip} failed in the schedule reader: {tail[0]}")
    version, results = pickle.loads(done.stdout)
    return version, results


def _kernel_estimate(name: str, grid: tuple[int, ...], schedule: Any, params: dict[str, Any],
                     timing: Any, kernel_grid: Any) -> KernelEstimate:
    import numpy as np

    notes = list(schedule.notes)
    grid_steps = int(np.prod(grid)) if grid else 1
    copied = kernel_grid.copied_bytes(params)
    notes += copied.notes
    first_in, last_out = copied.first_in, copied.last_out
    dma_per_step = None if copied.total is None else copied.total / grid_steps
    serial_per_step = copied.serial / grid_steps
    steps = schedule.loop_steps
    bundles = cp = None
    if schedule.loop_bundles is not None:
        bundles, cp, weight_notes = _weighted_step(schedule, params, grid, kernel_grid)
        notes += weight_notes
    seconds = bound = None
    if cp is not None and steps is not None:
        compute = cp / timing.clock_hz
        overlapped = (dma_per_step or 0.0) - serial_per_step
        copies = 0.0 if not overlapped else (
            timing.dma_latency_seconds + overlapped / timing.hbm_bytes_per_second)
        # Single-buffered blocks are copied between steps, not while one computes.
        serial = 0.0 if not serial_per_step else (
            timing.dma_latency_seconds + serial_per_step / timing.hbm_bytes_per_second)
        step = max(compute, copies) + serial
        if compute >= copies + serial:
            bound = "compute"
        elif (dma_per_step or 0) / timing.hbm_bytes_per_second >= timing.dma_latency_seconds:
            bound = "memory"
        else:
            bound = "overhead"
        fill = (timing.dma_latency_seconds + first_in / timing.hbm_bytes_per_second
                if first_in else 0.0)
        drain = (timing.dma_latency_seconds + last_out / timing.hbm_bytes_per_second
                 if last_out else 0.0)
        seconds = steps * step + fill + drain
    return KernelEstimate(name, grid_steps, bundles, cp, dma_per_step, schedule.spills,
                          schedule.vmem_bytes, bound, seconds, tuple(dict.fromkeys(notes)))


def _weighted_step(schedule: Any, params: dict[str, Any], grid: tuple[int, ...],
                   kernel_grid: Any) -> tuple[float, float, list[str]]:
    """One step's bundles and critical path in cycles, pl.when regions weighted by use."""
    import numpy as np

    notes = []
    start, end = schedule.loop_start, schedule.loop_end
    weight = np.ones(end - start)
    kernel_regions = [r for r in schedule.regions if not r.has_dma]
    frequencies = kernel_grid.when_frequencies(params, grid)
    if len(frequencies) != len(kernel_regions):
        if kernel_regions:
            notes.append(f"{len(kernel_regions)} predicated regions for {len(frequencies)} "
                         "pl.when: each counted as run every step")
        frequencies = [None] * len(kernel_regions)
    for region, share in zip(kernel_regions, frequencies):
        if share is None:
            notes.append("a pl.when whose predicate reads data: counted as run every step")
            continue
        weight[region.start - start:region.end - start] *= share
    bundles = float(weight.sum())
    placed = sorted((b for b in schedule.blocks if b.address is not None
                     and start <= b.address < end), key=lambda b: b.address)
    addresses = [b.address for b in placed] + [end]
    stall = 0.0
    for block, following in zip(placed, addresses[1:]):
        stall += max(0, block.cycles - (following - block.address)) * weight[block.address - start]
    return bundles, float(bundles + stall), notes


# --- Ranking block sizes ------------------------------------------------------------------

#: Estimates within this factor of each other are not told apart (docs/estimate.md, Limits).
RESOLUTION = 1.05


@dataclasses.dataclass(frozen=True)
class BlockCandidate:
    """One candidate of :func:`rank_blocks`: its blocks, its estimate or why it has none."""

    blocks: dict[str, Any]
    seconds: float | None
    bound: str | None
    within_resolution_of_best: bool  # the model cannot say it is slower than the best
    problem: str | None = None  # the compiler's rejection (VMEM, tiling), in one line


def rank_blocks(fn: Callable[..., Any], candidates: list[dict[str, Any]], *args: Any,
                chip: str = "v5e", **kwargs: Any) -> list[BlockCandidate]:
    """Candidate block sizes of ``fn`` ranked for ``chip`` by :func:`estimate`, fastest first.

    Each candidate is a dict of keyword arguments of ``fn`` (``{"bm": 512, "bk":
    1024}``). Candidates the TPU compiler rejects come last, with its reason.
    Within :data:`RESOLUTION` of the fastest, candidates are marked as ties:
    near the MXU's peak the model cannot separate close configurations.
    """
    ranked = []
    for blocks in candidates:
        try:
            est = estimate(fn, *args, chip=chip, **kwargs, **blocks)
        except KernelRejected as error:
            ranked.append(BlockCandidate(dict(blocks), None, None, False, str(error)))
            continue
        bounds = {k.bound for k in est.kernels}
        ranked.append(BlockCandidate(dict(blocks), est.seconds, "/".join(sorted(
            b for b in bounds if b)) or None, False))
    timed = sorted((c for c in ranked if c.seconds is not None), key=lambda c: c.seconds)
    best = timed[0].seconds if timed else None
    return [dataclasses.replace(c, within_resolution_of_best=c.seconds <= best * RESOLUTION)
            for c in timed] + [c for c in ranked if c.seconds is None]
