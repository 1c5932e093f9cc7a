"""Out-of-bounds accesses as the chip does them (pytest_pallas._compat.out_of_bounds).

What the chip checks is read from libtpu's code: ``CHIP_BOUNDS_CHECKS`` is compared with what
libtpu emits for one kernel per access kind (benchmarks/bounds_checks.py builds them; skipped
without libtpu), and the dump reader runs on checked-in excerpts of libtpu 0.0.42.1's
``*-post-bounds-check.txt`` for v5e: a DMA from HBM at a dynamic row, with and without
``disable_bounds_checks`` (and as libtpu 0.0.50.1 dumps it), a scalar load from SMEM at an
index from scalar prefetch, a vector store to VMEM at a dynamic row. In a Pallas test on the
CPU, a read the chip does not check reads poison (a discarded one passes, a used one fails with
a note naming the read); what the chip halts stays ``[out-of-bounds-access]``.
"""

from __future__ import annotations

import pathlib
import sys
import textwrap

import pytest

from pytest_pallas._compat import libtpu_dump, out_of_bounds
from pytest_pallas.checks import compile_check

ROOT = pathlib.Path(__file__).resolve().parent.parent
DUMPS = pathlib.Path(__file__).parent / "data" / "libtpu_dump_bounds_checks_v5e"


def _accesses(name):
    return {(a.instruction, a.space, a.dynamic, a.checked)
            for a in libtpu_dump.memory_accesses(str(DUMPS / name))}


def test_the_dump_reader_finds_each_access_and_its_check():
    # A DMA from HBM at a dynamic row: a BoundsCheck halts before it; the pipeline's copy of
    # the output block back to HBM has none (its offset is a constant).
    assert _accesses("dma_from_hbm") == {("dma.hbm_to_vmem", "", True, True),
                                          ("dma.vmem_to_hbm", "", True, False),
                                          ("vld", "vmem", False, False),
                                          ("vst", "vmem", False, False)}
    # libtpu 0.0.50.1 (jax 0.12) names the checked instruction, not its number.
    assert _accesses("dma_from_hbm_libtpu_0.0.50") == _accesses("dma_from_hbm")
    # disable_bounds_checks=True: the same copy, unchecked.
    assert ("dma.hbm_to_vmem", "", True, False) in _accesses("dma_from_hbm_checks_off")
    assert not any(checked for *_, checked in _accesses("dma_from_hbm_checks_off"))
    # x_ref[index_ref[0]] from SMEM: `sld [smem:[#allocation4 + %s0]]`, no check. The DMAs of
    # libtpu's own program around the kernel (the TLP file) are not the kernel's.
    assert ("sld", "smem", True, False) in _accesses("smem_load")
    assert not any(checked for *_, checked in _accesses("smem_load"))
    assert {instruction for instruction, *_ in _accesses("smem_load")} == {
        "sld", "sst", "dma.vmem_to_smem", "dma.smem_to_hbm"}
    assert ("vst", "vmem", True, False) in _accesses("vmem_store")


def test_a_dump_in_another_format_reads_as_no_accesses(tmp_path):
    (tmp_path / "1-tpu_custom_call.1-38-post-bounds-check.txt").write_text("%1 = frobnicate\n")
    assert libtpu_dump.memory_accesses(str(tmp_path)) == []
    assert libtpu_dump.memory_accesses(str(tmp_path / "absent")) == []


def test_the_interpreter_stops_the_reads_the_chip_halts_and_no_other():
    halts = out_of_bounds.chip_halts
    assert not halts("load", "smem") and not halts("load", "vmem")
    assert halts("dma", "hbm", "vmem") and halts("dma", "any", "vmem")
    assert halts("dma", "vmem", "hbm") and halts("dma", "hbm", "smem")
    assert not halts("dma", "vmem", "vmem")  # compiled to vector loads and stores
    assert halts("block", "hbm", "vmem")
    assert halts("dma", "smem", "vmem")  # not read from libtpu: JAX's stop is kept


@pytest.mark.skipif(compile_check.libtpu_version() is None,
                    reason="needs libtpu, the TPU compiler (pip install 'pytest-pallas[tpu]')")
@pytest.mark.parametrize("chip", ["v5e", "7x"])
def test_the_table_is_what_libtpu_emits(chip):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bounds_checks
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    kinds = tuple(kind for kind in bounds_checks.ACCESS_KINDS
                  if kind.name in out_of_bounds.CHIP_BOUNDS_CHECKS)
    assert len(kinds) == len(out_of_bounds.CHIP_BOUNDS_CHECKS)
    readings = bounds_checks.read_bounds_checks(chip, kinds)
    for kind in kinds:
        row = out_of_bounds.CHIP_BOUNDS_CHECKS[kind.name]
        on, off = readings[kind.name, False], readings[kind.name, True]
        assert on.found and off.found, f"{kind.name}: no {kind.instruction} in libtpu's code"
        assert bool(on.checked) == row.halts, f"{kind.name} on {chip}: {on}"
        assert not off.checked, f"{kind.name} on {chip}, disable_bounds_checks=True: {off}"


def test_the_fix_puts_the_interpreter_back_as_it_was():
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as module
    from jax._src.pallas.mosaic.interpret import shared_memory

    before = module.get, module.swap, module.DMA.execute_read
    with out_of_bounds.reads_as_the_chip_reads() as applied:
        assert applied
        assert module.get is not before[0]
        assert isinstance(vars(shared_memory.SharedMemory)["out_of_bounds_reads"], property)
    assert (module.get, module.swap, module.DMA.execute_read) == before
    assert "out_of_bounds_reads" not in vars(shared_memory.SharedMemory)


# One kernel per access kind, each at an index past its buffer that the test chooses.
KERNELS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    N = 16
    X = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
    SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)

    def prefix_sum(table_ref, count_ref, o_ref, *, discard):
        # Sums table[0..count]; its last read is table[count], one past the end at count == N.
        def body(i, total):
            value = table_ref[i]
            return total + (jnp.where(i < N, value, 0) if discard else value)
        o_ref[0] = jax.lax.fori_loop(0, count_ref[0] + 1, body, jnp.int32(0))

    def summed(discard):
        import functools
        return pl.pallas_call(functools.partial(prefix_sum, discard=discard),
                              out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                              in_specs=[SMEM, SMEM], out_specs=SMEM)(
            jnp.arange(N, dtype=jnp.int32), jnp.array([N], jnp.int32))

    def with_row(kernel, in_spec, out_shape, out_spec, scratch=(), **params):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,), in_specs=[in_spec], out_specs=out_spec,
            scratch_shapes=list(scratch))
        call = pl.pallas_call(kernel, grid_spec=spec,
                              out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32),
                              compiler_params=pltpu.CompilerParams(**params))
        return lambda row, x=X: call(jnp.array([row], jnp.int32), x)

    def block(shape):
        return pl.BlockSpec(shape, lambda i, row: (0,) * len(shape))

    def vmem_load(row_ref, x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(row_ref[0], 8), :]

    def dma_in(row_ref, x_hbm, o_ref, buffer, semaphore):
        pltpu.async_copy(x_hbm.at[pl.ds(row_ref[0], 8)], buffer, semaphore).wait()
        o_ref[...] = buffer[...]

    def dma_out(row_ref, x_ref, o_hbm, semaphore):
        pltpu.async_copy(x_ref, o_hbm.at[pl.ds(row_ref[0], 8)], semaphore).wait()

    def vmem_store(row_ref, x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)
        o_ref[pl.ds(row_ref[0], 8), :] = x_ref[...]

    def copied(row_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    ANY = pl.BlockSpec(memory_space=pl.ANY)
    DMA_SCRATCH = (pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA)

    @pytest.mark.pallas
    def test_smem_read_discarded():
        assert int(summed(discard=True)[0]) == sum(range(N))

    @pytest.mark.pallas
    def test_smem_read_used():
        assert int(summed(discard=False)[0]) == sum(range(N))

    @pytest.mark.pallas
    def test_vmem_read_used():
        out = with_row(vmem_load, block((32, 128)), (8, 128), block((8, 128)))(28)
        np.testing.assert_allclose(out, X[np.arange(28, 36) % 32])  # rows 28 to 35, wrapped

    @pytest.mark.pallas
    def test_vmem_copy_read_discarded():
        # A copy within VMEM is a loop of vector loads and stores on the chip: no check.
        out = with_row(dma_in, block((32, 128)), (8, 128), block((8, 128)), DMA_SCRATCH)(28)
        np.testing.assert_allclose(out[:4], X[28:])

    @pytest.mark.pallas
    def test_dma_read():
        with_row(dma_in, ANY, (8, 128), block((8, 128)), DMA_SCRATCH)(28)

    @pytest.mark.pallas
    def test_unchecked_dma_read():
        out = with_row(dma_in, ANY, (8, 128), block((8, 128)), DMA_SCRATCH,
                       disable_bounds_checks=True)(28)
        np.testing.assert_allclose(out[:4], X[28:])

    @pytest.mark.pallas
    def test_dma_write():
        with_row(dma_out, block((8, 128)), (32, 128), ANY, (pltpu.SemaphoreType.DMA,))(28, X[:8])

    @pytest.mark.pallas
    def test_block_index():
        in_spec = pl.BlockSpec((8, 128), lambda i, row: (row[0], 0))
        with_row(copied, in_spec, (8, 128), block((8, 128)))(4)

    @pytest.mark.pallas
    def test_vmem_store():
        with_row(vmem_store, block((8, 128)), (32, 128), block((32, 128)))(28, X[:8])
''')


def _run(pytester, run_pytest, *tests):
    pytester.makepyfile(test_kernels=KERNELS)
    return run_pytest("--pallas-interpret=tpu", "--pallas-compile=none", "-p", "no:xdist",
                      "-k", " or ".join(tests), "-rfE")


def test_a_read_past_an_smem_buffer_whose_value_is_discarded_passes(pytester, run_pytest):
    # The chip's scalar load from SMEM is unchecked (`sld`, no BoundsCheck): the value past
    # the end is whatever lies there, and a select that discards it leaves a right result.
    # So do a copy within VMEM and a DMA compiled with disable_bounds_checks=True.
    result = _run(pytester, run_pytest, "test_smem_read_discarded",
                  "test_vmem_copy_read_discarded", "test_unchecked_dma_read")
    result.assert_outcomes(passed=3)


def test_a_used_read_past_a_buffer_fails_with_a_note_naming_it(pytester, run_pytest):
    result = _run(pytester, run_pytest, "test_smem_read_used", "test_vmem_read_used")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "[out-of-bounds-access]" not in out  # the chip reads on: a wrong result, no stop
    assert out.count("read past a buffer where the chip has no bounds check") == 2
    assert "'prefix_sum at test_kernels.py:9' loaded [16] of a (16,) SMEM buffer" in out
    assert "'vmem_load at test_kernels.py:35' loaded [28:36, 0:128] of a (32, 128) VMEM" in out
    assert "test_kernels.py:12 (prefix_sum.<locals>.body)" in out  # the read's own line


def test_a_dma_or_block_past_its_array_stays_the_rule(pytester, run_pytest):
    # libtpu emits a BoundsCheck (shalt.err) before each: the chip stops the kernel.
    result = _run(pytester, run_pytest, "test_dma_read", "test_dma_write", "test_block_index")
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    assert out.count("TPU rule [out-of-bounds-access]") >= 3
    assert out.count("The chip halts the kernel there too") >= 3
    assert "read past a buffer where the chip has no bounds check" not in out


def test_a_store_past_a_buffer_is_the_rule_and_says_the_chip_writes_on(pytester, run_pytest):
    # A store partly past its buffer: JAX's interpreter stopped at an assertion of its own
    # (jax 0.10, 0.11; jax 0.12 names it).
    result = _run(pytester, run_pytest, "test_vmem_store")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "TPU rule [out-of-bounds-access]" in out
    assert "Out-of-bounds swap of" in out and "but buffer has shape (32, 128)" in out
    assert "The chip does not check a store in the kernel's body" in out
