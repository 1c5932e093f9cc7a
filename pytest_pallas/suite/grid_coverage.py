"""Which grid axes of each kernel the suite's examples exercised.

A kernel that drops its last k step, or leaves a ragged last row block
unwritten, is right on every input whose grid has one step along that axis,
or whose last block along it is whole. A pass says nothing about such an axis
unless some example ran it with more than one step and with a ragged last
block. The suite traces every ``pallas_call`` it runs, so it reads each
kernel's grid and block specs and records, per (kernel, grid axis):

* ``multi_step``: some example ran the axis with more than one step;
* ``ragged_last``: some example's last block along it ran past the end of
  the array dimension the axis walks (None when the axis walks no blocked
  array dimension: an axis the kernel reads only through ``pl.program_id``).

The axis is matched to the array dimension it walks by evaluating the block
specs' index maps one step along it; the dimension is named after the op's
signature (``k``) when the operand is an argument of the op as drawn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class AxisRun:
    """One grid axis of one traced ``pallas_call``, as one example ran it."""

    kernel: str
    axis: int  # position in the kernel's own grid (axes added by jax.vmap not counted)
    walks: str | None  # the array dimension it walks: "k", or "x_ref dim 1"; None if none
    steps: int
    ragged_last: bool | None  # None: it walks no blocked array dimension


def axis_runs(info: Any, argument_names: Sequence[tuple[str, ...]] = (),
              result_names: tuple[str, ...] = (),
              argument_shapes: Sequence[tuple[int, ...]] = ()) -> list[AxisRun]:
    """The grid axes of a described ``pallas_call`` (``checks.kernel_model.PallasCallInfo``).

    ``argument_names``/``argument_shapes`` (the op's core dimensions per argument and the
    shapes drawn) and ``result_names`` name the dimension an axis walks when the
    operand is an argument or the result of the op unchanged.
    """
    grid = tuple(info.grid)
    own_axes = [a for a in range(len(grid)) if a not in set(info.vmapped_axes)]
    static = [a for a in own_axes if grid[a] is not None]
    if not static:
        return []
    n = len(grid)
    # Row 0: the first step; row 1 + i: one step along static[i]; row 1 + len + i: its last.
    points = np.zeros((1 + 2 * len(static), n), dtype=np.int64)
    for i, a in enumerate(static):
        points[1 + i, a] = 1
        points[1 + len(static) + i, a] = max(0, int(grid[a]) - 1)
    walked: dict[int, list[tuple[str, bool]]] = {a: [] for a in static}
    for operand in info.operands:
        kinds = [kind for kind, _ in operand.block_dims]
        if not any(kind in ("blocked", "squeezed") for kind in kinds):
            continue
        if len(kinds) != len(operand.array_shape) or operand.index_map_reads_scalar_prefetch:
            continue  # an index map that reads scalar prefetch depends on values, not the grid
        try:
            indices = operand.block_indices(points)
        except Exception:  # an index map this evaluation cannot run: the axis stays unnamed
            continue
        if indices.shape != (len(points), len(kinds)):
            continue
        names = _dimension_names(operand, argument_names, result_names, argument_shapes)
        for i, a in enumerate(static):
            for d, (kind, block) in enumerate(operand.block_dims):
                if kind not in ("blocked", "squeezed") or indices[1 + i, d] == indices[0, d]:
                    continue
                last = int(indices[1 + len(static) + i, d])
                # A block of one element is never ragged: not applicable rather than missed.
                ragged = (last + 1) * block > operand.array_shape[d] if block > 1 else None
                label = names[d] if names else f"{operand.parameter or operand.origin} dim {d}"
                walked[a].append((label, ragged))
    runs = []
    for a in static:
        found = walked[a]
        runs.append(AxisRun(
            kernel=info.name, axis=own_axes.index(a),
            walks=found[0][0] if found else None, steps=int(grid[a]),
            ragged_last=_any_ragged(ragged for _, ragged in found)))
    return runs


def _any_ragged(flags: Iterable[bool | None]) -> bool | None:
    """True if any operand's last block was ragged, None if no operand could be."""
    known = [flag for flag in flags if flag is not None]
    return any(known) if known else None


def _dimension_names(operand: Any, argument_names: Sequence[tuple[str, ...]],
                     result_names: tuple[str, ...],
                     argument_shapes: Sequence[tuple[int, ...]]) -> tuple[str, ...] | None:
    shape = tuple(operand.array_shape)
    if operand.role == "input" and operand.index < len(argument_names):
        names = argument_names[operand.index]
        given = argument_shapes[operand.index] if operand.index < len(argument_shapes) else None
        if len(names) == len(shape) and given is not None and tuple(given) == shape:
            return tuple(names)
    if operand.role == "output" and operand.index == 0 and len(result_names) == len(shape):
        # The result's shape is the op's when the output block is the result itself; only
        # named when no argument tells otherwise (same rank and sizes as drawn).
        sizes = dict(zip((n for names in argument_names for n in names),
                         (s for given in argument_shapes for s in given)))
        if all(sizes.get(name) == size for name, size in zip(result_names, shape)):
            return tuple(result_names)
    return None


def example_score(runs: Iterable[AxisRun]) -> int:
    """How much of its kernels' grids one example exercised: multi-step and ragged axes."""
    return sum((run.steps > 1) + bool(run.ragged_last) for run in runs)


class GridCoverage:
    """Per (kernel, grid axis): whether any example ran it with several steps, a ragged end."""

    def __init__(self) -> None:
        self.axes: dict[tuple[str, int], dict[str, Any]] = {}

    def add(self, runs: Iterable[AxisRun]) -> None:
        for run in runs:
            self._merge(run.kernel, run.axis, {
                "walks": run.walks, "most_steps": run.steps,
                "ragged_last": run.ragged_last, "examples": 1})

    def _merge(self, kernel: str, axis: int, entry: dict[str, Any]) -> None:
        mine = self.axes.get((kernel, axis))
        if mine is None:
            self.axes[(kernel, axis)] = dict(entry)
            return
        mine["walks"] = mine["walks"] or entry["walks"]
        mine["most_steps"] = max(mine["most_steps"], entry["most_steps"])
        if entry["ragged_last"] is not None:
            mine["ragged_last"] = bool(mine["ragged_last"]) or entry["ragged_last"]
        mine["examples"] += entry["examples"]

    def to_list(self) -> list[dict[str, Any]]:
        """Plain values, one dict per axis (the report's ``grid_coverage``, and what
        pytest-xdist workers send)."""
        return [{"kernel": kernel, "axis": axis, **entry,
                 "multi_step": entry["most_steps"] > 1}
                for (kernel, axis), entry in sorted(self.axes.items())]

    def merge(self, entries: Iterable[dict[str, Any]]) -> None:
        for entry in entries:
            self._merge(entry["kernel"], entry["axis"],
                        {key: value for key, value in entry.items()
                         if key not in ("kernel", "axis", "multi_step")})

    def unexercised(self, op_name: str) -> list[str]:
        """One line per kernel with axes no example ran with more than one step.

        An axis never run with a ragged last block is in the report (``ragged_last``
        false) but not here: a kernel that pads or picks dividing blocks never has one.
        """
        per_kernel: dict[str, list[str]] = {}
        for (kernel, axis), entry in sorted(self.axes.items()):
            if entry["most_steps"] <= 1:
                per_kernel.setdefault(kernel, []).append(
                    f"{axis}" + (f" ({entry['walks']})" if entry["walks"] else ""))
        return [f"{op_name}: kernel {kernel} grid {'axis' if len(axes) == 1 else 'axes'} "
                f"{', '.join(axes)} never ran more than one step"
                for kernel, axes in per_kernel.items()]
