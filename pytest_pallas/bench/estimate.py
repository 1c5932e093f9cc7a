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
import itertools
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .._compat import device_kinds, jax_internals, pallas_call_hooks
from ..backend import chip_info, chip_timing
from ..checks import compile_check, jaxpr_analysis, kernel_model
from ..checks.chip_tracing import tracing_for_chip
from . import kernel_grid as _kernel_grid

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
    libtpu = compile_check.libtpu_version()
    if libtpu is None:
        raise EstimateUnavailable(f"estimate() needs libtpu, the TPU compiler: {INSTALL}")
    if chip not in compile_check.COMPILER_CHIPS:
        raise EstimateUnavailable(
            f"estimate(chip={chip!r}): the TPU compiler compiles for "
            f"{', '.join(compile_check.COMPILER_CHIPS)}; pick one of those ({INSTALL}).")
    compile_check.quiet_libtpu_environment()

    timing = chip_timing(chip)
    info = chip_info(chip)
    # From the traced program, not from observing binds: a kernel inside a jit whose
    # trace JAX cached binds nothing when traced again.
    pipelines: list[Any] = []
    jaxpr, device_kind = _traced_for_chip(fn, args, kwargs, info, pipelines)
    pipeline_loops = [_kernel_grid.pipeline_loop(seen) for seen in pipelines]
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
    mesh_kernels = [(kernel, container) for kernel, container
                    in jaxpr_analysis.mesh_kernel_equations_in(jaxpr)
                    if jaxpr_analysis.mesh_kernel_on_tensor_cores(kernel)]
    exported = []
    # Lowered where the chip still answers for the traced device kind: from jax 0.11 Mosaic's
    # lowering asks pltpu.get_tpu_info() too, for the abstract device the trace recorded.
    with device_kinds.device_kind_answers_as(device_kind, lambda: info):
        for params, avals in calls:
            title = kernel_model.describe_pallas_call(params).title
            exported.append(_lowered(title, chip, lambda: pallas_call_hooks.exported_pallas_call(
                params, avals, info), jax_internals))
        for kernel, container in mesh_kernels:
            title = f"'{jaxpr_analysis.mesh_kernel_name(kernel)}'"
            if container is None:
                raise EstimateUnavailable(
                    f"kernel {title}: its pl.core_map reads refs that no jitted function of "
                    "arrays holds; estimate the function that calls pl.run_state around it")
            exported.append(_lowered(title, chip, lambda: pallas_call_hooks.exported_equation(
                container, info), jax_internals))
    libtpu_seen, schedules = _compile_in_child(exported, chip, timing.branch_delay_slots)
    kernels = []
    for (params, _), schedule in zip(calls, schedules):
        described = kernel_model.describe_pallas_call(params)
        grid = tuple(g or 1 for g in described.grid)
        if isinstance(schedule, str):
            raise KernelRejected(f"kernel {described.title}: {schedule}")
        schedule = _with_pipeline_copies(schedule, pipeline_loops, timing)
        kernels.append(_kernel_estimate(described.name, grid, schedule, params, timing,
                                        _kernel_grid))
    for (kernel, _), schedule in zip(mesh_kernels, schedules[len(calls):]):
        name = jaxpr_analysis.mesh_kernel_name(kernel)
        if isinstance(schedule, str):
            raise KernelRejected(f"kernel '{name}': {schedule}")
        schedule = _with_pipeline_copies(schedule, pipeline_loops, timing)
        kernels.append(_kernel_estimate(name, (), schedule, None, timing, _kernel_grid))
    return Estimate(chip, libtpu_seen or libtpu, tuple(kernels))


def _with_pipeline_copies(schedule: Any, pipeline_loops: list[Any], timing: Any) -> Any:
    """The schedule with each emit_pipeline loop's copies from its BlockSpecs, not its DMAs.

    The dump shows every copy a pipeline step may issue; which ones it does
    (a block whose index did not change is not copied again) follows from the
    pipeline's index maps. The kernels' pipelines, in the order they were traced,
    are matched to the schedule's loops, outer first, by trip count: the whole
    grid, or one TensorCore's share of it. ``pipeline_loops`` is consumed.
    """
    loops = list(schedule.loops)
    for index, loop in enumerate(loops):
        if loop.grid or not pipeline_loops:
            continue
        seen = pipeline_loops[0]
        steps = seen.steps
        shares = set() if steps is None else {-(-steps // cores)
                                                for cores in range(1, timing.tensorcores + 1)}
        if loop.trips not in shares and not (steps is None and loop.trips is None):
            continue
        pipeline_loops.pop(0)
        schedule.notes.extend(seen.notes)
        loop = loops[index] = dataclasses.replace(loop, region_shares=seen.when_shares)
        if seen.copied is not None and steps:
            loops[index] = dataclasses.replace(loop, dma_bytes=int(round(seen.copied / steps)),
                                               copies_from_index_maps=True)
    return dataclasses.replace(schedule, loops=loops, notes=list(schedule.notes))


def _lowered(title: str, chip: str, export: Callable[[], Any], jax_internals: Any) -> Any:
    """``export()``, Mosaic's rejection of the kernel turned into :class:`KernelRejected`."""
    try:
        return export()
    except jax_internals.JaxInternalsChanged:
        raise
    except Exception as error:  # noqa: BLE001  # Mosaic's lowering rejects the kernel
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise KernelRejected(f"kernel {title}: Mosaic cannot lower it for {chip}: "
                             f"{first}") from None


def _traced_for_chip(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                     info: Any, pipelines: list[Any]) -> tuple[Any, str]:
    """``fn``'s jaxpr as traced for the chip: the code that traces a kernel asks JAX about it.

    ``pltpu.emit_pipeline`` asks ``pltpu.get_tpu_info()`` for the chip's tiling, and
    ``pl.kernel`` / ``pl.core_map`` on a TensorCore mesh count its TensorCores; on a
    CPU both would find the CPU ("Unsupported TPU device kind: cpu"). The chip
    answers for this device meanwhile, as in the plugin's tests (``Backend.activate``),
    and kernels trace for Mosaic, not for an interpreter a surrounding test forces.
    Each ``pltpu.emit_pipeline`` the kernels run is appended to ``pipelines``.
    """
    # A device kind of this trace's own: JAX keys its trace caches on the abstract
    # device, so a jitted kernel is traced again and its emit_pipelines are seen.
    device_kind = f"{jax.devices()[0].device_kind} (estimate {next(_TRACE_NUMBERS)})"
    with (
        tracing_for_chip(device_kind, info, replace_stand_in=True),
        pallas_call_hooks.observe_emit_pipelines(pipelines.append),
    ):
        return jax.make_jaxpr(lambda *a: fn(*a, **kwargs))(*args), device_kind


# Never reset: a number used again would meet JAX's trace cache of an earlier estimate.
_TRACE_NUMBERS = itertools.count(1)


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


def _kernel_estimate(name: str, grid: tuple[int, ...], schedule: Any,
                     params: dict[str, Any] | None, timing: Any,
                     kernel_grid: Any) -> KernelEstimate:
    """One kernel's estimate from its schedule.

    ``params`` are a ``pallas_call``'s (its grid and BlockSpecs give the pipeline's
    copies); None for a kernel on a mesh, whose copies are its own DMAs in the dump.
    """
    notes = list(schedule.notes)
    grid_steps = int(np.prod(grid)) if grid else 1
    grid_loop = any(loop.grid for loop in schedule.loops)
    if params is not None:
        copied = kernel_grid.copied_bytes(params)
        first_in, last_out = copied.first_in, copied.last_out
        if grid_loop:
            notes += copied.notes
        else:
            # One step, no grid loop: the DMAs the kernel issues itself (operands left
            # in HBM, copied by an emit_pipeline or by hand) are read from the schedule,
            # which also holds Pallas' own copies of its blocks: the larger, not both.
            notes += [n for n in copied.notes if "stays in HBM" not in n]
            first_in = max(first_in, schedule.dma_in_bytes_outside_loops)
            last_out = max(last_out, schedule.dma_out_bytes_outside_loops)
        dma_per_step = None if copied.total is None else copied.total / grid_steps
        serial_per_step = copied.serial / grid_steps
    else:
        # A mesh kernel's grid is its cores: one step each, whose copies are the
        # DMAs it issues itself (those of its loops are weighed inside them).
        first_in = schedule.dma_in_bytes_outside_loops
        last_out = schedule.dma_out_bytes_outside_loops
        dma_per_step, serial_per_step = 0.0, 0.0
    steps = schedule.loop_steps
    bundles = cp = compute = None
    if schedule.loop_bundles is not None:
        bundles, cp, compute, weight_notes = _weighted_step(
            schedule, params, grid, kernel_grid, timing)
        notes += weight_notes
    seconds = bound = None
    if compute is not None and steps is not None:
        overlapped = (dma_per_step or 0.0) - serial_per_step
        copies = 0.0 if not overlapped else (
            timing.dma_latency_seconds + overlapped / timing.hbm_bytes_per_second)
        # Single-buffered blocks are copied between steps, not while one computes.
        serial = 0.0 if not serial_per_step else (
            timing.dma_latency_seconds + serial_per_step / timing.hbm_bytes_per_second)
        step = max(compute.seconds, copies) + serial
        if params is None:
            bound = compute.bound
        elif compute.seconds >= copies + serial:
            bound = compute.bound
        elif (dma_per_step or 0) / timing.hbm_bytes_per_second >= timing.dma_latency_seconds:
            bound = "memory"
        else:
            bound = "overhead"
        fill = (timing.dma_latency_seconds + first_in / timing.hbm_bytes_per_second
                if first_in else 0.0)
        drain = (timing.dma_latency_seconds + last_out / timing.hbm_bytes_per_second
                 if last_out else 0.0)
        seconds = steps * step + fill + drain
        if not grid_loop:  # the one step's copies: its loops' and its own
            dma_per_step = max(dma_per_step or 0.0, first_in + last_out) + compute.loop_dma_bytes
    return KernelEstimate(name, grid_steps, bundles, cp, dma_per_step, schedule.spills,
                          schedule.vmem_bytes, bound, seconds, tuple(dict.fromkeys(notes)))


@dataclasses.dataclass
class _StepTime:
    """One grid step's schedule: its seconds, what bounds them, the copies its loops issue."""

    seconds: float
    bound: str
    loop_dma_bytes: float


def _weighted_step(schedule: Any, params: dict[str, Any] | None, grid: tuple[int, ...],
                   kernel_grid: Any, timing: Any) -> tuple[float, float, _StepTime, list[str]]:
    """One step's bundles and critical path in cycles, and its time on the chip.

    ``pl.when`` regions of the step are weighted by the share of grid steps that
    run them; every loop inside the step (``emit_pipeline``, ``fori_loop``, nested
    pipelines) by its trip count, each of its iterations taking the longer of its
    own schedule and the copies it issues.
    """
    notes: list[str] = []
    start, end = schedule.loop_start, schedule.loop_end
    inner = [loop for loop in schedule.loops
             if not loop.grid and start <= loop.start and loop.end <= end]
    weight = _region_weights(schedule, inner, params, grid, kernel_grid, notes)
    cycles = weight + _stall_cycles(schedule) * weight
    trips = np.ones(end - start)
    for loop in inner:
        trips[loop.start - start:loop.end - start] *= loop.trips or 1
    bundles = float((weight * trips).sum())
    critical = float((cycles * trips).sum())
    seconds, bound, copied = _StepLoops(inner, cycles, start, timing).span(start, end)
    if any(loop.dma_bytes and not loop.copies_from_index_maps for loop in inner):
        notes.append("copies inside a loop are counted every iteration, those a predicate "
                     "skips (a block whose index did not change) included: an upper bound")
    return bundles, critical, _StepTime(seconds, bound, copied), notes


def _region_weights(schedule: Any, inner: list[Any], params: dict[str, Any] | None,
                    grid: tuple[int, ...], kernel_grid: Any, notes: list[str]) -> Any:
    """Per bundle of the step, the share of runs that execute it: a ``pl.when`` region of
    the kernel by the share of grid steps that run it, one inside a loop by the loop's own
    region shares (each note on what could not be weighted appended to ``notes``)."""
    start, end = schedule.loop_start, schedule.loop_end
    weight = np.ones(end - start)

    def in_a_loop(region: Any) -> bool:
        return any(loop.start <= region.start < loop.end for loop in inner)

    kernel_regions = [r for r in schedule.regions if not r.has_dma and not in_a_loop(r)]
    looped_regions = [r for r in schedule.regions if not r.has_dma and in_a_loop(r)]
    frequencies = (kernel_grid.when_frequencies(params, grid) if params is not None
                   else [])
    if len(frequencies) != len(kernel_regions):
        if kernel_regions:
            notes.append(f"{len(kernel_regions)} predicated regions for {len(frequencies)} "
                         "pl.when: each counted as run every step")
        frequencies = [None] * len(kernel_regions)
    for region, share in zip(kernel_regions, frequencies):
        if share is None:
            if params is not None:
                notes.append("a pl.when whose predicate reads data: counted as run every step")
            continue
        weight[region.start - start:region.end - start] *= share
    unweighted = 0
    for loop in inner:
        children = [other for other in inner if other is not loop
                    and loop.start <= other.start and other.end <= loop.end]
        # A region around an inner loop is the compiler's guard of that loop, no pl.when.
        own = [r for r in looped_regions if loop.start <= r.start < loop.end and not any(
            other.start <= r.start < other.end or r.start <= other.start < r.end
            for other in children)]
        shares = loop.region_shares
        if shares is None or len(shares) != len(own):
            unweighted += len(own)
            continue
        for region, share in zip(own, shares):
            if share is None:
                unweighted += 1
            else:
                weight[region.start - start:region.end - start] *= share
    if unweighted:
        notes.append(f"{unweighted} predicated region(s) inside loops (pl.when in an "
                     "emit_pipeline or fori_loop body): counted as run every iteration")
    return weight


def _stall_cycles(schedule: Any) -> Any:
    """Per bundle of the step, the cycles a block's latency stalls past the bundles that
    follow it before the next block."""
    start, end = schedule.loop_start, schedule.loop_end
    stalls = np.zeros(end - start)
    placed = sorted((b for b in schedule.blocks if b.address is not None
                     and start <= b.address < end), key=lambda b: b.address)
    addresses = [b.address for b in placed] + [end]
    for block, following in zip(placed, addresses[1:]):
        stalls[block.address - start] = max(0, block.cycles - (following - block.address))
    return stalls


class _StepLoops:
    """The loops inside one grid step, nested: each iteration takes the longer of its own
    schedule and the copies it issues."""

    def __init__(self, inner: list[Any], cycles: Any, start: int, timing: Any) -> None:
        self._inner = inner
        self._parents = [self._parent(loop) for loop in inner]
        self._cycles = cycles
        self._start = start
        self._timing = timing

    def _parent(self, loop: Any) -> Any:
        enclosing = [o for o in self._inner if o is not loop and o.start <= loop.start
                     and loop.end <= o.end]
        return min(enclosing, key=lambda o: o.end - o.start) if enclosing else None

    def span(self, lo: int, hi: int, of: Any = None) -> tuple[float, str, float]:
        """Seconds of bundles [lo, hi) run once, what bounds them, the bytes their loops copy."""
        timing = self._timing
        children = [loop for loop, up in zip(self._inner, self._parents) if up is of]
        own = np.ones(hi - lo, dtype=bool)
        seconds, copied, bounds = 0.0, 0.0, []
        for child in children:
            own[child.start - lo:child.end - lo] = False
            body, bound, below = self.span(child.start, child.end, child)
            dma = child.dma_bytes
            copy = (timing.dma_latency_seconds + dma / timing.hbm_bytes_per_second
                    if dma else 0.0)
            times = child.trips or 1
            seconds += times * max(body, copy)
            copied += times * (dma + below)
            bounds.append(bound if body >= copy else "memory" if
                          dma / timing.hbm_bytes_per_second >= timing.dma_latency_seconds
                          else "overhead")
        start = self._start
        seconds += float(self._cycles[lo - start:hi - start][own].sum()) / timing.clock_hz
        bound = "compute" if not bounds or all(b == "compute" for b in bounds) else (
            "memory" if "memory" in bounds else "overhead")
        return seconds, bound, copied


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
