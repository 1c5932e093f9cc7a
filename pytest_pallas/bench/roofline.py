"""The roofline of a benchmark: the chip's peaks, the least time the cost model
allows, and the performance facts ``extra_info`` records beside the time.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Roofline:
    """Peak rates of what a benchmark runs on: FLOP/s and HBM bytes/s."""

    peak_flops_per_second: float
    peak_bytes_per_second: float

    def bound_seconds(self, flops: float, bytes_accessed: float) -> float:
        """The least time the work can take: compute-bound or memory-bound, whichever is slower."""
        return max(flops / self.peak_flops_per_second, bytes_accessed / self.peak_bytes_per_second)


def roofline_of(tpu_info: Any, devices: int = 1) -> Roofline:
    """The roofline of ``devices`` logical devices of the chip ``tpu_info`` describes.

    ``pltpu.TpuInfo`` gives rates per TensorCore; a logical device has
    ``num_cores`` of them (2 on a megacore v4 or v5p). FLOP/s are bfloat16 MXU
    rates: the bound for float32 too, at the TPU's default matmul precision.
    """
    cores = max(1, int(getattr(tpu_info, "num_cores", 1))) * max(1, int(devices))
    return Roofline(
        peak_flops_per_second=float(tpu_info.bf16_ops_per_second) * cores,
        peak_bytes_per_second=float(tpu_info.mem_bw_bytes_per_second) * cores,
    )


def gpu_roofline(facts: Any, devices: int = 1) -> Roofline:
    """The roofline of ``devices`` GPUs described by ``facts`` (a ``pytest_pallas.gpu.GpuFacts``):
    dense bfloat16 tensor-core FLOP/s, an upper bound for float32 too (TF32 runs at half
    that), and HBM bytes/s."""
    count = max(1, int(devices))
    return Roofline(peak_flops_per_second=float(facts.peak_flops_per_second) * count,
                    peak_bytes_per_second=float(facts.hbm_bytes_per_second) * count)


def performance_facts(cost: Any, median_seconds: float, roofline: Roofline | None,
                      xla_median_seconds: float | None,
                      paired_ratio: float | None = None) -> dict[str, Any]:
    """The numbers a benchmark's ``extra_info`` derives from its cost, its time and XLA's.

    ``cost`` is a ``pl.CostEstimate`` (or anything with ``flops`` and
    ``bytes_accessed``), or None when the op has no cost model. ``paired_ratio``
    is the median over rounds of kernel time / XLA time of the same round; it
    becomes ``kernel_over_xla`` (else the ratio of the medians does).

    >>> import types
    >>> facts = performance_facts(types.SimpleNamespace(flops=2e9, bytes_accessed=1e9,
    ...                           transcendentals=0), 0.01, Roofline(1e12, 1e11), 0.02)
    >>> facts["arithmetic_intensity"], facts["fraction_of_roofline"], facts["speedup_vs_xla"]
    (2.0, 1.0, 2.0)
    """
    facts: dict[str, Any] = {}
    if cost is not None:
        flops = int(cost.flops)
        bytes_accessed = int(cost.bytes_accessed)
        facts.update({
            "flops": flops,
            "transcendentals": int(getattr(cost, "transcendentals", 0) or 0),
            "bytes_accessed": bytes_accessed,
            "arithmetic_intensity": flops / bytes_accessed if bytes_accessed else None,
            "achieved_flops_per_second": flops / median_seconds if median_seconds > 0 else None,
            "achieved_bytes_per_second": (bytes_accessed / median_seconds if median_seconds > 0
                                          else None),
        })
        remote = getattr(cost, "remote_bytes_transferred", 0) or 0
        if remote:
            facts["remote_bytes_transferred"] = int(remote)
        if roofline is not None:
            bound = roofline.bound_seconds(flops, bytes_accessed)
            compute_bound = flops / roofline.peak_flops_per_second >= (
                bytes_accessed / roofline.peak_bytes_per_second)
            facts.update({
                "peak_flops_per_second": roofline.peak_flops_per_second,
                "peak_bytes_per_second": roofline.peak_bytes_per_second,
                "roofline_seconds": bound,
                "roofline_bound": "compute" if compute_bound else "memory",
                "fraction_of_roofline": bound / median_seconds if median_seconds > 0 else None,
            })
    if xla_median_seconds is not None:
        facts.update({
            "xla_median": xla_median_seconds,
            "kernel_over_xla": (paired_ratio if paired_ratio is not None
                                else median_seconds / xla_median_seconds),
            "speedup_vs_xla": (xla_median_seconds / median_seconds if median_seconds > 0
                               else None),
        })
    return facts
