"""The version 0.2 ops' facts in the terms of an ``Operation`` record.

The kernel modules (``reference_kernels/flash_attention.py`` and its siblings)
state each op's oracle, allowance and input structure in the op's own terms
(per-device blocks, keyword arguments, a NumPy Generator). The records in
``ops/builtins.py`` need them in the suite's terms: an oracle of the global
arrays, an allowance of a ``Case``, an inputs builder that leaves the values
to the drawn value profile, and a ``constrain`` that ties dimensions and
parameters together. This module is those adapters, one small function each;
importing it costs no JAX.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

_KERNELS = "pytest_pallas.reference_kernels"

# --- ties between dimensions and parameters (``Operation.constrain``) ------------------------

# flash_attention's sm_scale values: 1 and this marker, which becomes 1/sqrt(d) for the drawn d.
INVERSE_SQRT_D = "1/sqrt(d)"


def _largest_divisor_up_to(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (1 always qualifies)."""
    return max(divisor for divisor in range(1, max(1, min(limit, n)) + 1) if n % divisor == 0)


def flash_attention_constrain(dims: dict[str, Any], params: dict[str, Any]
                              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """g divides h (the drawn g becomes h's largest divisor not above it: g = h MHA, 1 < g < h
    GQA, g = 1 MQA); s = t under the causal mask (both the shorter one, so the masked
    square is a prefix of what was drawn); sm_scale 1/sqrt(d) for the drawn d."""
    dims, params = dict(dims), dict(params)
    dims["g"] = _largest_divisor_up_to(int(dims["h"]), int(dims["g"]))
    if params.get("causal"):
        dims["s"] = dims["t"] = min(int(dims["s"]), int(dims["t"]))
    if params.get("sm_scale") == INVERSE_SQRT_D:
        params["sm_scale"] = 1.0 / math.sqrt(int(dims["d"]))
    return dims, params


def grouped_heads_constrain(dims: dict[str, Any], params: dict[str, Any]
                            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """g divides h (paged attention's kv heads), as for flash attention."""
    dims = dict(dims)
    dims["g"] = _largest_divisor_up_to(int(dims["h"]), int(dims["g"]))
    return dims, dict(params)


# --- inputs: the structure from the kernel module's builder, the values from the profile -----


def _structure_only(module: str, builder: str, keep: tuple[int, ...]) -> Callable:
    def inputs(dims: dict[str, Any], dtype: str, rng: np.random.Generator) -> tuple[Any, ...]:
        from .operation import load

        built = load(f"{_KERNELS}.{module}:{builder}")(dims, dtype, rng)
        return tuple(arg if i in keep else None for i, arg in enumerate(built))

    inputs.__doc__ = (f"The structured arguments {keep} of ``{module}.{builder}``; the others "
                      "(None) are drawn by the value profile.")
    return inputs


# group_sizes (int32, summing to m: zeros, one group holding every row, ragged cuts).
grouped_matmul_inputs = _structure_only("grouped_matmul", "grouped_matmul_inputs", (2,))
# w int8 over its whole range and scales from 1e-4 to 1e2; x from the profile.
quantized_matmul_inputs = _structure_only("quantized_matmul", "quantized_matmul_inputs", (1, 2))
# lengths 1, a page boundary, one past it and the capacity; shuffled page tables.
paged_attention_inputs = _structure_only("paged_attention", "paged_attention_inputs", (3, 4))


# --- allowances ----------------------------------------------------------------------------------


def _logit_precision(case: Any, backend_precision: str) -> tuple[str, float]:
    """The precision logits are rounded in, and its epsilon relative to float32's.

    bfloat16 inputs multiply exactly into float32 sums; only float32 inputs on
    a backend whose dot rounds operands to bfloat16 (a TPU) lose more.
    """
    from ..dtypes import epsilon

    accumulator = ("bfloat16" if backend_precision == "bfloat16" and case.dtype == "float32"
                   else "float32")
    return accumulator, epsilon(accumulator) / epsilon("float32")


def flash_attention_allowance(case: Any, backend_precision: str) -> tuple[float, str]:
    """``flash_attention_error_allowance`` (float32 logits; derived in the kernel module),
    scaled to the precision the logits are rounded in."""
    from .operation import load

    allowance = load(f"{_KERNELS}.flash_attention:flash_attention_error_allowance")
    accumulator, factor = _logit_precision(case, backend_precision)
    q, k, v = (np.asarray(a, np.float64) for a in case.args)
    extra = factor * allowance(q, k, v, causal=case.kwargs["causal"],
                               sm_scale=case.kwargs["sm_scale"])
    return extra, f"logits rounded in {accumulator} add {extra:.3g}"


def paged_attention_allowance(case: Any, backend_precision: str) -> tuple[float, str]:
    """``paged_attention_error_allowance`` (float32 logits over each sequence's visible keys),
    scaled to the precision the logits are rounded in."""
    from .operation import load

    allowance = load(f"{_KERNELS}.paged_attention:paged_attention_error_allowance")
    accumulator, factor = _logit_precision(case, backend_precision)
    q, k_pages, v_pages, lengths, page_indices = case.args
    extra = factor * allowance(np.asarray(q, np.float64), np.asarray(k_pages, np.float64),
                               np.asarray(v_pages, np.float64), lengths, page_indices)
    return extra, f"logits rounded in {accumulator} add {extra:.3g}"


def reduce_scatter_allowance(case: Any, backend_precision: str) -> tuple[float, str]:
    """``reduce_scatter_error_allowance``: partial sums travelling in x's dtype round n - 1
    times (derived in the kernel module)."""
    del backend_precision
    from .operation import load

    allowance = load(f"{_KERNELS}.collectives:reduce_scatter_error_allowance")
    devices = int(case.dims["devices"])
    extra = allowance(np.split(np.asarray(case.args[0]), devices, axis=0))
    return extra, (f"{devices - 1} roundings of partial sums in {case.dtype} add {extra:.3g}"
                   if extra else "")


# --- collectives: shapes and oracles of the global arrays ---------------------------------------


def all_gather_shapes(dims: dict[str, Any]) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """x: n blocks (rows, cols); the result: every device's (n * rows, cols), n times."""
    n, rows, cols = int(dims["devices"]), int(dims["rows"]), int(dims["cols"])
    return [(n * rows, cols)], (n * n * rows, cols)


def all_gather_oracle(x: Any, *, devices: int) -> Any:
    """The global result: every device returns all blocks in mesh order."""
    from ..reference_kernels.collectives import all_gather_reference

    gathered = all_gather_reference(np.split(x, devices, axis=0))
    return np.concatenate([gathered] * devices, axis=0)


def reduce_scatter_shapes(dims: dict[str, Any]) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """x: each of n devices holds (n * rows, cols); the result: device i's rows block i."""
    n, rows, cols = int(dims["devices"]), int(dims["rows"]), int(dims["cols"])
    return [(n * n * rows, cols)], (n * rows, cols)


def reduce_scatter_oracle(x: Any, *, devices: int) -> Any:
    """The global result: rows block i of the sum of the devices' x, stacked over i."""
    from ..reference_kernels.collectives import reduce_scatter_reference

    scattered = reduce_scatter_reference(np.split(x, devices, axis=0))
    return scattered.reshape(-1, *scattered.shape[2:])
