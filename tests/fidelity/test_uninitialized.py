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

from pytest_pallas import _jax_compat

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
    _jax_compat.reset_interpreter_state()
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
    _jax_compat.reset_interpreter_state()
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
