"""reference_kernels.norms: rms_norm, a row reduction fused with an elementwise scale."""

import jax
import ml_dtypes
import numpy as np
import pytest
from seeded_bugs import new_ops as bugs

from pytest_pallas import assert_allclose
from pytest_pallas.reference_kernels import norms

pytestmark = pytest.mark.pallas

EPS = 1e-6


def _operands(rows, cols, dtype, seed=0):
    rng = np.random.default_rng(seed)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    x = (rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-3, 3, (rows, 1)))
    return x.astype(np_dtype), (1.0 + rng.standard_normal(cols)).astype(np_dtype)


def assert_within_allowance(out, x, w):
    """The comparator's default for the output dtype with reduction length cols (see norms)."""
    expected = norms.rms_norm_reference(x, w, eps=EPS)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert_allclose(out, expected, reduction_length=x.shape[1])


@pytest.mark.parametrize(
    "rows, cols, dtype, block_rows",
    [
        pytest.param(1, 1, "float32", None, id="1x1"),
        pytest.param(5, 300, "bfloat16", None, id="ragged-one-block-bf16"),
        pytest.param(37, 1024, "float32", None, id="ragged-rows-1024-cols"),
        # 40 rows in blocks of 16: the third block runs 8 rows past the end of x.
        pytest.param(40, 130, "float32", 16, id="3-blocks-last-partial"),
        pytest.param(40, 130, "bfloat16", 16, id="3-blocks-last-partial-bf16"),
    ],
)
def test_rms_norm(rows, cols, dtype, block_rows):
    """Rows of magnitudes from 1e-3 to 1e3: the norm must bring each to unit scale."""
    x, w = _operands(rows, cols, dtype, seed=rows + cols)
    out = jax.jit(norms.rms_norm_blocked, static_argnames=("eps", "block_rows"))(
        x, w, eps=EPS, block_rows=block_rows)
    assert_within_allowance(out, x, w)


def test_contract_entry_and_eps():
    """eps dominates rows of tiny values: x / sqrt(eps) rather than x / rms."""
    x = np.full((8, 128), 1e-5, np.float32)
    w = np.ones(128, np.float32)
    out = jax.jit(norms.rms_norm, static_argnames="eps")(x, w, eps=EPS)
    assert_within_allowance(out, x, w)


def test_a_bfloat16_accumulator_fails_and_the_kernel_passes():
    x, w = _operands(16, 1024, "float32", seed=1)
    assert_within_allowance(norms.rms_norm(x, w, eps=EPS), x, w)
    with pytest.raises(AssertionError, match="Arrays are not close"):
        assert_within_allowance(bugs.rms_norm_bfloat16_accumulator(x, w, eps=EPS), x, w)


@pytest.mark.parametrize(
    "x_shape, w_shape, dtype, kwargs, message",
    [
        ((4, 8), (7,), "float32", {}, "rms_norm expects x (rows, cols) and w (cols,)"),
        ((4, 8), (8,), "int32", {}, "x and w must be float32 or bfloat16"),
        ((40, 8), (8,), "float32", {"block_rows": 12},
         "block_rows=12 must be a multiple of 8 (TPU sublane tiling of float32"),
    ],
)
def test_validation(x_shape, w_shape, dtype, kwargs, message):
    x, w = np.zeros(x_shape, dtype), np.zeros(w_shape, dtype)
    with pytest.raises(ValueError) as error:
        norms.rms_norm_blocked(x, w, eps=EPS, **kwargs)
    assert message in str(error.value)


def test_cost_model():
    cost = norms.rms_norm_cost(jax.ShapeDtypeStruct((100, 300), np.float32),
                               jax.ShapeDtypeStruct((300,), np.float32))
    assert cost.flops == 4 * 100 * 300 and cost.transcendentals == 100
    assert cost.bytes_accessed == 4 * (2 * 100 * 300 + 300)
