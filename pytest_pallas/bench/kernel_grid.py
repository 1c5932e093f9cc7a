"""Over a pallas_call's whole grid: how often each ``pl.when`` body runs, what the pipeline copies.

The TPU compiler's schedule says how long one grid step's bundles take; how
many steps take a ``pl.when`` branch, and how many bytes Pallas' pipeline moves
(it copies a block only when its index changes between consecutive steps), come
from the kernel's jaxpr and its index maps. Both read JAX internals (jaxpr
equations, the grid mapping), so they live here, beside ``_compat.jax_internals``, and
answer None rather than fail when the internals are not what they expect.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import numpy as np

from .._compat import jax_internals
from ..checks import kernel_model

#: Grid points evaluated at most; a larger grid is sampled at evenly spaced steps.
MAX_POINTS = 1 << 18

_BINARY = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge, "and": np.logical_and, "or": np.logical_or,
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "max": np.maximum,
    "min": np.minimum, "rem": np.fmod, "div": lambda a, b: np.trunc(a / b),
}


def grid_points(grid: tuple[int, ...]) -> np.ndarray:
    """Grid steps in the order the TPU runs them (last axis fastest), sampled past MAX_POINTS."""
    total = int(np.prod(grid)) if grid else 1
    flat = np.arange(total) if total <= MAX_POINTS else np.linspace(
        0, total - 1, MAX_POINTS).astype(np.int64)
    return np.stack(np.unravel_index(flat, grid), axis=1) if grid else np.zeros((1, 0), int)


def when_frequencies(params: dict[str, Any], grid: tuple[int, ...]) -> list[float | None]:
    """For each top-level ``cond`` of the kernel body, in order: the share of steps taking
    its last (``pl.when``'s true) branch; None where the predicate depends on data."""
    try:
        jaxpr = params["jaxpr"]
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
        equations = list(jaxpr.eqns)
    except (KeyError, AttributeError):
        return []
    return _when_shares(equations, grid_points(grid), grid, {})


def pipeline_when_frequencies(body_over_indices: Any,
                              grid: tuple[int, ...]) -> list[float | None] | None:
    """As :func:`when_frequencies`, for an ``emit_pipeline`` body traced with its grid
    indices as inputs (``_compat.pallas_call_hooks.PipelineSeen.body_over_indices``)."""
    jaxpr = getattr(body_over_indices, "jaxpr", body_over_indices)
    if jaxpr is None or not hasattr(jaxpr, "eqns"):
        return None
    points = grid_points(grid)
    seeds = {var: points[:, axis] for axis, var in enumerate(jaxpr.invars)}
    return _when_shares(list(jaxpr.eqns), points, grid, seeds)


def _when_shares(equations: list[Any], points: np.ndarray, grid: tuple[int, ...],
                 seeds: dict[Any, np.ndarray]) -> list[float | None]:
    values: dict[Any, np.ndarray] = dict(seeds)

    def read(atom: Any) -> np.ndarray | None:
        if type(atom).__name__ == "Literal":
            return np.asarray(atom.val)
        return values.get(atom)

    frequencies: list[float | None] = []
    for eqn in equations:
        name = eqn.primitive.name
        args = [read(v) for v in eqn.invars]
        if name == "cond":
            index = args[0] if args else None
            last = len(eqn.params.get("branches", ())) - 1
            frequencies.append(None if index is None else float(np.mean(
                np.broadcast_to(index, (len(points),)) == last)))
            continue
        result = None
        try:
            if name == "program_id":
                result = points[:, eqn.params["axis"]]
            elif name == "num_programs":
                result = np.asarray(grid[eqn.params["axis"]])
            elif name in _BINARY and len(args) == 2 and all(a is not None for a in args):
                result = _BINARY[name](args[0], args[1])
            elif name == "not" and args and args[0] is not None:
                result = np.logical_not(args[0]) if args[0].dtype == bool else ~args[0]
            elif name == "convert_element_type" and args and args[0] is not None:
                result = np.asarray(args[0]).astype(np.int64)
            elif name == "select_n" and args and all(a is not None for a in args):
                result = np.choose(np.asarray(args[0]).astype(int), args[1:])
        except Exception:  # noqa: BLE001  # a value it cannot follow stays unknown
            result = None
        if result is not None and len(eqn.outvars) == 1:
            values[eqn.outvars[0]] = np.asarray(result)
    return frequencies


@dataclasses.dataclass
class Copies:
    """The HBM traffic of a pallas_call's pipeline over its whole grid."""

    total: int | None  # bytes copied in and out; None when an index map cannot be followed
    first_in: int = 0  # the first step's input blocks (filling the pipeline)
    last_out: int = 0  # the last step's output blocks (draining it)
    serial: int = 0  # bytes of single-buffered blocks (pl.Buffered(1)): not overlapped
    notes: list[str] = dataclasses.field(default_factory=list)


def copied_bytes(params: dict[str, Any]) -> Copies:
    """What Pallas' pipeline copies between HBM and VMEM over the kernel's grid."""
    try:
        info = kernel_model.describe_pallas_call(params)
    except jax_internals.JaxInternalsChanged as error:
        return Copies(None, notes=[str(error)])
    grid = tuple(g or 1 for g in info.grid)
    points = grid_points(grid)
    copies = Copies(0)
    for operand in info.operands:
        if operand.memory_space != "vmem":
            if operand.memory_space in ("any", "hbm"):
                copies.notes.append(
                    f"{operand.origin} stays in HBM: its manual copies are not counted")
            continue
        block = int(np.prod(operand.block_shape)) * np.dtype(operand.dtype).itemsize
        scale = (int(np.prod(grid)) / len(points)) if len(points) > 1 else 1.0
        if operand.index_map_reads_scalar_prefetch:
            # The block index depends on data the estimate does not have.
            copies.notes.append(f"{operand.origin}: its index map reads scalar prefetch, so "
                                "a copy every step is counted (an upper bound)")
            changes = len(points) - 1
        else:
            try:
                indices = operand.block_indices(points)
            except Exception as error:  # noqa: BLE001  # an index map it cannot evaluate
                copies.notes.append(
                    f"{operand.origin}: index map not followed ({type(error).__name__})")
                return Copies(None, notes=copies.notes)
            changes = int(np.any(indices[1:] != indices[:-1], axis=1).sum())
        moved = int(round(block * (1 + changes * scale)))
        copies.total += moved  # type: ignore[operator]
        if operand.buffer_count == 1 and changes:
            # One buffer: the next block cannot arrive while this one is in use.
            copies.serial += moved
        if operand.role == "input":
            copies.first_in += block
        else:
            copies.last_out += block
    return copies


@dataclasses.dataclass(frozen=True)
class PipelineLoop:
    """What an ``emit_pipeline``'s loop does over its grid (None where it cannot be followed)."""

    steps: int | None
    copied: int | None  # bytes its loop copies (the first input blocks come before it)
    when_shares: tuple[float | None, ...] | None  # per pl.when of its body, the share run
    notes: tuple[str, ...] = ()


def pipeline_loop(seen: Any) -> PipelineLoop:
    """The :class:`PipelineLoop` of an ``emit_pipeline`` seen while its kernel was traced."""
    steps, copied, notes = pipeline_copies(seen)
    shares = None
    if steps is not None:
        grid = tuple(int(g) for g in seen.grid)
        found = pipeline_when_frequencies(seen.body_over_indices, grid)
        shares = None if found is None else tuple(found)
    return PipelineLoop(steps, copied, shares, tuple(notes))


def pipeline_copies(seen: Any) -> tuple[int | None, int | None, list[str]]:
    """An ``emit_pipeline``'s steps and the bytes its loop copies, from its BlockSpecs.

    As Pallas' grid pipeline, it copies a block when its index changes between
    consecutive steps; the first input blocks are copied before the loop, and
    every output block's last write-back happens inside it. Returns ``(steps,
    bytes, notes)``, None where the grid or an index map cannot be followed.
    """
    if not all(isinstance(g, (int, np.integer)) for g in seen.grid):
        return None, None, ["an emit_pipeline whose grid is read from data"]
    grid = tuple(int(g) for g in seen.grid)
    steps = int(np.prod(grid)) if grid else 1
    points = grid_points(grid)
    scale = (steps / len(points)) if len(points) > 1 else 1.0
    total = 0.0
    operands = [(spec, shape, True) for spec, shape in zip(seen.in_specs, seen.in_shapes)]
    operands += [(spec, shape, False) for spec, shape in zip(seen.out_specs, seen.out_shapes)]
    for spec, (shape, dtype), is_input in operands:
        block_shape = getattr(spec, "block_shape", None)
        index_map = getattr(spec, "index_map", None)
        if block_shape is None or index_map is None:
            return steps, None, ["an emit_pipeline operand without a block shape or index map"]
        elements = 1
        for dim in block_shape:
            size = dim if isinstance(dim, (int, np.integer)) else getattr(dim, "block_size", 1)
            elements *= int(size) if isinstance(size, (int, np.integer)) else 1
        block = elements * np.dtype(dtype).itemsize
        try:
            indices = np.stack([np.broadcast_to(np.asarray(i), (len(points),)) for i in
                                index_map(*(points[:, a] for a in range(len(grid))))], axis=1)
        except Exception as error:  # noqa: BLE001  # an index map it cannot evaluate
            return steps, None, [f"an emit_pipeline index map not followed "
                                 f"({type(error).__name__})"]
        changes = int(np.any(indices[1:] != indices[:-1], axis=1).sum()) * scale
        total += block * (changes if is_input else changes + 1)
    return steps, int(round(total)), []
