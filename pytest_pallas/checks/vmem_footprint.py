"""The VMEM rule: what a pallas_call keeps in VMEM (blocks, double-buffered, padded to
tiles; scratch; scoped allocations at their peak) against the chip's scoped VMEM
limit, and the chip's facts it needs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jax.experimental.pallas import tpu as pltpu

from .. import tiling
from .violations import (
    MIB,
    KernelReport,
    RuleOptions,
    Violation,
    describe_operand,
    dtype_bits,
    mib_text,
    name_of_dtype,
    static_rule,
)

if TYPE_CHECKING:
    from pytest_pallas.checks.kernel_model import PallasCallInfo


VMEM = "vmem-footprint"


def tpu_info_for(chip: Any = "v5e") -> Any:
    """A ``pltpu.TpuInfo`` for a chip name (``"v5e"``, ``"v6e"``, ``"7x"``, ...) or a TpuInfo.

    Megacore chips (v4, v5p) are described in megacore mode, two TensorCores
    behind one device, as JAX sees them by default.

        >>> tpu_info_for("v5e").vmem_capacity_bytes // 2**20
        128
    """
    if isinstance(chip, pltpu.TpuInfo):
        return chip
    try:
        version = pltpu.ChipVersion(str(chip))
    except ValueError:
        known = ", ".join(v.value for v in pltpu.ChipVersion)
        raise ValueError(f"unknown TPU chip {chip!r}; JAX knows {known}") from None
    cores = 2 if version.supports_megacore else 1
    return pltpu.get_tpu_info_for_chip(version, cores)


def default_scoped_vmem_bytes(info: Any) -> int:
    """The scoped-VMEM limit a kernel compiles under when it does not set ``vmem_limit_bytes``.

    libtpu's ``--xla_tpu_scoped_vmem_limit_kib`` default: 16 MiB up to TPU v5,
    32 MiB from v6e, never more than the chip's VMEM. A value of that flag in
    ``LIBTPU_INIT_ARGS`` wins, as it does on the chip.
    """
    match = re.search(
        r"--xla_tpu_scoped_vmem_limit_kib=(\d+)", os.environ.get("LIBTPU_INIT_ARGS", "")
    )
    if match:
        limit = int(match.group(1)) * 1024
    else:
        limit = (16 if info.generation <= 5 else 32) * MIB
    return min(limit, info.vmem_capacity_bytes)


@dataclasses.dataclass(frozen=True)
class VmemItem:
    what: str
    buffers: int
    bytes_each: int

    @property
    def total(self) -> int:
        return self.buffers * self.bytes_each


def padded_vmem_bytes(shape: Sequence[int], dtype: Any, info: Any) -> int:
    """Bytes an array of ``shape`` takes in VMEM, its last two dimensions padded to (8, 128) tiles.

    A lower bound: Mosaic may pick larger tiles for narrow dtypes.
    """
    bits = dtype_bits(dtype) or 32
    shape = tuple(int(d) for d in shape)
    if not shape:
        elements = info.num_sublanes * info.num_lanes
    elif len(shape) == 1:
        elements = _round_up(shape[0], info.num_lanes)
    else:
        elements = (
            math.prod(shape[:-2])
            * _round_up(shape[-2], info.num_sublanes)
            * _round_up(shape[-1], info.num_lanes)
        )
    return elements * bits // 8


def _round_up(n: int, multiple: int) -> int:
    return tiling.round_up(max(n, 1), multiple)


def vmem_items(call: PallasCallInfo, info: Any) -> list[VmemItem]:
    """Everything ``call`` keeps in VMEM at once: buffered blocks, scratch, the run_scoped peak."""
    items = []
    # A grid of one step (or none) has no pipeline to overlap: Mosaic keeps one copy of
    # each block. Settled against the TPU compiler for v5e (16 MiB scoped VMEM): a
    # whole-array float32 matmul without a grid, or with grid=(1,), compiles at
    # 1152 x 1152 (15.2 MiB single-buffered, 30.4 double) and is rejected at 1280
    # (18.8 MiB single-buffered).
    single_step = _single_step(call)
    for operand in call.operands:
        if operand.memory_space == "vmem":
            items.append(
                VmemItem(
                    f"{describe_operand(operand)} block {operand.ref_shape} "
                    f"{name_of_dtype(operand.dtype)}",
                    operand.buffer_count or (1 if single_step or _one_window(operand, call)
                                             else 2),
                    padded_vmem_bytes(operand.ref_shape, operand.dtype, info),
                )
            )
    for s in call.scratch:
        if s.memory_space == "vmem":
            name = f"scratch {s.index}" + (
                f" (kernel parameter {s.parameter})" if s.parameter else ""
            )
            items.append(
                VmemItem(
                    f"{name} {s.shape} {name_of_dtype(s.dtype)}",
                    1,
                    padded_vmem_bytes(s.shape, s.dtype, info),
                )
            )
    peak, where = _scoped_peak(call.scoped, info)
    if peak:
        items.append(VmemItem(f"pl.run_scoped allocations (peak, {where})", 1, peak))
    return items


def _one_window(operand: Any, call: PallasCallInfo) -> bool:
    """Whether the operand's block is the same at every grid step, so that the chip keeps one
    copy of it: a whole-array block with an index map of zeros (JAX's Mosaic lowering forces
    ``pl.Buffered(1)`` on it, jax/_src/pallas/mosaic/lowering.py, 0.10.2 and 0.12), or an index
    map that reads no scalar-prefetch operand and only grid axes of size 1 (the TPU compiler
    keeps one window: JAX's ``test_automatic_single_buffering``, checked against libtpu
    0.0.42.1 for v5e: a 10 MiB block over grid (4, 1) indexed by the second axis compiles
    under the 16 MiB limit, indexed by both it does not)."""
    if operand.trivial_window:
        return True
    return not operand.index_map_reads_scalar_prefetch and all(
        call.grid[axis] == 1 for axis in operand.index_map_axes)


def _single_step(call: PallasCallInfo) -> bool:
    return all(g is not None for g in call.grid) and math.prod(int(g) for g in call.grid) == 1


def _buffering_text(call: PallasCallInfo) -> str:
    if _single_step(call):
        return "blocks single-buffered: a grid of one step has no pipeline"
    return "blocks double-buffered"


def _scoped_peak(region: Any, info: Any) -> tuple[int, str]:
    own = sum(
        padded_vmem_bytes(a.shape, a.dtype, info)
        for a in region.allocations
        if a.memory_space == "vmem"
    )
    where = region.allocations[0].where if region.allocations else ""
    best, best_where = 0, ""
    for child in region.children:
        peak, child_where = _scoped_peak(child, info)
        if peak > best:
            best, best_where = peak, child_where
    return own + best, where or best_where


@static_rule(VMEM, stage="allocation")
def check_vmem_footprint(call: PallasCallInfo, info: Any, options: RuleOptions,
                         report: KernelReport) -> list[Violation]:
    """The VMEM rule on one pallas_call; its footprint, its limit and where the limit comes
    from go to ``report``.

    ``vmem_bound="scoped"`` (the default) checks against the limit the kernel
    compiles under; ``"capacity"`` only against the chip's VMEM, for
    projects that raise ``--xla_tpu_scoped_vmem_limit_kib`` globally.
    """
    bound = options.vmem_bound
    if bound not in ("scoped", "capacity"):
        raise ValueError(f"bound must be 'scoped' or 'capacity', not {bound!r}")
    capacity = info.vmem_capacity_bytes
    chip = str(info.chip_version)
    items = vmem_items(call, info)
    total = sum(item.total for item in items)
    violations = []
    if call.vmem_limit_bytes is not None:
        limit, source = call.vmem_limit_bytes, "its CompilerParams(vmem_limit_bytes=...)"
        if limit > capacity:
            violations.append(
                Violation(
                    VMEM,
                    call.title,
                    None,
                    f"it asks for vmem_limit_bytes={limit} ({mib_text(limit)}) but a {chip} "
                    f"TensorCore has {mib_text(capacity)} of VMEM.",
                    f"set vmem_limit_bytes to at most {capacity} ({mib_text(capacity)}).",
                )
            )
            limit = capacity
    elif bound == "capacity":
        limit, source = capacity, f"the {chip}'s VMEM capacity"
    else:
        limit, source = default_scoped_vmem_bytes(info), f"the default scoped-VMEM limit on {chip}"
    if total > limit:
        biggest = sorted(items, key=lambda i: -i.total)[:4]
        breakdown = "; ".join(
            f"{item.what}: {item.buffers} x {mib_text(item.bytes_each)}"
            if item.buffers > 1
            else f"{item.what}: {mib_text(item.bytes_each)}"
            for item in biggest
        )
        if total <= capacity:
            suggestion = min(capacity, _round_up(int(total * 1.25), MIB))
            fix = (
                f"raise the limit with compiler_params=pltpu.CompilerParams(vmem_limit_bytes="
                f"{suggestion}) (the chip has {mib_text(capacity)}), or shrink the blocks, or "
                "single-buffer blocks whose index map is constant with "
                "pipeline_mode=pl.Buffered(1)."
            )
        else:
            fix = (
                f"shrink the blocks (the footprint is over the chip's whole "
                f"{mib_text(capacity)}), or single-buffer blocks whose index map is constant with "
                "pipeline_mode=pl.Buffered(1)."
            )
        violations.append(
            Violation(
                VMEM,
                call.title,
                None,
                f"it needs at least {mib_text(total)} of VMEM ({_buffering_text(call)}, tiles "
                f"padded to ({info.num_sublanes}, {info.num_lanes})) but compiles under {source}, "
                f"{mib_text(limit)}, so "
                f"Mosaic rejects it on the chip; largest: {breakdown}.",
                fix,
            )
        )
    report.vmem_bytes, report.vmem_limit_bytes, report.vmem_limit_source = total, limit, source
    return violations
