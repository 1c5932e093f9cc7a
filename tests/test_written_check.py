"""The written property's cheaper path: the plain interpreter's NaN-filled result stands in
for the TPU interpreter's only where every buffer's poison there differs from zero."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")


def _kernels(function, *args):
    from pytest_pallas._compat import pallas_call_hooks
    from pytest_pallas.checks import kernel_model

    infos = []
    with pallas_call_hooks.observe_pallas_calls(
            lambda params: infos.append(kernel_model.describe_pallas_call(params))):
        jax.make_jaxpr(function)(*args)
    return infos


def test_a_float_accumulator_takes_the_plain_interpreters_result():
    from seeded_bugs.kernels import sum_uninitialized_accumulator

    from pytest_pallas.checks.kernel_check import poison_differs_from_zero

    x = np.ones((3, 8, 128), np.float32)
    assert poison_differs_from_zero(_kernels(sum_uninitialized_accumulator, x))


def test_an_unsigned_flag_needs_the_tpu_interpreters_nan_run():
    """The plain interpreter fills an unsigned buffer with 0, as the zeroed run does: the
    kernel is right in both, and only the TPU interpreter's NaN-filled run shows the bug."""
    from jax.experimental.pallas import tpu as pltpu
    from seeded_bugs.kernels import sum_started_flag_assumed_zero

    from pytest_pallas.checks.kernel_check import poison_differs_from_zero

    x = np.random.default_rng(0).normal(size=(3, 8, 128)).astype(np.float32)
    assert not poison_differs_from_zero(_kernels(sum_started_flag_assumed_zero, x))
    results = {}
    modes = {"plain": True, "zero": pltpu.InterpretParams(uninitialized_memory="zero"),
             "nan": pltpu.InterpretParams(uninitialized_memory="nan")}
    for name, mode in modes.items():
        with pltpu.force_tpu_interpret_mode(mode):
            results[name] = np.asarray(jax.jit(sum_started_flag_assumed_zero)(x))
    assert np.array_equal(results["plain"], results["zero"])
    assert np.isnan(results["nan"]).all()


@pytest.mark.parametrize("dtype, differs", [
    ("float32", True), ("bfloat16", True), ("int8", True), ("int32", True),
    ("uint8", False), ("uint32", False), ("bool", False), ("float4_e2m1fn", False),
    ("int16", False),
])
def test_which_dtypes_the_plain_interpreter_poisons_away_from_zero(dtype, differs):
    import ml_dtypes

    from pytest_pallas.checks.kernel_check import _plain_poison_is_nonzero

    numpy_dtype = np.dtype(getattr(ml_dtypes, dtype, dtype))
    assert _plain_poison_is_nonzero(numpy_dtype) is differs


def test_two_results_with_different_numbers_of_arrays_differ():
    """Two runs of one kernel that return different numbers of arrays disagree: the
    written check reports it instead of comparing the arrays both have."""
    from pytest_pallas.checks.kernel_check import first_difference, uninitialized_read_violation

    one = (np.zeros(4, np.float32), np.ones(2, np.float32))
    assert first_difference(one, (np.zeros(4, np.float32),))[0] == "the number of output arrays"
    assert first_difference(one, tuple(a.copy() for a in one)) is None
    violation = uninitialized_read_violation("'k'", one, one[:1])
    assert "2 with memory filled with NaN, 1 with memory zeroed" in str(violation)
