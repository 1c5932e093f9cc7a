"""The comparator: its verdicts, its tolerance policy and the exact lines of its messages."""

import ml_dtypes
import numpy as np
import pytest

from pytest_pallas import assert_allclose
from pytest_pallas.compare import compare_arrays, default_tolerance

bfloat16 = ml_dtypes.bfloat16


def message_of(actual, expected, **kwargs):
    with pytest.raises(AssertionError) as info:
        assert_allclose(actual, expected, **kwargs)
    return str(info.value)


def test_all_zeros_never_pass_for_nonzero_expectation():
    expected = np.full((4, 4), 1e-30)
    message = message_of(np.zeros((4, 4), np.float32), expected)
    assert "Mismatched elements: 16 / 16 (100%)" in message


def test_failure_message_names_count_worst_differences_and_tolerance():
    expected = np.array([[1.0, 2.0], [3.0, 4.0]])
    actual = np.array([[1.0, 2.0], [3.5, 4.0]], np.float32)
    lines = message_of(actual, expected).splitlines()
    assert lines[0] == "Arrays are not close: output (float32, shape (2, 2))."
    assert lines[1] == "Mismatched elements: 1 / 4 (25%)"
    assert lines[2] == "Worst absolute difference: 0.5 at index (1, 0): actual 3.5, expected 3"
    assert lines[3] == "Worst relative difference: 0.166667 at index (1, 0): actual 3.5, expected 3"
    assert lines[4].startswith("Tolerance: |actual - expected| <= atol + rtol * |expected| with "
                               "rtol=1.19e-07, atol=")
    assert "float32 output: rtol = 1 ulp" in lines[4]
    assert lines[5].startswith("Worst error: ") and lines[5].endswith(" x tolerance")


def test_nan_and_inf_must_sit_at_the_same_places():
    expected = np.array([1.0, np.nan, np.inf, -np.inf])
    assert_allclose(np.array([1.0, np.nan, np.inf, -np.inf], np.float32), expected)
    message = message_of(np.array([1.0, 2.0, np.inf, -np.inf], np.float32), expected)
    assert "NaN/Inf at different places: 1 elements, first at index (1,): actual 2, expected nan" \
        in message
    assert "NaN/Inf" in message_of(np.array([1.0, np.nan, -np.inf, -np.inf], np.float32), expected)
    assert "NaN/Inf" in message_of(
        np.array([np.nan, np.nan, np.inf, -np.inf], np.float32), expected
    )


def test_integers_are_exact():
    assert_allclose(np.int32([1, 2]), np.int32([1, 2]))
    message = message_of(np.int32([1, 3]), np.int32([1, 2]))
    assert message.splitlines()[0] == (
        "Arrays are not equal: output (int32, shape (2,)) must match exactly."
    )
    assert "First mismatch at index (1,): actual 3, expected 2" in message


def test_exact_floats_compare_bits():
    nan_a = np.array([np.nan], np.float32)
    nan_b = np.frombuffer(np.uint32(0x7FC00001).tobytes(), np.float32)
    assert "must match exactly" in message_of(nan_b, nan_a, exact=True)
    assert "must match exactly" in message_of(np.float32([0.0]), np.float32([-0.0]), exact=True)


def test_shape_and_dtype_mismatches_say_what_was_expected():
    assert message_of(np.zeros((2, 3), np.float32), np.zeros((3, 2))) == \
        "output has shape (2, 3), expected (3, 2)."
    assert message_of(np.zeros(2, np.float32), np.zeros(2), dtype="bfloat16") == \
        "output has dtype float32, expected bfloat16."


def test_pytrees_compare_leaf_by_leaf_with_paths():
    expected = {"a": np.ones(2), "b": np.zeros(2)}
    assert_allclose({"a": np.ones(2, np.float32), "b": np.zeros(2, np.float32)}, expected)
    message = message_of({"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}, expected)
    assert message.startswith("Arrays are not close: output['b'] (float32, shape (2,)).")
    assert message_of((np.ones(2),), [np.ones(2)]).startswith("Structures differ")


def test_returns_worst_error_in_units_of_the_tolerance():
    worst = assert_allclose(np.float32([1.0]), np.array([1.0 + 2.0**-25]))
    assert 0.0 < worst <= 1.0


def _bfloat16_matmul(k, *, accumulate_in):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((32, k)).astype(bfloat16)
    y = rng.standard_normal((k, 32)).astype(bfloat16)
    exact = x.astype(np.float64) @ y.astype(np.float64)
    if accumulate_in == "float32":
        return (x.astype(np.float32) @ y.astype(np.float32)).astype(bfloat16), exact
    acc = np.zeros((32, 32), bfloat16)
    for j in range(k):
        acc = (acc.astype(np.float32)
               + np.outer(x[:, j].astype(np.float32), y[j].astype(np.float32))).astype(bfloat16)
    return acc, exact


@pytest.mark.parametrize("k", [512, 1024])
def test_float32_accumulation_contract_is_not_met_by_bfloat16_accumulation(k):
    good, exact = _bfloat16_matmul(k, accumulate_in="float32")
    assert compare_arrays(good, exact, reduction_length=k).passed
    bad, exact = _bfloat16_matmul(k, accumulate_in="bfloat16")
    assert not compare_arrays(bad, exact, reduction_length=k).passed


def test_tpu_matmul_precision_widens_float32_tolerance():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 256)).astype(np.float32)
    y = rng.standard_normal((256, 32)).astype(np.float32)
    exact = x.astype(np.float64) @ y.astype(np.float64)
    # What a TPU's default-precision float32 dot computes: bfloat16 operands, float32 sums.
    one_pass = x.astype(bfloat16).astype(np.float32) @ y.astype(bfloat16).astype(np.float32)
    assert not compare_arrays(one_pass, exact, reduction_length=256).passed
    assert compare_arrays(one_pass, exact, reduction_length=256,
                          matmul_precision="bfloat16").passed


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float16"])
def test_low_precision_dtypes_round_trip(dtype):
    from pytest_pallas.strategies import as_dtype

    values = np.linspace(-3, 3, 17)
    assert_allclose(
        values.astype(as_dtype(dtype)), values.astype(as_dtype(dtype)).astype(np.float64)
    )


def test_default_tolerance_table_values():
    assert default_tolerance("float32", scale=1.0).rtol == 2.0**-23
    assert default_tolerance("bfloat16", scale=2.0).atol == 2.0**-7 / 4 * 2.0
    widened = default_tolerance("float32", scale=1.0, reduction_length=1024)
    assert widened.atol == pytest.approx(2.0**-23 / 4 + 2.0**-23 * 11)


def test_comparator_frames_are_hidden_from_pytest_output(pytester):
    pytester.makepyfile(
        """
        import numpy as np
        from pytest_pallas import assert_allclose

        def test_it():
            assert_allclose(np.float32([1.0, 5.0]), np.array([1.0, 2.0]))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Mismatched elements: 1 / 2 (50%)*"])
    assert "def compare_arrays" not in result.stdout.str()
    assert "compare.py" not in result.stdout.str()


def test_a_nan_where_the_reference_is_finite_is_explained_only_in_interpret_mode():
    from pytest_pallas.compare import interpreted_kernels

    actual = np.array([1.0, np.nan, np.nan], np.float32)
    expected = np.array([1.0, 2.0, np.nan])
    outside = compare_arrays(actual, expected)
    assert not outside.passed and "uninitialized-read" not in outside.message
    with interpreted_kernels(lambda: ["'acc_kernel'", "'acc_kernel'"]):
        inside = compare_arrays(actual, expected)
        exact = compare_arrays(actual, expected.astype(np.float32), exact=True)
    for message in (inside.message, exact.message):
        assert ("pallas: 1 NaN where the reference is finite" in message
                and "TPU rule [uninitialized-read] in kernel 'acc_kernel':" in message), message


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_plain_xla_activations_pass_and_a_wrong_activation_fails(activation):
    """The conformance suite's matmul_activation tolerance allows for evaluating the activation in
    float32 (a -4 pre-activation made plain XLA's gelu fail it by 1.27x), and no more."""
    import jax

    from pytest_pallas import operations
    from pytest_pallas.ops.inputs import Case
    from pytest_pallas.ops.operation import Deferred
    from pytest_pallas.suite.properties import expected_output, judge_value

    rng = np.random.default_rng(0)
    # Ties-like inputs (small integers, k=1), as in the case that failed, and normal ones.
    for x, y in [(rng.integers(-2, 3, (24, 1)), rng.integers(0, 3, (1, 100))),
                 (rng.normal(size=(40, 128)) * 3, rng.normal(size=(128, 200)))]:
        x, y = x.astype(np.float32), y.astype(np.float32)
        case = Case(operations.matmul_activation,
                    {"m": x.shape[0], "k": x.shape[1], "n": y.shape[1]},
                    "float32", "ties", 0, (x, y), {"activation": Deferred(f"jax.nn:{activation}")})
        expected = expected_output(case)
        z = jax.numpy.dot(x, y, precision="highest")
        xla = np.asarray(getattr(jax.nn, activation)(z))
        verdicts, worst, message = judge_value(case, xla, expected, matmul_precision="float32")
        assert verdicts["value"], message
        other = {"gelu": lambda v: jax.nn.gelu(v, approximate=False), "silu": jax.nn.sigmoid}
        wrong = np.asarray(other[activation](z))
        verdicts, worst, message = judge_value(case, wrong, expected, matmul_precision="float32")
        assert not verdicts["value"] and worst > 2, worst
