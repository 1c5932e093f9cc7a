"""Class 1: a race on an output the program throws away is not a bug; on a kept one it is.

JAX's splash attention keeps its running m, l and o in extra outputs with a
constant index map while the head axis is "parallel", and drops them. The
kernel below has that shape: a row-sum per head, with a "scratch" output
whose block (0, 0) every head writes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas.checks.kernel_check import CheckOptions, check_kernel
from pytest_pallas.checks.static_rules import PARALLEL_RACE
from pytest_pallas.checks.violations import TpuRuleViolation

pytestmark = pytest.mark.pallas

STATIC_ONLY = CheckOptions(lower_for_tpu=False)


def _kernel(x_ref, o_ref, scratch_ref):
    scratch_ref[...] = x_ref[...] * 2.0          # running state, in an output
    o_ref[...] = scratch_ref[...] * 0.5


def _call(x):
    heads = x.shape[0]
    return pl.pallas_call(
        _kernel,
        out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                   jax.ShapeDtypeStruct(x.shape[1:], x.dtype)),
        grid=(heads,),
        in_specs=[pl.BlockSpec((None, 8, 128), lambda h: (h, 0, 0))],
        out_specs=(pl.BlockSpec((None, 8, 128), lambda h: (h, 0, 0)),
                   pl.BlockSpec((8, 128), lambda h: (0, 0))),   # every head writes block (0, 0)
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        name="scratch_in_an_output",
    )(x)


def drops_scratch(x):
    out, _ = _call(x)
    return out


def keeps_scratch(x):
    out, scratch = _call(x)
    return out + scratch.sum()


X = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(4, 8, 128) / 1000


def test_dropped_racing_output_passes_when_run():
    np.testing.assert_array_equal(np.asarray(jax.jit(drops_scratch)(X)), np.asarray(X))


def test_dropped_racing_output_passes_check_kernel_and_says_why():
    (report,) = check_kernel(drops_scratch, X, check_options=STATIC_ONLY)
    assert any("never uses this output" in note for note in report.skipped)


def test_kept_racing_output_fails_when_run_and_says_it_is_kept():
    with pytest.raises(TpuRuleViolation) as failure:
        jax.jit(keeps_scratch)(X)
    assert failure.value.rule == PARALLEL_RACE
    assert "uses this output after the call" in str(failure.value)


def test_kept_racing_output_fails_check_kernel():
    with pytest.raises(TpuRuleViolation, match="uses this output after the call"):
        check_kernel(keeps_scratch, X, check_options=STATIC_ONLY)


def test_returned_racing_output_counts_as_kept():
    with pytest.raises(TpuRuleViolation, match=r"parallel-axis-race"):
        check_kernel(functools.partial(_call), X, check_options=STATIC_ONLY)
