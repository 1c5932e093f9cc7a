"""What a GPU enforces and JAX's interpreters do not see, checked where it is cheap.

Shared memory per thread block: a Mosaic GPU kernel's ``plgpu.SMEM`` scratch
(``plgpu.kernel``'s ``scratch_types``, ``pl.run_scoped`` inside the body) must fit the
232448 bytes an H100 or H200 thread block may use (``pytest_pallas.gpu``). The count here
is the peak of the scopes live at once, without the alignment padding and the barriers'
and reductions' reserve that Mosaic GPU adds: a kernel it flags is refused on the GPU
(Mosaic GPU: ``smem_bytes=... > max_smem_bytes=232448``); one it passes may still be, by a
few hundred bytes. Blocks that ``pallas_call`` pipelines through SMEM are not counted.
"""

from __future__ import annotations

import math
from typing import Any

from ..gpu import HOPPER_SMEM_BYTES_PER_BLOCK

# An mbarrier is one 64-bit word of SMEM.
_BARRIER_BYTES = 8


class GpuLimitExceeded(AssertionError):
    """A Mosaic GPU kernel that a GPU refuses, though JAX's interpreters run it."""


def _smem_bytes_of(aval: Any) -> int:
    if "smem" not in str(getattr(aval, "memory_space", "")).lower():
        return 0
    inner = getattr(aval, "inner_aval", aval)
    shape = tuple(getattr(inner, "shape", ()))
    dtype = getattr(inner, "dtype", None)
    try:
        itemsize = int(dtype.itemsize)
    except (AttributeError, TypeError):
        itemsize = _BARRIER_BYTES  # plgpu.Barrier's dtype is not a NumPy one
    return math.prod(shape) * itemsize


def sub_jaxprs(params: dict[str, Any]) -> list[Any]:
    found = []
    for value in params.values():
        for each in value if isinstance(value, (tuple, list)) else (value,):
            jaxpr = getattr(each, "jaxpr", each)
            if hasattr(jaxpr, "eqns"):
                found.append(jaxpr)
    return found


def peak_smem_bytes(jaxpr: Any) -> int:
    """The most SMEM the ``run_scoped`` allocations of ``jaxpr`` hold at once (scopes nest;
    sibling scopes reuse the same bytes)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    peak = 0
    for eqn in getattr(jaxpr, "eqns", ()):
        inner = [peak_smem_bytes(sub) for sub in sub_jaxprs(eqn.params)]
        here = max(inner, default=0)
        if eqn.primitive.name == "run_scoped":
            body = getattr(eqn.params.get("jaxpr"), "jaxpr", eqn.params.get("jaxpr"))
            here += sum(_smem_bytes_of(var.aval) for var in getattr(body, "invars", ()))
        peak = max(peak, here)
    return peak


def check_smem(name: str, jaxprs: Any, *, limit: int = HOPPER_SMEM_BYTES_PER_BLOCK) -> None:
    """Raise :class:`GpuLimitExceeded` when the kernel ``name``'s SMEM scratch exceeds
    ``limit`` bytes per thread block."""
    used = max((peak_smem_bytes(jaxpr) for jaxpr in jaxprs), default=0)
    if used > limit:
        raise GpuLimitExceeded(
            f"pallas: Mosaic GPU kernel {name!r} allocates {used} bytes of SMEM per thread "
            f"block > {limit} on H100/H200 (the GPU refuses it; JAX's interpreter does not "
            "check): use smaller tiles or fewer pipeline stages.")
