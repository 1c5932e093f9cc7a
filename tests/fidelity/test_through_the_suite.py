"""Each TPU rule, broken by a user's kernel given with --pallas-impl, fails the conformance suite
on the CPU with a message that names the rule, the kernel and the fix; a correct kernel in the
same style passes."""

import pathlib
import textwrap

import pytest

USER_KERNELS = textwrap.dedent(
    """
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas import supports

    ONE_BLOCK = supports(dtypes=("float32",), multiple_of={"r": 8, "c": 128},
                         max_size={"r": 8, "c": 128})


    def _sum_body(x_ref, o_ref, acc_ref, *extra_scratch, initialise, axis):
        if initialise:
            @pl.when(pl.program_id(axis) == 0)
            def _():
                acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += x_ref[...]
        for extra in extra_scratch:  # used, so that the compiler keeps it in VMEM
            row = pl.multiple_of(pl.program_id(0) * 8, 8)  # dynamic: the whole buffer stays
            extra[pl.ds(row, 8), :] = acc_ref[...]

        @pl.when(pl.program_id(axis) == pl.num_programs(axis) - 1)
        def _():
            o_ref[...] = acc_ref[...]
            for extra in extra_scratch:  # the same values, read back from the big buffer
                o_ref[...] = extra[pl.ds(pl.multiple_of(pl.program_id(0) * 8, 8), 8), :]


    def _sum(x, *, name, block=(8, 128), order="rows-then-n", semantics=None,
             initialise=True, extra_scratch_rows=0):
        n, r, c = x.shape
        if order == "rows-then-n":  # the reduction axis last: right
            grid = (r // block[0], n)
            x_map, o_map, axis = (lambda i, k: (k, i, 0)), (lambda i, k: (i, 0)), 1
        else:  # the reduction axis first: each output block is left and revisited
            grid = (n, r // block[0])
            x_map, o_map, axis = (lambda k, i: (k, i, 0)), (lambda k, i: (i, 0)), 0
        params = (pltpu.CompilerParams(dimension_semantics=semantics) if semantics else None)
        return pl.pallas_call(
            functools.partial(_sum_body, initialise=initialise, axis=axis),
            out_shape=jax.ShapeDtypeStruct((r, c), x.dtype), grid=grid,
            in_specs=[pl.BlockSpec((None, *block), x_map)],
            out_specs=pl.BlockSpec(block, o_map),
            scratch_shapes=[pltpu.VMEM((block[0], 128), x.dtype)]
            + ([pltpu.VMEM((extra_scratch_rows, 128), x.dtype)] if extra_scratch_rows else []),
            compiler_params=params, name=name)(x)


    @ONE_BLOCK
    def sum_correct(x):
        return _sum(x, name="sum_correct",
                    semantics=("parallel", "arbitrary"))


    @ONE_BLOCK
    def sum_block_not_tiled(x):
        return _sum(x, name="sum_block_not_tiled", block=(4, 128))


    @ONE_BLOCK
    def sum_scratch_over_vmem(x):
        return _sum(x, name="sum_scratch_over_vmem", extra_scratch_rows=40 * 1024)  # 20 MiB


    @supports(dtypes=("float32",), multiple_of={"r": 8, "c": 128}, max_size={"c": 128})
    def sum_reduction_on_the_major_axis(x):
        return _sum(x, name="sum_reduction_on_the_major_axis", order="n-then-rows")


    @ONE_BLOCK
    def sum_parallel_reduction(x):
        return _sum(x, name="sum_parallel_reduction", semantics=("parallel", "parallel"))


    @ONE_BLOCK
    def sum_uninitialised_accumulator(x):
        return _sum(x, name="sum_uninitialised_accumulator", initialise=False)


    def _copy_body(x_ref, o_ref, buffer, semaphore, *, wait_first):
        copy = pltpu.make_async_copy(x_ref, buffer, semaphore)  # VMEM -> VMEM
        copy.start()
        if wait_first:
            copy.wait()
        o_ref[...] = buffer[...]
        if not wait_first:
            copy.wait()


    def _copy(x, *, wait_first, name):
        return pl.pallas_call(
            functools.partial(_copy_body, wait_first=wait_first),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
            name=name)(x)


    COPY_DOMAIN = supports(dtypes=("float32",), multiple_of={"rows": 8, "cols": 128},
                           max_size={"rows": 64, "cols": 256})


    @COPY_DOMAIN
    def copy_correct(x):
        return _copy(x, wait_first=True, name="copy_correct")


    @COPY_DOMAIN
    def copy_read_before_wait(x):
        return _copy(x, wait_first=False, name="copy_read_before_wait")
    """
)

# (implementation, extra flags, what the failure must say)
BROKEN = [
    ("sum=rules:sum_block_not_tiled", (),
     ["TPU rule [block-tiling] broken by kernel 'sum_block_not_tiled", "Fix:"]),
    ("sum=rules:sum_scratch_over_vmem", (),
     ["TPU rule [vmem-footprint] broken by kernel 'sum_scratch_over_vmem", "Fix:"]),
    # The kernel writes each output block before reading it: its scratch accumulator, carried
    # across blocks, fails the values, and the failure names the revisit behind them.
    ("sum=rules:sum_reduction_on_the_major_axis", (),
     ["[sum: value] Arrays are not close",
      "this failure may be [output-revisit] in kernel 'sum_reduction_on_the_major_axis",
      "Fix: put the reduction axis 0 last in the grid"]),
    ("sum=rules:sum_parallel_reduction", (),
     ["TPU rule [parallel-axis-race] broken by kernel 'sum_parallel_reduction", "Fix:"]),
    ("sum=rules:sum_uninitialised_accumulator", (),
     ["TPU rule [uninitialized-read] broken by kernel 'rules:sum_uninitialised_accumulator'",
      # The value property's NaN, its cause found by rerunning on NaN- and zero-filled memory:
      "cause: TPU rule [uninitialized-read] broken by kernel 'rules:sum_uninitialised_accumulator'",
      "Fix: initialise each accumulator before its first read"]),
    ("copy=rules:copy_read_before_wait", (),
     ["TPU rule [uninitialized-read] broken by kernel 'rules:copy_read_before_wait'",
      "read a DMA's destination only after its .wait()"]),
    ("copy=rules:copy_read_before_wait", ("--pallas-detect-races",),
     ["TPU rule [data-race] broken by kernel 'copy_read_before_wait",
      "a read of a DMA's destination before its .wait()"]),
]


TESTS_DIR = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def rules_module(pytester, monkeypatch):
    pytester.makepyfile(rules=USER_KERNELS)
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))  # for -p _pallas_no_shrink


def run_suite(pytester, implementation, *flags):
    # Without Hypothesis's shrinking, which takes minutes on a failing kernel and only
    # simplifies the input shown (tests/_pallas_no_shrink.py).
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "_pallas_no_shrink", "--pallas-seed=0",
        "--pallas-examples=2", "--pallas-impl", implementation, *flags, timeout=300)


@pytest.mark.parametrize("implementation, flags, expected", BROKEN,
                         ids=[f"{impl.split(':')[1]}{''.join(flags)}" for impl, flags, _ in BROKEN])
def test_a_kernel_breaking_a_tpu_rule_fails_the_suite_naming_rule_kernel_and_fix(
        pytester, rules_module, implementation, flags, expected):
    result = run_suite(pytester, implementation, *flags)
    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output[-3000:]
    for text in expected:
        assert text in output, f"{text!r} not in the output:\n{output[-6000:]}"


@pytest.mark.parametrize("implementation", ["sum=rules:sum_correct", "copy=rules:copy_correct"])
def test_the_same_kernels_written_correctly_pass(pytester, rules_module, implementation):
    # Without the TPU compiler check: under jax.vmap, Pallas batches copy_correct's
    # whole-array block into a (1, rows, cols) ref that Mosaic will not DMA into the
    # (rows, cols) scratch ("DMA source and target shape mismatch"), a rejection of
    # JAX's batching rule, not of the rule this test is about.
    result = run_suite(pytester, implementation, "--pallas-detect-races", "--pallas-compile=none")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-6000:]
