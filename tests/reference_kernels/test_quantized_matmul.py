"""reference_kernels.quantized_matmul: int8 weights dequantised in VMEM, per-column scales."""

import jax
import ml_dtypes
import numpy as np
import pytest
from seeded_bugs import new_ops as bugs

from pytest_pallas import assert_allclose, default_tolerance
from pytest_pallas.reference_kernels import quantized_matmul as qm

pytestmark = pytest.mark.pallas


def _operands(m, k, n, dtype, seed=0):
    return qm.quantized_matmul_inputs({"m": m, "k": k, "n": n}, dtype,
                                      np.random.default_rng(seed))


def assert_within_allowance(out, x, w, scale):
    """The comparator's default for the output dtype with reduction length k; and the same
    allowance column by column, each scaled by its own column's largest value.

    The comparator's atol scales with the largest |expected| of the whole output, so with
    scales six orders of magnitude apart it alone would hardly check the small-scale
    columns; every column's error has the same derivation at its own scale.
    """
    expected = qm.quantized_matmul_reference(x, w, scale)
    assert out.shape == expected.shape and out.dtype == x.dtype
    k = x.shape[1]
    assert_allclose(out, expected, reduction_length=k)
    units = default_tolerance(out.dtype, scale=1.0, reduction_length=k)
    bound = units.atol * np.abs(expected).max(axis=0) + units.rtol * np.abs(expected)
    error = np.abs(np.asarray(out, np.float64) - expected)
    off = np.argwhere(error > bound)
    assert not off.size, (
        f"{len(off)} elements beyond their column's tolerance, first at {tuple(off[0])}: "
        f"actual {float(np.asarray(out, np.float64)[tuple(off[0])])}, "
        f"expected {expected[tuple(off[0])]}")


@pytest.mark.parametrize(
    "m, k, n, dtype, blocks",
    [
        pytest.param(1, 1, 1, "float32", {}, id="1x1x1"),
        pytest.param(3, 40, 7, "bfloat16", {}, id="ragged-one-block-bf16"),
        pytest.param(20, 300, 200, "float32", {"block_m": 8, "block_k": 128, "block_n": 128},
                     id="3x3x2-blocks-padded"),
        pytest.param(20, 300, 200, "bfloat16", {"block_m": 16, "block_k": 128, "block_n": 128},
                     id="2x3x2-blocks-padded-bf16"),
        pytest.param(8, 600, 130, "float32", {}, id="default-2-k-blocks"),
    ],
)
def test_quantized_matmul(m, k, n, dtype, blocks):
    x, w, scale = _operands(m, k, n, dtype, seed=m + k + n)
    out = qm.quantized_matmul_blocked(x, w, scale, **blocks)
    assert_within_allowance(out, x, w, scale)


def test_contract_entry_under_jit():
    x, w, scale = _operands(4, 64, 16, "bfloat16", seed=1)
    assert_within_allowance(jax.jit(qm.quantized_matmul)(x, w, scale), x, w, scale)


def test_the_input_builder_covers_int8_and_the_scales():
    x, w, scale = _operands(2, 64, 64, "float32", seed=2)
    assert w.dtype == np.int8 and w.min() == -128 and w.max() == 127
    assert scale.dtype == np.float32 and scale.max() / scale.min() > 1e4


# --- the allowance is tight ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bug, k",
    [
        pytest.param(bugs.quantized_matmul_bfloat16_accumulator, 512, id="bfloat16-accumulator"),
        pytest.param(bugs.quantized_matmul_int8_read_as_uint8, 64, id="int8-read-as-uint8"),
    ],
)
def test_seeded_bugs_fail_and_the_kernel_passes(bug, k):
    x, w, scale = _operands(8, k, 16, "float32", seed=3)
    assert_within_allowance(qm.quantized_matmul(x, w, scale), x, w, scale)
    with pytest.raises(AssertionError, match="Arrays are not close|beyond their column"):
        assert_within_allowance(bug(x, w, scale), x, w, scale)


# --- validation and cost --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtypes, shapes, kwargs, message",
    [
        (("float32", "float32", "float32"), [(4, 8), (8, 3), (3,)], {}, "w must be int8"),
        (("int32", "int8", "float32"), [(4, 8), (8, 3), (3,)], {},
         "x must be float32 or bfloat16"),
        (("float32", "int8", "bfloat16"), [(4, 8), (8, 3), (3,)], {}, "scale must be float32"),
        (("float32", "int8", "float32"), [(4, 8), (8, 3), (4,)], {}, "matching k and n"),
        (("float32", "int8", "float32"), [(4, 300), (300, 3), (3,)], {"block_k": 96},
         "block_k=96 must be a multiple of 128"),
    ],
)
def test_validation(dtypes, shapes, kwargs, message):
    arrays = [np.zeros(shape, dtype) for shape, dtype in zip(shapes, dtypes)]
    if dtypes[2] == "bfloat16":
        arrays[2] = np.zeros(shapes[2], ml_dtypes.bfloat16)
    with pytest.raises(ValueError) as error:
        qm.quantized_matmul_blocked(*arrays, **kwargs)
    assert message in str(error.value)


def test_cost_model_reads_w_as_int8():
    cost = qm.quantized_matmul_cost(jax.ShapeDtypeStruct((8, 256), ml_dtypes.bfloat16),
                                    jax.ShapeDtypeStruct((256, 512), np.int8),
                                    jax.ShapeDtypeStruct((512,), np.float32))
    assert cost.flops == 2 * 8 * 256 * 512 + 8 * 512
    assert cost.bytes_accessed == 2 * (8 * 256 + 8 * 512) + 256 * 512 + 4 * 512
