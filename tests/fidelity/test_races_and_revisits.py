"""Reductions on the wrong grid axes fail on the CPU, statically and in the TPU interpreter.

Two ways to get a reduction's grid wrong, both invisible to plain interpret
mode, which keeps whole outputs in memory and runs the grid in order:

* a reduction axis marked "parallel": megacore chips split it across two
  TensorCores that race on the output block (the static check names it; the
  TPU interpreter with two simulated cores and race detection sees the race);
* a reduction axis that is not the minormost: each output block is left and
  revisited, after Pallas TPU already wrote it back (the static check names
  it; where the index map reads memory, the revisited block holds poison in
  the TPU interpreter, as the chip's holds stale memory, and the values
  decide, with a note naming the revisit).
"""

import functools
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.matmul import matmul

from pytest_pallas._compat import output_revisits, pallas_call_hooks
from pytest_pallas.checks.kernel_check import CheckOptions, check_kernel, kernel_exits_checked
from pytest_pallas.checks.runtime_rules import translate_interpreter_error
from pytest_pallas.checks.static_rules import OUT_OF_BOUNDS, PARALLEL_RACE, REVISIT
from pytest_pallas.checks.violations import DATA_RACE, TpuRuleViolation

pytestmark = pytest.mark.pallas

STATIC_ONLY = CheckOptions(lower_for_tpu=False)
BY_DATAFLOW = CheckOptions(lower_for_tpu=False, max_grid_points=1)  # never enumerate the grid


def _accumulate_kernel(x_ref, o_ref, *, reduction_axis):
    @pl.when(pl.program_id(reduction_axis) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


def sum_over_axis_parallel(x):
    """(n, 8, 128) -> (8, 128), the reduction axis marked "parallel": the seeded race."""
    return pl.pallas_call(
        functools.partial(_accumulate_kernel, reduction_axis=0),
        out_shape=jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
        grid=(x.shape[0],),
        in_specs=[pl.BlockSpec((None, 8, 128), lambda k: (k, 0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        name="sum_parallel_reduction",
    )(x)


def sum_over_axis(x, *, reduction_first, semantics=None, revisit_any=False):
    """(n, 8, c) -> (8, c) over a grid of (column block, n) or, seeded bug, (n, column block)."""
    n, rows, cols = x.shape
    if reduction_first:  # the reduction axis iterates slowest: every block is revisited
        grid, axis = (n, cols // 128), 0
        in_map, out_map = (lambda k, j: (k, 0, j)), (lambda k, j: (0, j))
    else:
        grid, axis = (cols // 128, n), 1
        in_map, out_map = (lambda j, k: (k, 0, j)), (lambda j, k: (0, j))
    mode = {"pipeline_mode": pl.Buffered(1, revisit=pl.RevisitMode.ANY)} if revisit_any else {}
    return pl.pallas_call(
        functools.partial(_accumulate_kernel, reduction_axis=axis),
        out_shape=jax.ShapeDtypeStruct((rows, cols), x.dtype),
        grid=grid,
        in_specs=[pl.BlockSpec((None, rows, 128), in_map)],
        out_specs=pl.BlockSpec((rows, 128), out_map, **mode),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        name="sum_over_axis",
    )(x)


X = jax.ShapeDtypeStruct((4, 8, 256), jnp.float32)


# --- static: caught from the grid mapping, at trace time ------------------------


@pytest.mark.parametrize("options", [STATIC_ONLY, BY_DATAFLOW], ids=["enumerated", "dataflow"])
def test_parallel_reduction_axis_is_a_race(options):
    with pytest.raises(TpuRuleViolation) as caught:
        check_kernel(
            sum_over_axis_parallel,
            jax.ShapeDtypeStruct((4, 8, 128), jnp.float32),
            check_options=options,
        )
    error = caught.value
    assert error.rule == PARALLEL_RACE
    assert "sum_parallel_reduction" in error.kernel
    assert error.operand == "output 0 (outputs, kernel parameter o_ref)"
    assert 'grid axis 0 ("parallel")' in str(error)
    assert 'mark axis 0 "arbitrary"' in error.fix
    if options is STATIC_ONLY:
        assert "written at grid points (0,) and (1,)" in str(error)


@pytest.mark.parametrize("options", [STATIC_ONLY, BY_DATAFLOW], ids=["enumerated", "dataflow"])
def test_reduction_on_a_major_axis_revisits_output_blocks(options):
    with pytest.raises(TpuRuleViolation) as caught:
        check_kernel(sum_over_axis, X, reduction_first=True, check_options=options)
    error = caught.value
    assert error.rule == REVISIT
    assert "put the reduction axis 0 last in the grid" in error.fix
    if options is STATIC_ONLY:
        assert (
            "block (0, 0) is visited at grid point (0, 0), left at (0, 1) and visited again "
            "at (1, 0)"
        ) in str(error)


@pytest.mark.parametrize("options", [STATIC_ONLY, BY_DATAFLOW], ids=["enumerated", "dataflow"])
@pytest.mark.parametrize("semantics", [None, ("arbitrary", "arbitrary"), ("parallel", "arbitrary")])
def test_reduction_on_the_last_axis_passes(options, semantics):
    (report,) = check_kernel(
        sum_over_axis, X, reduction_first=False, semantics=semantics, check_options=options
    )
    assert report.ok and {PARALLEL_RACE, REVISIT} <= set(report.checked)


def test_a_parallel_reduction_on_the_last_axis_is_still_a_race():
    with pytest.raises(TpuRuleViolation, match=PARALLEL_RACE):
        check_kernel(
            sum_over_axis,
            X,
            reduction_first=False,
            semantics=("parallel", "parallel"),
            check_options=STATIC_ONLY,
        )


def normalized_columns(x, *, write_first_pass=False):
    """(8, c) -> each column over its sum, in two passes over the column blocks: the first sums
    into scratch, the second writes every output block again, whole, without reading it."""
    rows, cols = x.shape
    blocks = cols // 128

    def kernel(x_ref, o_ref, sums_ref):
        step, j = pl.program_id(0), pl.program_id(1)

        @pl.when(step == 0)
        def _():
            sums_ref[pl.ds(j, 1), :] = jnp.sum(x_ref[...], axis=0, keepdims=True)
            if write_first_pass:  # a placeholder, overwritten on the second pass
                o_ref[...] = jnp.zeros_like(o_ref)

        @pl.when(step == 1)
        def _():
            o_ref[...] = x_ref[...] / sums_ref[pl.ds(j, 1), :]

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(2, blocks),
        in_specs=[pl.BlockSpec((rows, 128), lambda step, j: (0, j))],
        out_specs=pl.BlockSpec((rows, 128), lambda step, j: (0, j)),
        scratch_shapes=[pltpu.VMEM((blocks, 128), jnp.float32)],
        name="normalized_columns",
    )(x)


@pytest.mark.parametrize("options", [STATIC_ONLY, BY_DATAFLOW], ids=["enumerated", "dataflow"])
@pytest.mark.parametrize("write_first_pass", [False, True])
def test_a_revisit_that_writes_before_reading_is_left_to_the_values(options, write_first_pass):
    # Right on the chip: the second pass's write-back is each block's value.
    (report,) = check_kernel(normalized_columns, jax.ShapeDtypeStruct((8, 256), jnp.float32),
                             write_first_pass=write_first_pass, check_options=options)
    assert report.ok
    assert [suspect.rule for suspect in report.suspects] == [REVISIT]


def test_a_two_pass_kernel_computes_right_in_the_tpu_interpreter(interpret):
    x = jnp.arange(1, 8 * 256 + 1, dtype=jnp.float32).reshape(8, 256)
    with interpret(), output_revisits.revisited_blocks_recorded() as revisits:
        out = jax.block_until_ready(normalized_columns(x))
    np.testing.assert_allclose(out, x / x.sum(0), rtol=1e-6)
    assert [(r.output, r.iteration) for r in revisits] == [(0, (1, 0))]


def test_declared_revisits_are_allowed():
    (report,) = check_kernel(sum_over_axis, X, reduction_first=True, revisit_any=True)
    assert report.ok  # and Mosaic lowers it (RevisitMode.ANY needs single buffering)


def test_index_map_returning_element_offsets_is_out_of_bounds():
    def offsets(x):
        spec = pl.BlockSpec((8, 128), lambda i: (i * 8, 0))  # should be (i, 0)
        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(4,),
            in_specs=[spec],
            out_specs=spec,
            name="offsets",
        )(x)

    with pytest.raises(TpuRuleViolation, match=OUT_OF_BOUNDS) as caught:
        check_kernel(offsets, jax.ShapeDtypeStruct((32, 128), jnp.float32))
    assert "at grid point (1,) its index map returns block (8, 0)" in str(caught.value)
    assert "valid indices 0..3" in str(caught.value)


def test_jax_matmul_passes_on_a_large_grid():
    x = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
    (report,) = check_kernel(matmul, x, x, block_shape=(128, 128), block_k=128)  # 32768 points
    assert report.ok and not report.skipped


# --- dynamic: what the TPU interpreter sees when the kernel runs -------------------


def _stack(n):
    return jnp.arange(n * 8 * 128, dtype=jnp.float32).reshape(n, 8, 128) % 7


def test_two_simulated_cores_with_race_detection_catch_the_parallel_reduction(interpret):
    x = _stack(2)
    with (
        interpret(num_cores_or_threads=2, detect_races=True, random_seed=0),
        pytest.raises(TpuRuleViolation) as caught,
        kernel_exits_checked(),
    ):
        out = jax.block_until_ready(sum_over_axis_parallel(x))
    assert caught.value.rule == DATA_RACE
    assert "sum_parallel_reduction" in caught.value.kernel
    assert not np.allclose(out, x.sum(0))  # and each core kept its own partial sum


def test_the_plain_interpreter_computes_the_racy_reduction_right():
    x = _stack(4)
    with pltpu.force_tpu_interpret_mode(None), pallas_call_hooks.suspend_pallas_call_observers():
        out = pl.pallas_call(
            lambda x_ref, o_ref: _accumulate_kernel(x_ref, o_ref, reduction_axis=0),
            out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
            grid=(4,),
            in_specs=[pl.BlockSpec((None, 8, 128), lambda k: (k, 0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
            interpret=True,
        )(x)
    np.testing.assert_allclose(out, x.sum(0))  # why the static check is needed


def test_jax_matmul_is_race_free_on_two_cores(interpret):
    x = jnp.arange(256 * 256, dtype=jnp.float32).reshape(256, 256) / 65536
    y = x[:, :128]  # grid (2, 1, 2): one row block per core, a two-step reduction on each
    with (
        interpret(num_cores_or_threads=2, detect_races=True, random_seed=0),
        kernel_exits_checked() as exits,
    ):
        out = jax.block_until_ready(matmul(x, y, block_shape=(128, 128), block_k=128))
    assert exits and all(state.clean for state in exits)
    np.testing.assert_allclose(out, x @ y, rtol=1e-5)


def test_a_revisit_the_interpreter_stops_is_named_as_the_rule(interpret):
    # Under pl.RevisitMode.ANY, which the chip reads back and the interpreter does not.
    x = jnp.ones((2, 8, 256), jnp.float32)
    with interpret(), pytest.raises(Exception, match="Revisited block") as caught:
        jax.block_until_ready(sum_over_axis(x, reduction_first=True, revisit_any=True))
    violation = translate_interpreter_error(caught.value, "sum_over_axis")
    assert violation is not None and violation.rule == REVISIT
    assert "output 0" in violation.operand and "iteration (1, 0)" in str(violation)


def test_a_revisited_block_holds_poison_and_the_revisit_is_recorded(interpret):
    x = jnp.ones((2, 8, 256), jnp.float32)
    with interpret(), output_revisits.revisited_blocks_recorded() as revisits:
        out = jax.block_until_ready(sum_over_axis(x, reduction_first=True))
    # The second pass adds onto poison, as on the chip it adds onto stale memory.
    assert np.isnan(np.asarray(out)).all()
    assert [(r.output, r.block, r.iteration, r.earlier) for r in revisits] == [
        (0, "[0:8, 0:128]", (1, 0), ((0, 0), (0, 0)))]
    assert "came back to output 0's block [0:8, 0:128] in grid iteration (1, 0)" in (
        revisits[0].describe())


def gathered_sum(order, x):
    """Like sum_over_axis(reduction_first=True), with the column block read from SMEM."""
    n, rows, cols = x.shape
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(n, cols // 128),
        in_specs=[pl.BlockSpec((None, rows, 128), lambda k, j, order: (k, 0, order[j]))],
        out_specs=pl.BlockSpec((rows, 128), lambda k, j, order: (0, order[j])),
    )

    def kernel(order_ref, x_ref, o_ref):
        _accumulate_kernel(x_ref, o_ref, reduction_axis=0)

    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((rows, cols), x.dtype),
        name="gathered_sum",
    )(order, x)


def gathered_copy(order, x):
    """Input block k goes to output block order[k], written whole: the last visit wins."""
    n, rows, cols = x.shape
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(n,),
        in_specs=[pl.BlockSpec((None, rows, cols), lambda k, order: (k, 0, 0))],
        out_specs=pl.BlockSpec((None, rows, cols), lambda k, order: (order[k], 0, 0)),
    )

    def kernel(order_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        name="gathered_copy",
    )(order, x)


def test_data_dependent_index_maps_are_left_to_the_interpreter(interpret):
    order = jnp.array([1, 0], jnp.int32)
    x = jnp.ones((2, 8, 256), jnp.float32)
    (report,) = check_kernel(gathered_sum, order, x, check_options=STATIC_ONLY)
    assert report.ok and any("scalar prefetch" in note for note in report.skipped)
    with interpret(), output_revisits.revisited_blocks_recorded() as revisits:
        out = jax.block_until_ready(gathered_sum(order, x))
    assert np.isnan(np.asarray(out)).all() and [r.kernel for r in revisits] == ["gathered_sum"]


def test_a_block_written_whole_on_its_last_visit_is_right(interpret):
    # Blocks 0 and 1 of the output are each visited, left and visited again (blocks 2 and 3,
    # never visited, hold whatever the chip's HBM held: no test reads them).
    x = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(4, 8, 128)
    order = jnp.array([0, 1, 0, 1], jnp.int32)
    with interpret(), output_revisits.revisited_blocks_recorded() as revisits:
        out = jax.block_until_ready(gathered_copy(order, x))
    np.testing.assert_array_equal(out[:2], x[2:])
    assert [r.output for r in revisits] == [0]


# JAX's TPU interpreter stops at a pl.RevisitMode.ANY revisit (it does not read the block
# back); the chip reads it back (JAX's TPUPipelineModeRevisitTest). A declared revisit runs
# in the plain interpreter instead, values checked; an undeclared one whose index map the
# static check evaluates stays the rule.
DECLARED_REVISIT = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def reduce(x, **mode):
        def body(x_ref, o_ref):
            @pl.when(pl.program_id(0) == 0)
            def _():
                o_ref[...] = jnp.zeros_like(o_ref)
            o_ref[...] += x_ref[...]
        return pl.pallas_call(
            body, grid=(3, 3), out_shape=jax.ShapeDtypeStruct((8, 384), jnp.float32),
            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
            out_specs=pl.BlockSpec((8, 128), lambda i, j: (0, j), **mode))(x)

    X = jnp.arange(24 * 384, dtype=jnp.float32).reshape(24, 384)

    @pytest.mark.pallas
    def test_declared():
        out = reduce(X, pipeline_mode=pl.Buffered(1, revisit=pl.RevisitMode.ANY))
        np.testing.assert_allclose(out, np.asarray(X).reshape(3, 8, 384).sum(0))

    @pytest.mark.pallas
    def test_undeclared():
        reduce(X)

    @pytest.mark.pallas
    def test_two_passes():
        # Pass 0 sums each column block into scratch, pass 1 writes each output block whole:
        # every block is left and visited again, and the last write-back is right.
        def body(x_ref, o_ref, sums_ref):
            j = pl.program_id(1)

            @pl.when(pl.program_id(0) == 0)
            def _():
                sums_ref[pl.ds(j, 1), :] = jnp.sum(x_ref[...], axis=0, keepdims=True)

            @pl.when(pl.program_id(0) == 1)
            def _():
                o_ref[...] = x_ref[...] / sums_ref[pl.ds(j, 1), :]

        x = X[:8] + 1
        out = pl.pallas_call(
            body, grid=(2, 3), out_shape=jax.ShapeDtypeStruct((8, 384), jnp.float32),
            in_specs=[pl.BlockSpec((8, 128), lambda p, j: (0, j))],
            out_specs=pl.BlockSpec((8, 128), lambda p, j: (0, j)),
            scratch_shapes=[pltpu.VMEM((3, 128), jnp.float32)])(x)
        np.testing.assert_allclose(out, x / x.sum(0), rtol=1e-6)

    @pytest.mark.pallas
    def test_declared_with_an_out_of_bounds_read():
        # A copy of rows past the array, which the chip halts (a load past a block in VMEM
        # it does not check: that reads poison, tests/test_out_of_bounds.py).
        def body(x_hbm, o_ref, buffer, semaphore):
            @pl.when(pl.program_id(0) == 0)
            def _():
                o_ref[...] = jnp.zeros_like(o_ref)
            rows = pl.ds(8 * (3 - pl.program_id(0)), 8)  # rows 24 to 32 at once: past X
            pltpu.async_copy(x_hbm.at[rows, pl.ds(128 * pl.program_id(1), 128)], buffer,
                             semaphore).wait()
            o_ref[...] += buffer[...]
        pl.pallas_call(
            body, grid=(3, 3), out_shape=jax.ShapeDtypeStruct((8, 384), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i, j: (0, j),
                                   pipeline_mode=pl.Buffered(1, revisit=pl.RevisitMode.ANY)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])(X)
''')


def test_a_declared_revisit_or_one_written_before_read_runs_and_other_revisits_are_the_rule(
        pytester, run_pytest):
    pytester.makepyfile(test_revisits=DECLARED_REVISIT)
    result = run_pytest("-p", "no:xdist", "--pallas-compile=none", "-W",
                        "ignore::UserWarning")
    result.assert_outcomes(passed=2, failed=2)
    assert "[output-revisit]" in result.stdout.str()
    assert "test_two_passes - " not in result.stdout.str()
    # A declared revisit is no licence for an out-of-bounds read: that stays the kernel's.
    assert "test_declared_with_an_out_of_bounds_read - " in result.stdout.str()
    assert "out-of-bounds" in result.stdout.str()
