"""A kernel whose VMEM footprint the chip cannot hold fails on the CPU.

Interpret mode has no VMEM limit at all; the check adds up what Mosaic keeps
in VMEM at once (every VMEM block double-buffered, scratch, the peak of
pl.run_scoped) and compares it with the scoped-VMEM limit the kernel compiles
under, which is lower than the chip's capacity unless the kernel raises it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as fa
from jax.experimental.pallas.ops.tpu.matmul import matmul

from pytest_pallas._compat import pallas_call_hooks
from pytest_pallas.checks import compile_check
from pytest_pallas.checks.kernel_check import CheckOptions, check_kernel
from pytest_pallas.checks.violations import TpuRuleViolation
from pytest_pallas.checks.vmem_footprint import VMEM, default_scoped_vmem_bytes, tpu_info_for

pytestmark = pytest.mark.pallas

MIB = 2**20
STATIC_ONLY = CheckOptions(lower_for_tpu=False)


def _copy_kernel(x_ref, o_ref, *scratch):
    o_ref[...] = x_ref[...]


def tiled_copy(x, block, *, buffers=None, vmem_limit_bytes=None, scratch_shapes=()):
    """Copy ``x`` block by block over a 1-D grid of row blocks."""
    mode = {} if buffers is None else {"pipeline_mode": pl.Buffered(buffers)}
    spec = pl.BlockSpec(block, lambda i: (i, 0), **mode)
    return pl.pallas_call(
        _copy_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // block[0],),
        in_specs=[spec],
        out_specs=pl.BlockSpec(block, lambda i: (i, 0)),
        scratch_shapes=scratch_shapes,
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=vmem_limit_bytes),
        name="tiled_copy",
    )(x)


def _footprint(*args, chip="v5e", options=STATIC_ONLY, **kwargs):
    (report,) = check_kernel(tiled_copy, *args, chip=chip, check_options=options, **kwargs)
    return report


def test_footprint_counts_double_buffered_blocks_padded_tiles_and_scratch():
    x = jax.ShapeDtypeStruct((64, 100), jnp.float32)  # the lane dimension pads 100 -> 128
    report = _footprint(
        x, (8, 100), scratch_shapes=[pltpu.VMEM((3, 256), jnp.float32), pltpu.SemaphoreType.DMA]
    )
    tile = 8 * 128 * 4
    assert report.vmem_bytes == 2 * tile + 2 * tile + 8 * 256 * 4
    assert report.vmem_limit_bytes == 16 * MIB
    assert "default scoped-VMEM limit on v5e" in report.vmem_limit_source


def test_over_the_default_scoped_limit_fails_with_a_fix():
    x = jax.ShapeDtypeStruct((6144, 1024), jnp.float32)  # (1536, 1024) blocks: 6 MiB each
    with pytest.raises(TpuRuleViolation) as caught:
        _footprint(x, (1536, 1024))
    error = caught.value
    assert error.rule == VMEM
    assert "tiled_copy" in error.kernel
    message = str(error)
    assert "needs at least 24.0 MiB" in message
    assert "the default scoped-VMEM limit on v5e, 16.0 MiB" in message
    assert (
        "input 0 (args[0], kernel parameter x_ref) block (1536, 1024) float32: 2 x 6.0 MiB"
        in message
    )
    assert "vmem_limit_bytes=31457280" in error.fix and "128.0 MiB" in error.fix


def test_exactly_at_the_limit_passes_and_one_more_tile_fails():
    x = jax.ShapeDtypeStruct((4096, 1024), jnp.float32)
    assert _footprint(x, (1024, 1024)).vmem_bytes == 16 * MIB  # 2 x 4 MiB in + 2 x 4 MiB out
    with pytest.raises(TpuRuleViolation, match="at least 16.0 MiB"):
        _footprint(x, (1024, 1024), scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])


def test_the_limit_depends_on_the_chip():
    x = jax.ShapeDtypeStruct((8192, 1024), jnp.float32)  # 2048-row blocks: 32 MiB in all
    with pytest.raises(TpuRuleViolation, match="on v5e, 16.0 MiB"):
        _footprint(x, (1536, 1024), chip="v5e")
    assert _footprint(x, (1536, 1024), chip="v6e").vmem_limit_bytes == 32 * MIB
    with pytest.raises(TpuRuleViolation, match="on 7x, 32.0 MiB"):
        _footprint(x, (2048, 1024), scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)], chip="7x")


def test_vmem_limit_bytes_raises_the_bound_up_to_the_capacity():
    x = jax.ShapeDtypeStruct((8192, 1024), jnp.float32)
    assert _footprint(x, (2048, 1024), vmem_limit_bytes=40 * MIB).ok
    with pytest.raises(TpuRuleViolation, match="its CompilerParams.vmem_limit_bytes"):
        _footprint(x, (2048, 1024), vmem_limit_bytes=24 * MIB)
    with pytest.raises(TpuRuleViolation, match="a v5e TensorCore has 128.0 MiB") as caught:
        _footprint(x, (2048, 1024), vmem_limit_bytes=256 * MIB)
    assert "at most 134217728" in caught.value.fix


def test_over_the_capacity_the_fix_is_to_shrink():
    x = jax.ShapeDtypeStruct((24576, 1024), jnp.float32)  # 12288-row blocks: 4 x 48 MiB
    with pytest.raises(TpuRuleViolation) as caught:
        _footprint(x, (12288, 1024), vmem_limit_bytes=128 * MIB)
    assert caught.value.fix.startswith(
        "shrink the blocks (the footprint is over the chip's whole 128.0 MiB)"
    )


def test_single_buffering_halves_a_block():
    x = jax.ShapeDtypeStruct((4096, 1024), jnp.float32)
    double = _footprint(x, (512, 1024)).vmem_bytes
    single = _footprint(x, (512, 1024), buffers=1).vmem_bytes
    assert double - single == 2 * MIB


def test_capacity_bound_and_libtpu_flag(monkeypatch):
    x = jax.ShapeDtypeStruct((8192, 1024), jnp.float32)
    capacity = CheckOptions(lower_for_tpu=False, vmem_bound="capacity")
    assert _footprint(x, (2048, 1024), options=capacity).vmem_limit_bytes == 128 * MIB
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_scoped_vmem_limit_kib=65536")
    assert default_scoped_vmem_bytes(tpu_info_for("v5e")) == 64 * MIB
    assert _footprint(x, (2048, 1024)).ok


def _scoped_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

    def first(a):  # 4 MiB, released before `second` allocates
        a[...] = jnp.ones_like(a)
        o_ref[...] += a[:8, :128]

    def second(b):  # 2 MiB, holding a nested 3 MiB: 5 MiB at its peak
        b[...] = jnp.ones_like(b)

        def inner(c):
            c[...] = jnp.ones_like(c)
            o_ref[...] += b[:8, :128] + c[:8, :128]

        pl.run_scoped(inner, pltpu.VMEM((768, 1024), jnp.float32))

    pl.run_scoped(first, pltpu.VMEM((1024, 1024), jnp.float32))
    pl.run_scoped(second, pltpu.VMEM((512, 1024), jnp.float32))


def scoped(x):
    return pl.pallas_call(_scoped_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def test_run_scoped_counts_its_peak_not_its_sum():
    (report,) = check_kernel(
        scoped, jax.ShapeDtypeStruct((8, 128), jnp.float32), check_options=STATIC_ONLY
    )
    blocks = 2 * 8 * 128 * 4  # no grid: one copy of each block (test_vmem_single_step.py)
    assert report.vmem_bytes == blocks + 5 * MIB


def test_interpret_mode_runs_what_the_chip_rejects():
    x = jnp.ones((2560, 1024), jnp.float32)
    kernel = lambda x: tiled_copy(x, (1280, 1024))  # two steps: 4 x 5 MiB of blocks
    with pallas_call_hooks.suspend_pallas_call_observers():  # a harness's own static checks
        np.testing.assert_array_equal(jax.jit(kernel)(x), x)  # no VMEM limit when interpreted
    with pytest.raises(TpuRuleViolation, match="needs at least 20.0 MiB"):
        check_kernel(kernel, x, use_compiler=False)
    if compile_check.libtpu_version() is not None:  # the TPU compiler's own verdict
        with pytest.raises(TpuRuleViolation, match=r"\[compiler-vmem\].*the limit is 16.00 MiB"):
            check_kernel(kernel, x)


@pytest.mark.parametrize("chip", ["v5e", "v6e", "7x", "v5p"])
def test_jax_kernels_fit(chip):
    x = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
    (report,) = check_kernel(matmul, x, x, block_shape=(512, 512), block_k=512, chip=chip)
    assert report.ok and report.vmem_bytes < report.vmem_limit_bytes
    q = jax.ShapeDtypeStruct((1, 2, 1024, 128), jnp.bfloat16)
    sizes = fa.BlockSizes(block_q=512, block_k_major=512, block_k=256, block_b=1)
    (report,) = check_kernel(fa.flash_attention, q, q, q, block_sizes=sizes, chip=chip)
    assert report.ok
