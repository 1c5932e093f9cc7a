"""The facts of the GPUs the plugin knows: peak rates for the roofline, shared memory per
thread block, L2 size for the cache flush between benchmark rounds. One row per GPU,
each number with where it comes from.

    >>> gpu_facts("NVIDIA H200").hbm_bytes_per_second
    4800000000000.0
"""

from __future__ import annotations

import dataclasses

# NVIDIA's limit for compute capability 9.0 (H100, H200): 227 KiB of shared memory per
# thread block (opt-in), CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability"; Mosaic GPU reports it as max_smem_bytes=232448.
HOPPER_SMEM_BYTES_PER_BLOCK = 232448

# Triton's do_bench overwrites a 256 MB buffer before every timed call so that no call finds
# its operands in L2 (triton.testing.do_bench, cache_size = 256 * 1024 * 1024); five times
# the 50 MB L2 of an H100 or H200.
CACHE_FLUSH_BYTES = 256 * 2**20

_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (SXM: BF16 1979 TFLOP/s with " \
                  "sparsity, 989.5 dense; HBM3 3.35 TB/s)"
_H100_PCIE_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (PCIe: BF16 1513 TFLOP/s with " \
                       "sparsity, 756.5 dense; HBM2e 2.0 TB/s)"
_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (SXM: BF16 1979 TFLOP/s with " \
                  "sparsity, 989.5 dense; HBM3e 4.8 TB/s)"
_HOPPER_WHITEPAPER = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (50 MB L2)"
_SMEM_SOURCE = "CUDA C++ Programming Guide, compute capability 9.0: 227 KiB per thread block"


@dataclasses.dataclass(frozen=True)
class GpuFacts:
    """What the plugin needs of a GPU, with ``sources`` naming where each number is from."""

    name: str
    peak_flops_per_second: float  # dense bfloat16 on the tensor cores
    hbm_bytes_per_second: float
    smem_bytes_per_block: int
    l2_bytes: int
    sources: dict[str, str]


def _hopper(name: str, flops: float, hbm: float, datasheet: str) -> GpuFacts:
    return GpuFacts(
        name=name, peak_flops_per_second=flops, hbm_bytes_per_second=hbm,
        smem_bytes_per_block=HOPPER_SMEM_BYTES_PER_BLOCK, l2_bytes=50 * 10**6,
        sources={"peak_flops_per_second": datasheet, "hbm_bytes_per_second": datasheet,
                 "smem_bytes_per_block": _SMEM_SOURCE, "l2_bytes": _HOPPER_WHITEPAPER})


# Matched against jax.devices()[0].device_kind ("NVIDIA H100 80GB HBM3", "NVIDIA H200", ...),
# most specific first.
_GPUS = (
    ("H100 PCIe", _hopper("H100 PCIe", 756.5e12, 2.0e12, _H100_PCIE_DATASHEET)),
    ("H200", _hopper("H200 SXM", 989.5e12, 4.8e12, _H200_DATASHEET)),
    ("H100", _hopper("H100 SXM", 989.5e12, 3.35e12, _H100_DATASHEET)),
)


def gpu_facts(device_kind: str) -> GpuFacts | None:
    """The facts of the GPU JAX names ``device_kind``, or None for a GPU not in the table."""
    for needle, facts in _GPUS:
        if needle.lower() in device_kind.lower():
            return facts
    return None
