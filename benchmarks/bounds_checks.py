"""What a TPU checks of a Pallas kernel's out-of-bounds accesses, read from libtpu's code.

One small kernel per access kind (a scalar load or store at an index from scalar prefetch,
a vector load or store at a dynamic row, a DMA at a dynamic offset), compiled for each chip
by libtpu on this CPU with ``pltpu.CompilerParams(disable_bounds_checks=False)`` (Mosaic's
default) and ``True``; ``pytest_pallas.estimate`` compiles them with
``PYTEST_PALLAS_KEEP_DUMP=DIR``, which keeps libtpu's dumps, and
``_compat.libtpu_dump.memory_accesses`` reads the kernel's ``*-post-bounds-check.txt``
(the LLO after libtpu's bounds-check pass): each load, store and DMA, and whether a
``shalt.err /* BoundsCheck ... */`` halts the kernel before it. Prints per access kind and
chip ``halts`` (a check is emitted: the chip stops the kernel) or ``no check`` (the chip
reads or writes whatever memory lies there), and what ``disable_bounds_checks=True``
leaves. ``pytest_pallas._compat.out_of_bounds.CHIP_BOUNDS_CHECKS`` is the table the
plugin acts on; ``tests/test_out_of_bounds.py`` reads the dumps again and compares.

    python benchmarks/bounds_checks.py [--chips v5e,v6e,7x]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import tempfile
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROWS, LANES = 32, 128  # the buffer a kernel indexes into: (32, 128) float32, or 16 int32
# An operand in HBM: (65536, 128) float32, 32 MiB. XLA may place a small operand in VMEM before
# the kernel starts, pltpu.HBM or pl.ANY alike (TPU 7x does, for (32, 128)): a copy out of it
# is then a vector copy within VMEM.
LARGE_ROWS = 2**16


@dataclasses.dataclass(frozen=True)
class AccessKind:
    """One kind of access, the kernel that makes it alone at a dynamic index, and the
    instruction libtpu compiles it to (``instruction``, with ``space`` for a load or store)."""

    name: str  # the row's name, the key of CHIP_BOUNDS_CHECKS
    instruction: str
    space: str
    build: Callable[[Any], tuple[Callable[..., Any], tuple[Any, ...]]]
    # What it compiles to where XLA placed the operand in VMEM: a copy within VMEM.
    instead: tuple[str, str] | None = None


def _smem_spec() -> Any:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    return pl.BlockSpec(memory_space=pltpu.SMEM)


def _call(kernel: Callable[..., Any], params: Any, *, in_spec: Any, out_spec: Any,
          out_shape: tuple[int, ...], operand: tuple[int, ...], dtype: Any,
          scratch: tuple[Any, ...] = ()) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A one-step kernel with one scalar-prefetched index and one operand."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,), in_specs=[in_spec],
                                        out_specs=out_spec, scratch_shapes=list(scratch))
    call = pl.pallas_call(kernel, grid_spec=spec, compiler_params=params,
                          out_shape=jax.ShapeDtypeStruct(out_shape, dtype))
    return call, (jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct(operand, dtype))


def _block(shape: tuple[int, ...]) -> Any:
    from jax.experimental import pallas as pl

    return pl.BlockSpec(shape, lambda i, s: (0,) * len(shape))


def smem_load(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp

    def kernel(index_ref, x_ref, o_ref):
        o_ref[0] = x_ref[index_ref[0]]
    return _call(kernel, params, in_spec=_smem_spec(), out_spec=_smem_spec(), out_shape=(1,),
                 operand=(16,), dtype=jnp.int32)


def smem_store(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp

    def kernel(index_ref, x_ref, o_ref):
        o_ref[0] = 0
        o_ref[index_ref[0]] = x_ref[0]
    return _call(kernel, params, in_spec=_smem_spec(), out_spec=_smem_spec(), out_shape=(16,),
                 operand=(16,), dtype=jnp.int32)


def vmem_load(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(index_ref, x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(index_ref[0], 8), :]
    return _call(kernel, params, in_spec=_block((ROWS, LANES)), out_spec=_block((8, LANES)),
                 out_shape=(8, LANES), operand=(ROWS, LANES), dtype=jnp.float32)


def vmem_store(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(index_ref, x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)
        o_ref[pl.ds(index_ref[0], 8), :] = x_ref[...]
    return _call(kernel, params, in_spec=_block((8, LANES)), out_spec=_block((ROWS, LANES)),
                 out_shape=(ROWS, LANES), operand=(8, LANES), dtype=jnp.float32)


def _copy_and_wait(source: Any, destination: Any, semaphore: Any) -> None:
    from jax.experimental.pallas import tpu as pltpu

    copy = pltpu.make_async_copy(source, destination, semaphore)
    copy.start()
    copy.wait()


def _hbm() -> Any:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    return pl.BlockSpec(memory_space=pltpu.HBM)


def dma_from_hbm(params: Any, space: Any = None, rows: int = LARGE_ROWS,
                 ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(index_ref, x_hbm, o_ref, buffer, semaphore):
        _copy_and_wait(x_hbm.at[pl.ds(index_ref[0], 8)], buffer, semaphore)
        o_ref[...] = buffer[...]
    return _call(kernel, params, in_spec=space or _hbm(),
                 out_spec=_block((8, LANES)), out_shape=(8, LANES), operand=(rows, LANES),
                 dtype=jnp.float32,
                 scratch=(pltpu.VMEM((8, LANES), jnp.float32), pltpu.SemaphoreType.DMA(())))


def dma_into_vmem(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(index_ref, x_hbm, o_ref, buffer, semaphore):
        _copy_and_wait(x_hbm.at[pl.ds(0, 8)], buffer.at[pl.ds(index_ref[0], 8)], semaphore)
        o_ref[...] = buffer[pl.ds(0, 8), :]
    return _call(kernel, params, in_spec=_hbm(),
                 out_spec=_block((8, LANES)), out_shape=(8, LANES), operand=(LARGE_ROWS, LANES),
                 dtype=jnp.float32,
                 scratch=(pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA(())))


def dma_to_hbm(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(index_ref, x_ref, o_hbm, semaphore):
        _copy_and_wait(x_ref, o_hbm.at[pl.ds(index_ref[0], 8)], semaphore)
    return _call(kernel, params, in_spec=_block((8, LANES)),
                 out_spec=_hbm(), out_shape=(LARGE_ROWS, LANES),
                 operand=(8, LANES), dtype=jnp.float32, scratch=(pltpu.SemaphoreType.DMA(()),))


def dma_from_vmem(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(index_ref, x_ref, o_hbm, buffer, semaphore):
        buffer[...] = jnp.zeros_like(buffer)
        _copy_and_wait(buffer.at[pl.ds(index_ref[0], 8)], o_hbm, semaphore)
    return _call(kernel, params, in_spec=_block((8, LANES)),
                 out_spec=_hbm(), out_shape=(8, LANES),
                 operand=(8, LANES), dtype=jnp.float32,
                 scratch=(pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA(())))


def dma_vmem_to_vmem(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(index_ref, x_ref, o_ref, buffer, semaphore):
        _copy_and_wait(x_ref.at[pl.ds(index_ref[0], 8)], buffer, semaphore)
        o_ref[...] = buffer[...]
    return _call(kernel, params, in_spec=_block((ROWS, LANES)), out_spec=_block((8, LANES)),
                 out_shape=(8, LANES), operand=(ROWS, LANES), dtype=jnp.float32,
                 scratch=(pltpu.VMEM((8, LANES), jnp.float32), pltpu.SemaphoreType.DMA(())))


def dma_into_smem(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(index_ref, x_hbm, o_ref, buffer, semaphore):
        _copy_and_wait(x_hbm.at[pl.ds(index_ref[0], 8)], buffer, semaphore)
        o_ref[0] = buffer[0, 0]
    return _call(kernel, params, in_spec=_hbm(),
                 out_spec=_smem_spec(), out_shape=(1,), operand=(LARGE_ROWS, LANES),
                 dtype=jnp.int32,
                 scratch=(pltpu.SMEM((8, LANES), jnp.int32), pltpu.SemaphoreType.DMA(())))


def dma_from_any(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    from jax.experimental import pallas as pl

    return dma_from_hbm(params, pl.BlockSpec(memory_space=pl.ANY), rows=ROWS)


def block_index(params: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(index_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]
    return _call(kernel, params, in_spec=pl.BlockSpec((8, LANES), lambda i, s: (s[0], 0)),
                 out_spec=_block((8, LANES)), out_shape=(8, LANES),
                 operand=(LARGE_ROWS, LANES), dtype=jnp.float32)


ACCESS_KINDS = (
    AccessKind("SMEM scalar load", "sld", "smem", smem_load),
    AccessKind("SMEM scalar store", "sst", "smem", smem_store),
    AccessKind("VMEM vector load", "vld", "vmem", vmem_load),
    AccessKind("VMEM vector store", "vst", "vmem", vmem_store),
    AccessKind("DMA HBM to VMEM, HBM offset", "dma.hbm_to_vmem", "", dma_from_hbm),
    AccessKind("DMA from a pl.ANY operand to VMEM, source offset", "dma.hbm_to_vmem", "",
               dma_from_any, instead=("vld", "vmem")),
    AccessKind("DMA HBM to VMEM, VMEM offset", "dma.hbm_to_vmem", "", dma_into_vmem),
    AccessKind("DMA VMEM to HBM, HBM offset", "dma.vmem_to_hbm", "", dma_to_hbm),
    AccessKind("DMA VMEM to HBM, VMEM offset", "dma.vmem_to_hbm", "", dma_from_vmem),
    AccessKind("DMA HBM to SMEM, HBM offset", "dma.hbm_to_smem", "", dma_into_smem),
    AccessKind("DMA VMEM to VMEM, source offset", "vld", "vmem", dma_vmem_to_vmem),
    AccessKind("BlockSpec block index from scalar prefetch", "dma.hbm_to_vmem", "", block_index),
)


@dataclasses.dataclass(frozen=True)
class Reading:
    """What one compile of an access kind's kernel left in libtpu's code."""

    found: int  # how many of the kind's instructions (dynamic ones for loads and stores)
    checked: int  # how many of those a BoundsCheck guards
    instead: str = ""  # the instruction read instead of the kind's own, when it is not there

    @property
    def verdict(self) -> str:
        if not self.found:
            return "not found"
        verdict = "halts" if self.checked else "no check"
        return f"{verdict} ({self.instead})" if self.instead else verdict


def read_bounds_checks(chip: str, kinds: tuple[AccessKind, ...] = ACCESS_KINDS,
                       ) -> dict[tuple[str, bool], Reading]:
    """Per access kind and ``disable_bounds_checks``, what libtpu emitted for ``chip``: every
    kernel compiled in one child process (``pytest_pallas.estimate``), its dump kept."""
    from jax.experimental.pallas import tpu as pltpu

    import pytest_pallas
    from pytest_pallas._compat.libtpu_dump import memory_accesses

    calls = []
    for disable in (False, True):
        params = pltpu.CompilerParams(disable_bounds_checks=disable)
        calls += [(kind, disable, *kind.build(params)) for kind in kinds]

    def every_kernel(*operands: Any) -> Any:
        outputs, at = [], 0
        for _, _, call, args in calls:
            outputs.append(call(*operands[at:at + len(args)]))
            at += len(args)
        return outputs

    operands = [arg for *_, args in calls for arg in args]
    with tempfile.TemporaryDirectory(prefix="bounds-checks-") as kept:
        previous = os.environ.get("PYTEST_PALLAS_KEEP_DUMP")
        os.environ["PYTEST_PALLAS_KEEP_DUMP"] = kept
        try:
            pytest_pallas.estimate(every_kernel, *operands, chip=chip)
        finally:
            if previous is None:
                del os.environ["PYTEST_PALLAS_KEEP_DUMP"]
            else:
                os.environ["PYTEST_PALLAS_KEEP_DUMP"] = previous
        readings = {}
        for number, (kind, disable, _, _) in enumerate(calls):
            every = memory_accesses(os.path.join(kept, f"kernel-{number}"))
            accesses, instead = _of(every, kind.instruction, kind.space), ""
            if not accesses and kind.instead is not None:
                accesses, instead = _of(every, *kind.instead), "{} [{}]".format(*kind.instead)
            readings[kind.name, disable] = Reading(
                len(accesses), sum(access.checked for access in accesses), instead)
    return readings


def _of(accesses: list[Any], instruction: str, space: str) -> list[Any]:
    """The accesses of one instruction; of a load or store, those at a dynamic address."""
    return [access for access in accesses if access.instruction == instruction
            and (not access.space or (access.space == space and access.dynamic))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chips", default="v5e,v6e,7x")
    chips = parser.parse_args().chips.split(",")
    from pytest_pallas.checks import compile_check

    compile_check.quiet_libtpu_environment()
    from pytest_pallas._compat.out_of_bounds import CHIP_BOUNDS_CHECKS

    readings = {chip: read_bounds_checks(chip) for chip in chips}
    print(f"libtpu {compile_check.libtpu_version()}: what libtpu emits before each access at a "
          "dynamic index (halts: a BoundsCheck stops the kernel out of bounds; no check: the "
          "chip reads or writes whatever lies there), disable_bounds_checks False / True")
    width = max(len(kind.name) for kind in ACCESS_KINDS)
    print(f"{'access':<{width}}  {'instruction':<15}  "
          + "  ".join(f"{chip:<24}" for chip in chips) + "  CHIP_BOUNDS_CHECKS")
    for kind in ACCESS_KINDS:
        cells = []
        for chip in chips:
            on, off = readings[chip][kind.name, False], readings[chip][kind.name, True]
            cells.append(f"{on.verdict} / {off.verdict}")
        instruction = f"{kind.instruction} [{kind.space}]" if kind.space else kind.instruction
        row = CHIP_BOUNDS_CHECKS.get(kind.name)
        table = "(not in the table)" if row is None else ("halts" if row.halts else "no check")
        print(f"{kind.name:<{width}}  {instruction:<15}  "
              + "  ".join(f"{cell:<24}" for cell in cells) + f"  {table}")


if __name__ == "__main__":
    main()
