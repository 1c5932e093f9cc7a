"""What a TPU would reject or get wrong in a pallas_call that interprets fine on the CPU.

Interpret mode runs a kernel's Python semantics; it does not know which block
shapes Mosaic lowers, how much VMEM the chip has, that "parallel" grid axes
are split across TensorCores, or that an output block is written back to HBM
as soon as the grid leaves it. The checks here read a pallas_call's grid
mapping (as :mod:`pytest_pallas.checks.kernel_model` describes it) and name the rule a kernel
breaks, the operand, and the fix:

``block-tiling``
    Mosaic's own lowering rule (``_check_block_mappings`` in
    ``jax/_src/pallas/mosaic/lowering.py``): for blocks of rank >= 2 the last
    dimension is a multiple of 128 or the full array dimension, the
    second-minor a multiple of 8 or the full dimension, whatever the dtype; a
    squeezed (``None``/``pl.Squeezed``) dimension counts as 1. Rank-1 blocks:
    the full dimension, a multiple of 1024 (8 x 128), or a power of two of at
    least 128 x (32 / bitwidth). Blocks in ``pl.ANY``/HBM: the whole array with
    an index map of zeros. 8- and 4-bit blocks need 32 and 64 rows: the TPU
    compiler tiles them packed and rejects fewer (E2002). The packed tiling of
    16-bit dtypes (16 rows) is what XLA's layouts use, but the compiler
    accepts 8-row blocks of bfloat16; ask for it with ``packed_sublanes=True``.
``vmem-footprint``
    Every VMEM block buffered (twice unless ``pipeline_mode=pl.Buffered(n)``,
    once in a call of a single grid step or none, as the TPU compiler does),
    plus VMEM scratch, plus the peak of ``pl.run_scoped`` allocations, padded
    to (8, 128) tiles, against the scoped-VMEM limit the kernel compiles under:
    ``CompilerParams(vmem_limit_bytes=...)`` if given, else the default limit
    of the chip (16 MiB up to v5, 32 MiB from v6e). That limit, not the
    capacity, is what Mosaic enforces: a kernel between the two fails to
    compile until it raises the limit. ``vmem_limit_bytes`` itself must not
    exceed ``TpuInfo.vmem_capacity_bytes``.
``parallel-axis-race``
    An output block written from two grid points that differ along an axis
    marked "parallel": megacore chips split those axes across TensorCores,
    which then race on the block, and each core starts its own accumulator.
``output-revisit``
    An output block visited again after the grid left it, by a kernel that may
    read the block before writing it (an accumulator): Pallas TPU writes a block
    back when the grid moves on and never reads it back, so a reduction must sit
    on the minormost (last) grid axes. A kernel that writes the block before
    reading it (a two-pass kernel) is right on the chip, whose last write-back is
    the block's value: its values decide (:mod:`pytest_pallas.checks.block_reads`).
``block-out-of-bounds``
    An index map that returns a block lying wholly outside its array.

Each rule is one function registered where it is defined (``@static_rule``, in
:mod:`pytest_pallas.checks.violations`): :func:`check_pallas_call_info` runs every one,
in the order the chip meets them. A new static rule is one such function, here or in a
module this one imports (the VMEM rule lives in :mod:`pytest_pallas.checks.vmem_footprint`).

Races, DMA waits and semaphores are dynamic: :mod:`pytest_pallas.checks.runtime_rules`
turns what the TPU interpreter saw at kernel exit into the same kind of
error, and names the rule behind the interpreter's own errors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tiling
from . import vmem_footprint  # noqa: F401  (registers the VMEM rule)
from .violations import (
    KernelReport,
    RuleOptions,
    Violation,
    block_text,
    describe_operand,
    dtype_bits,
    name_of_dtype,
    static_rule,
    static_rules,
)

if TYPE_CHECKING:
    from pytest_pallas.checks.kernel_model import BlockOperand, PallasCallInfo


TILING = "block-tiling"
PARALLEL_RACE = "parallel-axis-race"
REVISIT = "output-revisit"
OUT_OF_BOUNDS = "block-out-of-bounds"
# The check that evaluates the index maps over the grid once, for the three rules above.
GRID_ORDER = "grid-order"


#: Largest grid whose index maps are evaluated point by point; beyond it the
#: grid-order checks reason from which grid axes each index map reads.
MAX_GRID_POINTS = 1 << 16


_PARALLEL = ("parallel", "core_parallel")


@static_rule(TILING, stage="lowering")
def check_block_tiling(call: PallasCallInfo, info: Any, options: RuleOptions,
                       report: KernelReport) -> list[Violation]:
    """Mosaic's block-shape rule, for every input and output BlockSpec of ``call``."""
    found = []
    for operand in call.operands:
        violation = _tiling_violation(call, operand, info, options.packed_sublanes)
        if violation is not None:
            found.append(violation)
    return found


def _tiling_violation(
    call: PallasCallInfo, operand: BlockOperand, info: Any, packed: bool
) -> Violation | None:
    """The TPU's tiling rule on one operand's block: a scalar block, a windowed block in
    HBM, then the rule of its rank (the last two dimensions, or a rank-1 block)."""
    space = operand.memory_space
    if space == "semaphore" or (space == "smem" and operand.trivial_window):
        return None
    bits = dtype_bits(operand.dtype)
    if bits is None:  # extended dtypes (PRNG keys, ...): Mosaic checks their physical shape
        return None
    where = describe_operand(operand)
    rank = len(operand.block_dims)
    if rank < 1:
        return Violation(
            TILING,
            call.title,
            where,
            "Mosaic supports only blocks of rank >= 1, and this block is a scalar.",
            "give the operand at least one dimension, or pass it through SMEM "
            "(pltpu.PrefetchScalarGridSpec or memory_space=pltpu.SMEM).",
        )
    if space in ("any", "hbm") and not operand.trivial_window:
        return Violation(
            TILING,
            call.title,
            where,
            f"it lives in memory space {space} (no automatic copy to VMEM) but its "
            f"{block_text(operand)} is not the whole array with an index map of zeros, which "
            "is all Mosaic accepts there.",
            "drop block_shape and index_map for pl.ANY operands "
            "(pl.BlockSpec(memory_space=pl.ANY)) and copy the part you need with "
            "pltpu.make_async_copy, or use a VMEM BlockSpec to let Pallas copy the block.",
        )
    if rank >= 2:
        return _last_two_dims_violation(call, operand, info, packed, bits, where)
    return _rank1_violation(call, operand, info, bits, where)


def _last_two_dims_violation(call: PallasCallInfo, operand: BlockOperand, info: Any,
                             packed: bool, bits: int, where: str) -> Violation | None:
    """A block of rank >= 2: its last dimension a multiple of the lanes, its second-minor
    one of the dtype's sublane rows (or each the full dimension)."""
    sizes, shape = operand.block_shape, operand.array_shape
    problems, fixes = [], []
    minor, full_minor = sizes[-1], shape[-1]
    if not tiling.minor_ok(minor, full_minor, info.num_lanes):
        problems.append(
            f"its last dimension is {_dim_text(operand, -1)} but must be a multiple of "
            f"{info.num_lanes} or the full {full_minor}"
        )
        fixes.append(_suggest(operand, -1, info.num_lanes))
    # 8- and 4-bit blocks: the TPU compiler tiles them packed, whatever the option
    # (E2002 for 8 or 16 rows of int8); 16-bit ones in 8 rows unless asked.
    rows = tiling.required_sublanes(operand.dtype, packed=packed, sublanes=info.num_sublanes)
    second, full_second = sizes[-2], shape[-2]
    if not tiling.second_minor_ok(second, full_second, rows):
        reason = f"a multiple of {rows}" + (
            f" ({32 // bits} rows of {name_of_dtype(operand.dtype)} pack into each 32-bit "
            "sublane)"
            if rows != info.num_sublanes
            else ""
        )
        problems.append(
            f"its second-minor dimension is {_dim_text(operand, -2)} but must be {reason} "
            f"or the full {full_second}"
        )
        fixes.append(_suggest(operand, -2, rows))
    if not problems:
        return None
    return Violation(
        TILING,
        call.title,
        where,
        f"{block_text(operand)}: {'; '.join(problems)} "
        f"({_tiling_rule_text(operand, info, rows, narrow=bits < 16)}).",
        "; ".join(fixes) + ".",
    )


def _tiling_rule_text(operand: BlockOperand, info: Any, rows: int, *, narrow: bool) -> str:
    """The tiling rule of ``operand``'s dtype, as a violation states it."""
    if rows == info.num_sublanes:
        return ("Mosaic's TPU lowering requires the last two block dimensions to be divisible "
                f"by {info.num_sublanes} and {info.num_lanes} or equal to the array's")
    return (
        f"the TPU compiler tiles {name_of_dtype(operand.dtype)} in "
        f"({rows}, {info.num_lanes}): "
        if narrow else "with packed sublanes (packed_sublanes=True) "
    ) + (
        f"the last two block dimensions "
        f"must be divisible by {rows} and {info.num_lanes} or equal to the array's"
    )


def _rank1_violation(call: PallasCallInfo, operand: BlockOperand, info: Any, bits: int,
                     where: str) -> Violation | None:
    """A rank-1 block: the full dimension, a multiple of a whole (sublanes, lanes) tile,
    or a power of two of at least the lanes times the dtype's packing."""
    packing = 32 // bits if bits < 32 else 1
    chunk = info.num_sublanes * info.num_lanes
    min_tiling = info.num_lanes * packing
    (size,), (full,) = operand.block_shape, operand.array_shape
    if tiling.rank1_ok(size, full, bits, sublanes=info.num_sublanes, lanes=info.num_lanes):
        return None
    return Violation(
        TILING,
        call.title,
        where,
        f"{block_text(operand)}: Mosaic lowers a rank-1 block only if it is the full "
        f"dimension ({full}), a multiple of {chunk} ({info.num_sublanes} x {info.num_lanes}), "
        f"or a power of two of at least {min_tiling} (128 x 32 / {bits} bits); "
        f"it is {size}.",
        f"use a block of {_next_rank1(size, chunk, min_tiling, full)} or the full {full}, "
        "or reshape the array to 2-D (rows, 128) and block it as (8k, 128).",
    )


def _dim_text(operand: BlockOperand, axis: int) -> str:
    kind, size = operand.block_dims[axis]
    return f"squeezed (None, counted as {size})" if kind == "squeezed" else str(size)


def _suggest(operand: BlockOperand, axis: int, multiple: int) -> str:
    kind, size = operand.block_dims[axis]
    full = operand.array_shape[axis]
    name = "last" if axis == -1 else "second-minor"
    if kind == "squeezed":
        return (
            f"keep the {name} dimension in the block (size {min(full, multiple)} or the full "
            f"{full}) and index it inside the kernel, or squeeze a leading dimension instead"
        )
    bigger = -(-size // multiple) * multiple
    if bigger < full:
        return (
            f"make the {name} block dimension {bigger} (a multiple of {multiple}) "
            f"or the full {full}"
        )
    return f"make the {name} block dimension the full {full}"


def _next_rank1(size: int, chunk: int, min_tiling: int, full: int) -> int:
    power = max(min_tiling, 1 << max(0, (size - 1).bit_length()))
    return min(power, -(-size // chunk) * chunk, max(full, min_tiling))


@static_rule(GRID_ORDER, stage="run", reports=(PARALLEL_RACE, REVISIT, OUT_OF_BOUNDS))
def check_grid_order(call: PallasCallInfo, info: Any, options: RuleOptions,
                     report: KernelReport) -> list[Violation]:
    """Races on "parallel" axes, revisited output blocks, out-of-bounds blocks; what could
    not be judged goes to ``report.skipped``, what the values decide to ``report.suspects``."""
    del info
    violations, notes, suspects = _grid_order(call, max_grid_points=options.max_grid_points)
    report.skipped.extend(notes)
    report.suspects.extend(suspects)
    return violations


def _grid_order(call: PallasCallInfo, *, max_grid_points: int
                ) -> tuple[list[Violation], list[str], list[Violation]]:
    """Evaluates every index map over the whole grid when it has at most
    ``max_grid_points`` points; larger grids are judged from which grid axes
    each output's index map reads. Returns ``(violations, skipped notes, suspects)``.
    """
    notes: list[str] = []
    suspects: list[Violation] = []
    if any(g is None for g in call.grid):
        return [], ["grid-order checks: the grid has dynamic dimensions"], []
    grid = tuple(int(g) for g in call.grid)
    size = math.prod(grid)
    if size == 0:
        return [], [], []
    exact = size <= max_grid_points
    points = None
    if exact:
        points = np.indices(grid).reshape(len(grid), -1).T if grid else np.zeros((1, 0), np.int64)
    else:
        notes.append(
            f"grid-order checks: grid {grid} has {size} points (> {max_grid_points}); "
            "judged from the axes each index map reads"
        )
    parallel_axes = [
        a for a, s in enumerate(call.dimension_semantics) if s in _PARALLEL and grid[a] > 1
    ]
    violations: list[Violation] = []
    for operand in call.operands:
        if operand.memory_space in ("any", "hbm", "semaphore"):
            continue
        if operand.index_map_reads_scalar_prefetch:
            notes.append(
                f"grid-order checks: the index map of {describe_operand(operand)} reads scalar "
                "prefetch operands (TPU interpret mode checks revisits at run time)"
            )
            continue
        if not exact:
            if operand.role == "output":
                for found in _order_by_dataflow(call, operand, grid, parallel_axes):
                    if found.rule == REVISIT:
                        _revisit_found(found, operand, violations, suspects)
                    else:
                        violations.append(found)
            continue
        try:
            blocks = operand.block_indices(points)
        except Exception as error:  # noqa: BLE001  # an index map not evaluable on the CPU
            notes.append(
                f"grid-order checks: could not evaluate the index map of "
                f"{describe_operand(operand)} ({type(error).__name__}: {error})"
            )
            continue
        bounds = _out_of_bounds(call, operand, blocks, points)
        if bounds is not None:
            violations.append(bounds)
            continue
        if operand.role != "output":
            continue
        _, ids = np.unique(blocks, axis=0, return_inverse=True)
        ids = ids.reshape(-1)
        race = _parallel_race(call, operand, grid, parallel_axes, ids, blocks, points)
        if race is not None:
            violations.append(race)
        elif not operand.revisit_any:
            revisit = _revisit(call, operand, grid, ids, blocks, points)
            if revisit is not None:
                _revisit_found(revisit, operand, violations, suspects)
    return violations, notes, suspects


def _revisit_found(revisit: Violation, operand: BlockOperand, violations: list[Violation],
                   suspects: list[Violation]) -> None:
    """A revisit breaks the rule where the kernel may read the stale block. A kernel that
    writes the block before reading it is right on the chip if what it writes on the last
    visit is the block's (its last write-back is the block's value; a two-pass kernel), and
    wrong if it is a scratch accumulator carried over from other blocks: the values decide,
    and a failure names the revisit."""
    (violations if operand.read_before_written else suspects).append(revisit)


def _point(p: Any) -> str:
    values = tuple(int(v) for v in p)
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"


def _axes_text(call: PallasCallInfo, axes: Iterable[int]) -> str:
    return ", ".join(f'{a} ("{call.dimension_semantics[a]}")' for a in axes)


def _out_of_bounds(call, operand, blocks, points) -> Violation | None:
    if blocks.shape[1] != len(operand.block_dims):
        return None
    kinds = [kind for kind, _ in operand.block_dims]
    # A blocked dimension's index counts blocks, a squeezed one's counts elements;
    # element, bounded and indirect dimensions index in ways checked at run time.
    checked = np.array([kind in ("blocked", "squeezed") for kind in kinds])
    if not checked.any():
        return None
    step = np.array(
        [size if kind == "blocked" else 1 for kind, size in operand.block_dims], dtype=np.int64
    )
    shape = np.array(operand.array_shape, dtype=np.int64)
    bad = checked & ((blocks < 0) | (blocks * step >= shape))
    rows = np.flatnonzero(bad.any(axis=1))
    if rows.size == 0:
        return None
    row = rows[0]
    axis = int(np.flatnonzero(bad[row])[0])
    count = -(-int(shape[axis]) // int(step[axis]))
    unit = f"block(s) of {int(step[axis])}" if kinds[axis] == "blocked" else "element(s)"
    return Violation(
        OUT_OF_BOUNDS,
        call.title,
        describe_operand(operand),
        f"at grid point {_point(points[row])} its index map returns block {_point(blocks[row])}, "
        f"but dimension {axis} of the {name_of_dtype(operand.dtype)}"
        f"{list(operand.array_shape)} array has only {count} {unit} (valid indices "
        f"0..{count - 1}); on the TPU the block's DMA reads or writes outside the array.",
        "return block indices, not element offsets, from the index map, and size the grid as "
        "pl.cdiv(array dimension, block dimension).",
    )


def _parallel_race(call, operand, grid, parallel_axes, ids, blocks, points) -> Violation | None:
    if not parallel_axes:
        return None
    keys = np.ravel_multi_index(points[:, parallel_axes].T, [grid[a] for a in parallel_axes])
    pairs = np.unique(np.stack([ids, keys], axis=1), axis=0)
    distinct = np.bincount(pairs[:, 0], minlength=int(ids.max()) + 1)
    shared = np.flatnonzero(distinct > 1)
    if shared.size == 0:
        return None
    block_id = shared[0]
    rows = np.flatnonzero(ids == block_id)
    first = rows[0]
    other = next(r for r in rows if keys[r] != keys[first])
    differing = [a for a in parallel_axes if points[first, a] != points[other, a]]
    return Violation(
        PARALLEL_RACE,
        call.title,
        describe_operand(operand),
        f"its block {_point(blocks[first])} is written at grid points {_point(points[first])} and "
        f"{_point(points[other])}, which differ along grid axis {_axes_text(call, differing)}. "
        'A "parallel" axis promises that its iterations are independent: megacore chips '
        "(v4, v5p) split it across two TensorCores, which then both write this block and each "
        "start their own accumulator, and TPU interpret mode runs it in a shuffled order.",
        f'mark axis {", ".join(map(str, differing))} "arbitrary" in '
        "pltpu.CompilerParams(dimension_semantics=...) and move it after the parallel axes "
        "(a reduction belongs on the last grid axes), or make the output's index map depend on it.",
        output_index=operand.index,
    )


def _revisit(call, operand, grid, ids, blocks, points) -> Violation | None:
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    run_ids = ids[starts]
    seen: dict[int, int] = {}
    for run, block_id in enumerate(run_ids):
        if block_id in seen:
            earlier = seen[block_id]
            first = starts[earlier]
            left = starts[earlier + 1]
            again = starts[run]
            reduction = [a for a in range(len(grid))
                         if grid[a] > 1 and a not in operand.index_map_axes]
            return Violation(
                REVISIT,
                call.title,
                describe_operand(operand),
                f"its block {_point(blocks[first])} is visited at grid point "
                f"{_point(points[first])}, "
                f"left at {_point(points[left])} and visited again at {_point(points[again])}. "
                "Pallas TPU writes an output block back to HBM when the grid moves to another "
                "block and never reads it back, so the second visit starts from stale VMEM "
                "(the TPU interpreter holds poison there; plain interpret mode hides it).",
                (
                    f"put the reduction axis {', '.join(map(str, reduction))} last in the grid "
                    "(the minormost axes iterate fastest), so each output block's visits are "
                    "consecutive"
                    if reduction
                    else "order the grid so that each output block's visits are consecutive"
                )
                + "; or, if the revisit is intended, pass pipeline_mode=pl.Buffered(1, "
                "revisit=pl.RevisitMode.ANY) on the output BlockSpec (Mosaic allows "
                "RevisitMode.ANY only single-buffered).",
            )
        seen[block_id] = run
    return None


def _order_by_dataflow(call, operand, grid, parallel_axes) -> list[Violation]:
    reads = operand.index_map_axes
    missing_parallel = [a for a in parallel_axes if a not in reads]
    if missing_parallel:
        return [
            Violation(
                PARALLEL_RACE,
                call.title,
                describe_operand(operand),
                f"its index map does not read grid axis {_axes_text(call, missing_parallel)}, "
                'so grid points that differ only along that "parallel" axis write the same '
                "block; megacore chips split parallel axes across TensorCores, which then race "
                "on it.",
                f'mark axis {", ".join(map(str, missing_parallel))} "arbitrary" and move it '
                "after the parallel axes, or make the output's index map depend on it.",
                output_index=operand.index,
            )
        ]
    if operand.revisit_any:
        return []
    live = [a for a in range(len(grid)) if grid[a] > 1]
    unread = [a for a in live if a not in reads]
    read = [a for a in live if a in reads]
    if unread and read and min(unread) < max(read):
        return [
            Violation(
                REVISIT,
                call.title,
                describe_operand(operand),
                f"its index map ignores grid axis {min(unread)} but reads axis {max(read)}, which "
                "iterates faster, so each block is left and visited again; Pallas TPU writes a "
                "block back when the grid leaves it and never reads it back.",
                f"put the reduction axis {', '.join(map(str, unread))} last in the grid, or pass "
                "pipeline_mode=pl.Buffered(1, revisit=pl.RevisitMode.ANY) on the output BlockSpec.",
            )
        ]
    return []


def _output_blocks(call: PallasCallInfo) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """The outputs whose BlockSpec tiles them into VMEM blocks (not pl.ANY, not element
    offsets), as (array shape, block shape)."""
    return tuple(
        (operand.array_shape, operand.block_shape)
        for operand in call.operands
        if operand.role == "output" and operand.memory_space == "vmem"
        and all(kind in ("blocked", "squeezed") for kind, _ in operand.block_dims)
        and len(operand.block_dims) == len(operand.array_shape)
    )


def check_pallas_call_info(
    call: PallasCallInfo,
    info: Any,
    *,
    checks: Sequence[str] | None = None,
    packed_sublanes: bool = False,
    vmem_bound: str = "scoped",
    max_grid_points: int = MAX_GRID_POINTS,
) -> KernelReport:
    """Run the static rules named in ``checks`` (None: every registered one) on a described
    pallas_call; the report lists what they found."""
    rules = static_rules()
    checks = [rule.name for rule in rules] if checks is None else checks
    unknown = sorted(set(checks) - {rule.name for rule in rules})
    if unknown:
        raise ValueError(f"checks={tuple(checks)!r} names no static rule {', '.join(unknown)}; "
                         f"the static rules are {', '.join(rule.name for rule in rules)}")
    report = KernelReport(call.title, call.grid, call.dimension_semantics,
                          output_blocks=_output_blocks(call),
                          revisits_any=any(operand.revisit_any for operand in call.operands
                                           if operand.role == "output"),
                          uses_host_memory=any(operand.memory_space == "host"
                                               for operand in call.operands),
                          dma_signals_regular_semaphore=call.dma_signals_regular_semaphore)
    if not call.for_tensor_core:
        report.skipped.append("not a TensorCore kernel (GPU compiler params or a SparseCore mesh)")
        return report
    options = RuleOptions(packed_sublanes=packed_sublanes, vmem_bound=vmem_bound,
                          max_grid_points=max_grid_points)
    for rule in rules:
        if rule.name in checks:
            report.violations.extend(rule.check(call, info, options, report))
            report.checked.extend(rule.reports)
    return report


def is_output_race(violation: Violation) -> bool:
    """A race on an output, whose verdict depends on whether the program uses that output."""
    return violation.rule == PARALLEL_RACE and violation.output_index is not None


def settle_output_races(report: KernelReport, used_outputs: Sequence[bool]) -> KernelReport:
    """Judge the races on outputs of ``report`` by what the program does with each output.

    Cores racing on an output block leave a value that depends on which
    writes last. That is a bug only if the program uses the output: a kernel
    may keep running state (splash attention's m, l and o) in extra outputs
    that its caller throws away, and those may race harmlessly. A race on a
    dropped output becomes a note in ``suite.report.skipped``; a race on a kept one
    stays, and its message says that the output is kept.
    """
    kept: list[Violation] = []
    for violation in report.violations:
        if not is_output_race(violation):
            kept.append(violation)
            continue
        index = violation.output_index
        used = index >= len(used_outputs) or used_outputs[index]
        if used:
            kept.append(dataclasses.replace(
                violation,
                problem=violation.problem + " The program uses this output after the call, so "
                "the value it reads depends on which core wrote the block last.",
            ))
        else:
            report.skipped.append(
                f"{PARALLEL_RACE}: {violation.operand} races, but the program never uses this "
                "output (its value is thrown away), so the race cannot change a result"
            )
    report.violations = kept
    return report
