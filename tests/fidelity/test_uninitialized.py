"""An accumulator read before it is initialised fails on the CPU.

Both interpreters poison what a kernel allocates (scratch, pl.run_scoped
buffers, output blocks) instead of handing it zeros, as a lucky TPU might:

=========== ============ ============ =======
interpreter float        integer      bool
=========== ============ ============ =======
TPU         NaN          max value    True
plain       NaN          min value    False
=========== ============ ============ =======

So a float accumulator turns the result into NaN in either mode, and an
integer sum comes out wrong (the poison wraps around). Each integer poison
is the identity of one reduction, though: for the first output block, plain
mode misses an uninitialised running *max* (its poison is the smallest
integer) and TPU mode a running *min*. Every later block is caught in both
modes anyway: scratch persists across grid steps, as on the chip, so the
accumulator starts from the previous block's result. ``uninitialized_memory=
"zero"`` hides the first block.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas._compat import tpu_interpreter

pytestmark = pytest.mark.pallas


def _reduce_kernel(x_ref, o_ref, acc_ref, *, combine, initialise):
    if initialise is not None:

        @pl.when(pl.program_id(1) == 0)
        def _():
            acc_ref[...] = jnp.full_like(acc_ref, initialise)

    acc_ref[...] = combine(acc_ref[...], x_ref[...])

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = acc_ref[...]


def reduce_rows(x, *, combine, initialise, interpret):
    """Reduce (n, 8 r, 128) over n into (8 r, 128) with a VMEM accumulator, grid (r, n)."""
    n, rows, _ = x.shape
    return pl.pallas_call(
        functools.partial(_reduce_kernel, combine=combine, initialise=initialise),
        out_shape=jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
        grid=(rows // 8, n),
        in_specs=[pl.BlockSpec((None, 8, 128), lambda i, k: (k, i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)),
        scratch_shapes=[pltpu.VMEM((8, 128), x.dtype)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
        name="reduce_rows",
    )(x)


def run(mode, x, **kernel):
    """Run ``reduce_rows`` in the "plain" or "tpu" interpreter ("tpu-zero": zeroed memory)."""
    tpu_interpreter.reset_interpreter_state()
    if mode == "plain":
        with pltpu.force_tpu_interpret_mode(None):
            return np.asarray(reduce_rows(x, interpret=True, **kernel))
    memory = "zero" if mode == "tpu-zero" else "nan"
    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(uninitialized_memory=memory)):
        return np.asarray(reduce_rows(x, interpret=False, **kernel))


FLOATS = jnp.arange(3 * 16 * 128, dtype=jnp.float32).reshape(3, 16, 128) / 100
INTS = (jnp.arange(3 * 16 * 128, dtype=jnp.int32).reshape(3, 16, 128) % 97) - 40
ONE_BLOCK = INTS[:, :8]  # one output block: only the poison can give the bug away
ADD = {"combine": jnp.add}
MAX = {"combine": jnp.maximum}
MIN = {"combine": jnp.minimum}


@pytest.mark.parametrize("mode", ["plain", "tpu"])
def test_uninitialised_float_accumulator_turns_to_nan(mode):
    assert np.isnan(run(mode, FLOATS, initialise=None, **ADD)).all()
    np.testing.assert_allclose(run(mode, FLOATS, initialise=0.0, **ADD), FLOATS.sum(0), rtol=1e-6)


def test_uninitialised_integer_sum_is_wrong():
    assert (run("tpu", INTS, initialise=None, **ADD) != INTS.sum(0)).all()


def test_uninitialised_integer_max_of_one_block_escapes_plain_mode_only():
    expected = np.asarray(ONE_BLOCK.max(0))
    np.testing.assert_array_equal(run("plain", ONE_BLOCK, initialise=None, **MAX), expected)
    assert (run("tpu", ONE_BLOCK, initialise=None, **MAX) == np.iinfo(np.int32).max).all()
    np.testing.assert_array_equal(
        run("tpu", ONE_BLOCK, initialise=np.iinfo(np.int32).min, **MAX), expected
    )


def test_uninitialised_integer_min_of_one_block_escapes_tpu_mode_only():
    expected = np.asarray(ONE_BLOCK.min(0))
    assert (run("plain", ONE_BLOCK, initialise=None, **MIN) == np.iinfo(np.int32).min).all()
    np.testing.assert_array_equal(run("tpu", ONE_BLOCK, initialise=None, **MIN), expected)


@pytest.mark.parametrize("mode", ["plain", "tpu"])
def test_later_blocks_start_from_the_previous_blocks_result(mode):
    out = run(mode, INTS, initialise=None, **MAX)  # two output blocks
    assert not np.array_equal(out[8:], np.asarray(INTS.max(0))[8:])


def test_zeroed_memory_hides_the_first_block():
    out = run("tpu-zero", FLOATS, initialise=None, **ADD)
    np.testing.assert_allclose(out[:8], FLOATS.sum(0)[:8], rtol=1e-6)
    assert not np.allclose(out[8:], FLOATS.sum(0)[8:])


def _output_accumulator_kernel(x_ref, o_ref):
    @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))  # bug: only the first block
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


@pytest.mark.parametrize("mode", ["plain", "tpu"])
def test_output_block_initialised_only_once_fails(mode):
    tpu_interpreter.reset_interpreter_state()
    params = None if mode == "plain" else pltpu.InterpretParams()
    with pltpu.force_tpu_interpret_mode(params):
        out = np.asarray(
            pl.pallas_call(
                _output_accumulator_kernel,
                out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                grid=(2, 3),
                in_specs=[pl.BlockSpec((None, 8, 128), lambda i, k: (k, i, 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)),
                interpret=mode == "plain",
            )(FLOATS)
        )
    expected = np.asarray(FLOATS.sum(0))
    np.testing.assert_allclose(out[:8], expected[:8], rtol=1e-6)  # the first block is right
    # The second block starts from NaN (plain: a poisoned output) or from the
    # first block's sums (TPU: the VMEM buffer is reused, as on the chip).
    assert not np.allclose(out[8:], expected[8:])


# --- check_uninitialized_reads: a named rule, whatever the dtype ------------------------------

from pytest_pallas import check_uninitialized_reads  # noqa: E402
from pytest_pallas.checks.violations import UNINITIALIZED_READ, TpuRuleViolation  # noqa: E402


def reducer(**kernel):
    return functools.partial(reduce_rows, interpret=False, **kernel)


@pytest.mark.parametrize("x, kernel", [
    (FLOATS, ADD),
    (INTS, ADD),
    # One output block of an integer max or min: one poison alone misses one of them.
    (ONE_BLOCK, MAX),
    (ONE_BLOCK, MIN),
], ids=["float-sum", "int-sum", "int-max-one-block", "int-min-one-block"])
def test_check_uninitialized_reads_names_the_rule_the_kernel_and_the_fix(x, kernel):
    with pytest.raises(TpuRuleViolation) as caught:
        check_uninitialized_reads(reducer(initialise=None, **kernel), x)
    violation = caught.value
    assert violation.rule == UNINITIALIZED_READ
    assert "reduce_rows" in violation.kernel
    assert violation.operand == "output"
    message = str(violation)
    assert "depend on what memory held before the kernel ran" in message
    assert "pl.when(pl.program_id(axis) == 0)" in message


@pytest.mark.parametrize("x, kernel, initial", [
    (FLOATS, ADD, 0.0),
    (INTS, ADD, 0),
    (ONE_BLOCK, MAX, np.iinfo(np.int32).min),
    (ONE_BLOCK, MIN, np.iinfo(np.int32).max),
])
def test_check_uninitialized_reads_passes_initialised_accumulators(x, kernel, initial):
    out = check_uninitialized_reads(reducer(initialise=initial, **kernel), x)
    expected = {jnp.add: x.sum(0), jnp.maximum: x.max(0), jnp.minimum: x.min(0)}[kernel["combine"]]
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6)


def test_check_uninitialized_reads_passes_jax_and_reference_kernels():
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
    from jax.experimental.pallas.ops.tpu.matmul import matmul

    from pytest_pallas.reference_kernels.matmul import matmul as reference_matmul
    from pytest_pallas.reference_kernels.reduction import sum_leading_axis
    from pytest_pallas.reference_kernels.softmax import softmax

    key = jax.random.key(0)
    x = jax.random.normal(key, (256, 256), jnp.float32)
    check_uninitialized_reads(functools.partial(matmul, block_shape=(128, 128), block_k=128),
                              x, x)
    q = jax.random.normal(key, (1, 2, 128, 128), jnp.float32)
    check_uninitialized_reads(functools.partial(flash_attention, block_sizes=None), q, q, q)
    check_uninitialized_reads(sum_leading_axis, jax.random.normal(key, (3, 16, 256)))
    check_uninitialized_reads(softmax, x)
    check_uninitialized_reads(reference_matmul, x[:, :200], x[:200])


# --- in a user's test: the failure names the rule, the kernel and the fix ----------------------

USER_TEST = '''
import functools
import jax, jax.numpy as jnp, numpy as np, pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from pytest_pallas import assert_allclose

def kernel(x_ref, o_ref, acc_ref):
    acc_ref[...] += x_ref[...]  # never initialised

    @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
    def _():
        o_ref[...] = acc_ref[...]

def my_sum(x):
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape[1:], x.dtype), grid=(x.shape[0],),
        in_specs=[pl.BlockSpec((None, 8, 128), lambda k: (k, 0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda k: (0, 0)),
        scratch_shapes=[pltpu.VMEM((8, 128), x.dtype)], name="my_sum")(x)

@pytest.mark.pallas
def test_my_sum():
    x = jnp.ones((3, 8, 128), jnp.float32)
    assert_allclose(my_sum(x), np.full((8, 128), 3.0))
'''


NUMPY_COMPARISON = "    np.testing.assert_allclose(np.asarray(my_sum(x)), np.full((8, 128), 3.0))\n"


@pytest.mark.parametrize("interpreter, comparator", [
    ("tpu", "assert_allclose"), ("plain", "assert_allclose"), ("tpu", "numpy")])
def test_a_users_failing_comparison_names_the_rule_and_the_kernel(pytester, interpreter,
                                                                  comparator):
    test = USER_TEST
    if comparator == "numpy":
        test = test.replace("    assert_allclose(my_sum(x), np.full((8, 128), 3.0))\n",
                            NUMPY_COMPARISON)
        assert NUMPY_COMPARISON in test
    pytester.makepyfile(test_user=test)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           f"--pallas-interpret={interpreter}", timeout=240)
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    found = "1024 NaN where the reference is finite" if comparator != "numpy" else (
        "the failure shows NaN")
    assert (f"pallas: {found}. Interpret mode fills memory a kernel has not written with NaN, "
            "so the likely cause is TPU rule [uninitialized-read] in kernel "
            "'my_sum at test_user.py:7': an accumulator read before it is initialised"
            in output), output
    # Said once, not again in the report section. The short summary is left out: on CI
    # (the CI variable set) pytest prints each failure's whole message there again.
    failures = output.split("short test summary info")[0]
    assert failures.count("[uninitialized-read]") == 1, failures
    assert "Fix: initialise each accumulator before its first read" in output


def test_a_failure_without_a_nan_gets_no_uninitialised_read_note(pytester):
    # The traceback quotes the test's source; a comment there that says NaN is not a NaN
    # in the failure.
    pytester.makepyfile(test_user='''
import numpy as np, pytest

@pytest.mark.pallas
def test_doubles():
    """No NaN may appear in the output."""
    np.testing.assert_allclose(np.full(4, 2.5), np.full(4, 2.0))  # NaN would be worse
''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "NaN would be worse" in output  # the source is quoted...
    assert "uninitialized-read" not in output  # ...and raises no false alarm
    assert "reproduce with" in output


def test_a_nan_in_one_of_several_distinct_failures_gets_the_note(pytester):
    pytester.makepyfile(test_user='''
import numpy as np, pytest
from hypothesis import given, strategies as st

@pytest.mark.pallas
@given(st.integers(0, 10))
def test_two_ways_to_fail(n):
    if n == 0:
        raise ValueError("no items")
    np.testing.assert_allclose(np.full(4, np.nan), np.full(4, 2.0))
''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--pallas-profile=thorough")
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "distinct failures" in output, output
    assert "pallas: the failure shows NaN" in output, output
