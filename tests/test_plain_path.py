"""The plain path: a kernel the TPU interpreter would run no differently runs as one XLA loop
(``_compat.plain_path``), every other kernel in the TPU interpreter, with the same verdicts
(``checks.plain_equivalence`` decides which). Each kernel here is bound inside a Pallas test,
whose backend is the run's: the TPU interpreter for v5e, routing on."""

from __future__ import annotations

import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas._compat import plain_path

pytestmark = pytest.mark.pallas


def where(fn, *args):
    """(the interpreter of each kernel ``fn`` binds, their reasons, the result)."""
    with plain_path.decisions_recorded() as decisions:
        out = jax.block_until_ready(fn(*args))
    return [d.interpreter for d in decisions], " ".join(d.reason for d in decisions), out


def in_tpu_interpreter(fn, *args):
    """``fn(*args)`` with every kernel in the TPU interpreter: the run's parameters, unrouted."""
    from pytest_pallas.checks.running import active_backend

    params = plain_path.tpu_only(active_backend().interpret_params)
    with pltpu.force_tpu_interpret_mode(params):
        return np.asarray(jax.block_until_ready(fn(*args)))


def _accumulate(x_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += x_ref[...]

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = acc_ref[...] + pl.program_id(0).astype(jnp.float32)


def row_sums(x):
    """(n, 8 r, 128) -> (8 r, 128), grid (r, n): "parallel" rows, a VMEM accumulator."""
    n, rows, _ = x.shape
    return pl.pallas_call(
        _accumulate, out_shape=jax.ShapeDtypeStruct(x.shape[1:], x.dtype), grid=(rows // 8, n),
        in_specs=[pl.BlockSpec((None, 8, 128), lambda i, k: (k, i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)),
        scratch_shapes=[pltpu.VMEM((8, 128), x.dtype)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        name="row_sums")(x)


X = jnp.arange(3 * 32 * 128, dtype=jnp.float32).reshape(3, 32, 128) / 64


def test_a_kernel_of_loads_stores_and_arithmetic_runs_in_the_plain_interpreter():
    interpreters, _, out = where(row_sums, X)
    assert interpreters == ["plain"]
    expected = np.asarray(X.sum(0)) + np.repeat(np.arange(4, dtype=np.float32), 8)[:, None]
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out, in_tpu_interpreter(row_sums, X))


def test_loop_counters_and_grid_arithmetic_are_proved_in_bounds():
    def kernel(x_ref, o_ref):
        def add_rows(j, acc):
            return acc + x_ref[pl.ds(j * 8, 8), :]

        total = jax.lax.fori_loop(0, 4, add_rows, jnp.zeros((8, 128)))
        more = jax.lax.fori_loop(0, pl.num_programs(0) * 2, add_rows, total)
        i = pl.program_id(0)
        o_ref[...] = more + x_ref[pl.ds(i % 4 * 8, 8), :] + x_ref[pl.ds(i // 2 * 8, 8), :]

    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                        grid=(2,), in_specs=[pl.BlockSpec((32, 128), lambda i: (0, 0))],
                        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
    interpreters, reason, out = where(fn, X[0])
    assert interpreters == ["plain"], reason
    np.testing.assert_array_equal(out, in_tpu_interpreter(fn, X[0]))


def test_an_output_block_starts_from_what_the_previous_block_left_as_in_the_tpu_interpreter():
    # Written at the first grid step only: the next blocks write back the buffer the first
    # left (the TPU interpreter's VMEM buffer); JAX's plain interpreter would read NaN.
    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = x_ref[...]

    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
                        grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
    interpreters, _, out = where(fn, X[0])
    assert interpreters == ["plain"]
    np.testing.assert_array_equal(out, np.tile(np.asarray(X[0, :8]), (4, 1)))
    np.testing.assert_array_equal(out, in_tpu_interpreter(fn, X[0]))


def test_fresh_memory_reads_the_tpu_interpreters_poison_an_unsigned_flag_included():
    # An unsigned flag read before it is written: the plain interpreter's fill (the
    # minimum, 0) would pass it as "not started"; the TPU interpreter's (the maximum) not.
    def kernel(x_ref, o_ref, started_ref, acc_ref):
        @pl.when(started_ref[0] == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)
            started_ref[0] = jnp.uint32(1)

        acc_ref[...] += x_ref[...]
        o_ref[...] = acc_ref[...]

    fn = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32), grid=(3,),
        in_specs=[pl.BlockSpec((None, 8, 128), lambda k: (k, 0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),
        scratch_shapes=[pltpu.SMEM((1,), jnp.uint32), pltpu.VMEM((8, 128), jnp.int32)])
    x = jnp.ones((3, 8, 128), jnp.int32)
    interpreters, _, out = where(fn, x)
    assert interpreters == ["plain"]
    assert not np.array_equal(out, np.full((8, 128), 3))  # the bug stays caught
    np.testing.assert_array_equal(out, in_tpu_interpreter(fn, x))


def test_a_kernel_with_a_dma_stays_in_the_tpu_interpreter():
    def kernel(x_hbm, o_ref, buffer, semaphore):
        copy = pltpu.make_async_copy(x_hbm, buffer, semaphore)
        copy.start()
        copy.wait()
        o_ref[...] = buffer[...]

    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                                        pltpu.SemaphoreType.DMA])
    interpreters, reason, out = where(fn, X[0, :8])
    assert interpreters == ["tpu"]
    assert "any memory" in reason
    np.testing.assert_array_equal(out, X[0, :8])


def test_a_kernel_that_writes_its_input_stays_in_the_tpu_interpreter():
    def kernel(x_ref, o_ref):
        x_ref[...] = x_ref[...] * 2
        o_ref[...] = x_ref[...]

    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    interpreters, reason, out = where(fn, X[0, :8])
    assert interpreters == ["tpu"]
    assert "a store into an input" in reason
    np.testing.assert_array_equal(out, X[0, :8] * 2)


def test_an_index_read_from_memory_stays_in_the_tpu_interpreter():
    def kernel(start_ref, x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(start_ref[0], 8), :]

    fn = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec((32, 128), lambda i, s: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, s: (0, 0))))
    interpreters, reason, out = where(fn, jnp.array([16], jnp.int32), X[0])
    assert interpreters == ["tpu"]
    assert "not known before the kernel runs" in reason
    np.testing.assert_array_equal(out, X[0, 16:24])


def test_a_kernel_the_plain_interpreter_cannot_build_falls_back_to_the_tpu_interpreter(
        monkeypatch):
    def cannot(*args, **kwargs):
        raise NotImplementedError("no rule for this primitive")

    monkeypatch.setattr(plain_path, "_run_plain", cannot)
    interpreters, reason, out = where(row_sums, X[:, :8])
    assert interpreters == ["plain", "tpu"]
    assert "JAX's plain interpreter cannot run it (NotImplementedError" in reason
    np.testing.assert_array_equal(out, np.asarray(X[:, :8].sum(0)))


def test_vmap_and_jvp_of_a_plain_kernel_are_decided_again_and_agree():
    def square(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * x_ref[...]

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)

    batched = jax.vmap(square)
    interpreters, _, out = where(batched, X[:, :16])
    assert interpreters == ["plain", "plain"]  # the kernel, then its batched call
    np.testing.assert_array_equal(out, in_tpu_interpreter(batched, X[:, :16]))
    x = X[0, :16]
    interpreters, _, (value, slope) = where(lambda x: jax.jvp(square, (x,), (x,)), x)
    assert interpreters[-1] == "plain" and len(interpreters) >= 2  # the jvp's kernel too
    np.testing.assert_array_equal(value, x * x)
    np.testing.assert_array_equal(slope, 2 * x * x)


def test_routing_is_off_only_for_race_detection_and_tpu_always():
    from pytest_pallas.backend import chip_info, make_interpret_params
    from pytest_pallas.settings import PallasOptions

    def routed(**options):
        chip = options.pop("chip", "v5e")
        return plain_path.is_routed(make_interpret_params(
            PallasOptions(chip=chip, **options), chip_info(chip)))

    assert routed()
    assert routed(chip="v5p")  # two TensorCores: each core's share in turn
    assert not routed(detect_races=True)
    assert not routed(tpu_interpreter_always=True)


def on_two_cores(fn, *args):
    """(the interpreter of each kernel, the result) with the run's parameters on two
    TensorCores per device, as for a v5p, routed."""
    import dataclasses

    from pytest_pallas.checks.running import active_backend

    params = dataclasses.replace(active_backend().interpret_params, num_cores_or_threads=2)
    with pltpu.force_tpu_interpret_mode(params):
        interpreters, _, out = where(fn, *args)
    with pltpu.force_tpu_interpret_mode(plain_path.tpu_only(params)):
        expected = np.asarray(jax.block_until_ready(fn(*args)))
    return interpreters, np.asarray(out), expected


def first_step_only(x):
    """A running sum whose scratch is set up only at grid step 0 of a "parallel" axis: a
    megacore bug (the second TensorCore starts its share with fresh scratch)."""
    def kernel(x_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += x_ref[...]
        o_ref[...] = acc_ref[...]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((32, 128), x.dtype), grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        scratch_shapes=[pltpu.VMEM((8, 128), x.dtype)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        name="first_step_only")(x)


def test_two_tensorcores_per_device_run_each_cores_share_as_the_tpu_interpreter():
    interpreters, out, expected = on_two_cores(row_sums, X)
    assert interpreters == ["plain"]
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_allclose(out, X.sum(0) + np.repeat(np.arange(4.0), 8)[:, None])


def test_a_megacore_bug_stays_caught_on_two_tensorcores():
    interpreters, out, expected = on_two_cores(first_step_only, X[0])
    assert interpreters == ["plain"]
    # The core whose share does not hold step 0 sums onto fresh (NaN) scratch; the NaNs
    # fall where the TPU interpreter's do.
    assert np.isnan(out).any()
    np.testing.assert_array_equal(out, expected)


# --- Whole runs: verdicts, notes and the flag ---------------------------------------------

KERNELS = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from pytest_pallas._compat import plain_path

    pytestmark = pytest.mark.pallas

    def shifted(x):
        # Reads rows 8 * i + 8 .. 8 * i + 16 of 32: at the last grid step, past the end.
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[pl.ds(pl.program_id(0) * 8 + 8, 8), :]
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), x.dtype),
                              grid=(4,), in_specs=[pl.BlockSpec((32, 128), lambda i: (0, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                              name="shifted")(x)

    def gathered(blocks, x):
        # Output block i is input block blocks[i]: an index map that reads scalar prefetch.
        def kernel(blocks_ref, x_ref, o_ref):
            o_ref[...] = x_ref[...]
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), x.dtype),
                              grid_spec=pltpu.PrefetchScalarGridSpec(
                                  num_scalar_prefetch=1, grid=(4,),
                                  in_specs=[pl.BlockSpec((8, 128), lambda i, b: (b[i], 0))],
                                  out_specs=pl.BlockSpec((8, 128), lambda i, b: (i, 0))),
                              name="gathered")(blocks, x)

    def scattered(blocks, x, accumulate=False):
        # Input block i goes to output block blocks[i]: an output index map reading memory.
        def kernel(blocks_ref, x_ref, o_ref):
            if accumulate:  # onto the block's earlier visits: a revisit reads stale memory
                @pl.when(pl.program_id(0) == 0)
                def _():
                    o_ref[...] = jnp.zeros_like(o_ref)
                o_ref[...] += x_ref[...]
            else:
                o_ref[...] = x_ref[...]
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), x.dtype),
                              grid_spec=pltpu.PrefetchScalarGridSpec(
                                  num_scalar_prefetch=1, grid=(4,),
                                  in_specs=[pl.BlockSpec((8, 128), lambda i, b: (i, 0))],
                                  out_specs=pl.BlockSpec((8, 128), lambda i, b: (b[i], 0))),
                              name="scattered")(blocks, x)

    def unstarted(x):
        def kernel(x_ref, o_ref, acc_ref):
            acc_ref[...] += x_ref[...]
            o_ref[...] = acc_ref[...]
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
                              scratch_shapes=[pltpu.VMEM((8, 128), x.dtype)],
                              name="unstarted")(x)

    X = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)

    def test_shifted():
        # The chip does not check a VMEM load: the rows past the end read poison (contract
        # section 12), the rows in bounds read the input.
        np.testing.assert_array_equal(shifted(X)[:24], X[8:])

    def test_gathered_out_of_bounds():
        with plain_path.decisions_recorded() as decisions:
            out = gathered(jnp.array([0, 1, 2, 7], jnp.int32), X)
        print("DECIDED", [d.interpreter for d in decisions])
        np.testing.assert_array_equal(out[:8], X[:8])

    def test_gathered():
        with plain_path.decisions_recorded() as decisions:
            out = gathered(jnp.array([3, 2, 1, 0], jnp.int32), X)
        print("DECIDED", [d.interpreter for d in decisions])
        np.testing.assert_array_equal(out, jnp.concatenate([X[24:], X[16:24], X[8:16], X[:8]]))

    def test_scattered_revisits():
        with plain_path.decisions_recorded() as decisions:
            out = scattered(jnp.array([0, 1, 0, 1], jnp.int32), X)
        print("DECIDED", [d.interpreter for d in decisions])
        # Each block's last visit writes it whole: its last write-back is the block's value.
        np.testing.assert_array_equal(out[:16], X[16:])

    def test_scattered_sums():
        out = scattered(jnp.array([0, 0, 1, 0], jnp.int32), X, accumulate=True)
        np.testing.assert_array_equal(out[:8], X[:8] + X[8:16] + X[24:])

    def test_unstarted():
        with plain_path.decisions_recorded() as decisions:
            out = unstarted(X[:8])
        print("DECIDED", [d.interpreter for d in decisions])
        np.testing.assert_allclose(out, X[:8])
    """
)


@pytest.mark.parametrize("mode", ["tpu", "tpu-always"])
def test_verdicts_are_the_tpu_interpreters(run_pytest, pytester, mode):
    pytester.makepyfile(test_kernels=KERNELS)
    result = run_pytest(f"--pallas-interpret={mode}", "--pallas-compile=none", "-s", "-rA")
    result.assert_outcomes(passed=3, failed=3)
    # A provably out-of-bounds VMEM read keeps the TPU interpreter, which reads poison there
    # as the chip reads whatever is there; the rows in bounds are the input's.
    assert re.search(r"PASSED test_kernels.py::test_shifted", result.stdout.str())
    # An out-of-bounds block index read from memory: the plain path cannot know it before
    # the kernel runs; it notices it running and the test runs again in the TPU interpreter.
    result.stdout.fnmatch_lines(["*[[]out-of-bounds-access[]]*Out-of-bounds block index (7, 0)*"])
    # So is an output block visited again after the grid left it, which then holds poison,
    # as the chip's holds stale memory: a kernel that writes it whole again passes, one that
    # sums onto it fails on its values, with a note naming the revisit.
    assert re.search(r"PASSED test_kernels.py::test_scattered_revisits", result.stdout.str())
    result.stdout.fnmatch_lines([
        "pallas: this test's kernels came back to an output block after the grid left it: "
        "kernel 'scattered' came back to output 0's block [[]0:8, 0:128[]] in grid iteration "
        "(3,) (visited in iterations (0,) through (1,))*"])
    assert "[output-revisit]" not in result.stdout.str()
    # The plain path's first run is no verdict: only the TPU interpreter's run is shown.
    assert "During handling of the above exception" not in result.stdout.str()
    # A NaN read from fresh memory is explained, naming the kernel.
    result.stdout.fnmatch_lines(["*[[]uninitialized-read[]] in kernel 'unstarted*"])
    decided = re.findall(r"DECIDED (\[.*?\])", result.stdout.str())
    if mode == "tpu":
        # test_gathered_out_of_bounds (its second run, in the TPU interpreter, raises before
        # it prints), test_gathered, test_scattered_revisits (its second run decides
        # nothing: every kernel is the TPU interpreter's) and test_unstarted.
        assert decided == ["['plain']"] * 3 + ["[]", "['plain']"], decided
    else:
        assert decided == ["[]"] * 3, decided


def test_the_header_says_which_kernels_take_the_plain_interpreter(run_pytest, pytester):
    pytester.makepyfile(test_nothing="def test_nothing(): pass")
    routed = run_pytest("--pallas-interpret=tpu", "--pallas-compile=none")
    routed.stdout.fnmatch_lines([
        "pallas: CPU, tpu interpreter, standing in for TPU v5e (1 TensorCore); a kernel the TPU "
        "interpreter would run no differently runs in JAX's plain interpreter, one XLA loop (no "
        "DMA, semaphore, mesh or other TPU-only primitive, no input written, every access "
        "proved in bounds); --pallas-interpret=tpu-always for none;*"])
    always = run_pytest("--pallas-interpret=tpu-always", "--pallas-compile=none")
    always.stdout.fnmatch_lines([
        "pallas: CPU, tpu interpreter, standing in for TPU v5e (1 TensorCore); every kernel in "
        "the TPU interpreter (--pallas-interpret=tpu-always);*"])
