"""reference_kernels.softmax: row softmax against the float64 oracle."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pytest_pallas import assert_allclose
from pytest_pallas.reference_kernels import softmax as sm

pytestmark = pytest.mark.pallas


def _values(shape, dtype, profile="normal", seed=0):
    rng = np.random.default_rng(seed)
    if profile == "normal":
        values = rng.standard_normal(shape)
    elif profile == "large":  # magnitudes up to 1e11: exp would overflow without the max shift
        values = rng.choice([-1.0, 1.0], size=shape) * 10.0 ** rng.uniform(0, 11, size=shape)
    elif profile == "ties":  # few distinct values: the row max occurs several times
        values = rng.integers(-2, 3, size=shape).astype(np.float64)
    elif profile == "neginf":  # -inf entries in rows that also hold finite ones
        values = rng.standard_normal(shape)
        values[rng.random(shape) < 0.4] = -np.inf
        values[:, -1] = rng.standard_normal(shape[0])
    else:
        raise ValueError(profile)
    return values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)


def _check(out, x):
    assert out.shape == x.shape and out.dtype == x.dtype
    assert_allclose(out, sm.softmax_reference(x), reduction_length=x.shape[-1])


@pytest.mark.parametrize(
    "shape, dtype, profile",
    [
        ((1, 1), "float32", "normal"),
        ((5, 100), "float32", "large"),
        ((5, 100), "bfloat16", "large"),
        ((40, 384), "float32", "ties"),
        ((40, 384), "bfloat16", "ties"),
        ((24, 640), "float32", "neginf"),
        ((24, 640), "bfloat16", "neginf"),
    ],
)
def test_softmax(shape, dtype, profile):
    x = _values(shape, dtype, profile, seed=1)
    _check(jax.jit(sm.softmax)(x), x)


def test_neg_inf_entries_give_exact_zeros():
    x = np.array([[0.0, -np.inf, 1.0, -np.inf], [-np.inf, -np.inf, -np.inf, 5.0]], np.float32)
    out = np.asarray(jax.jit(sm.softmax)(x))
    assert (out[np.isneginf(x)] == 0.0).all()
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-6)
    assert out[1, 3] == 1.0


@pytest.mark.parametrize(
    "shape, dtype, block_rows",
    [
        pytest.param((50, 200), "float32", 16, id="f32-4-row-blocks-ragged"),
        pytest.param((50, 200), "bfloat16", 16, id="bf16-4-row-blocks-ragged"),
        pytest.param((1000, 300), "float32", None, id="f32-default-2-row-blocks"),
    ],
)
def test_row_blocked_multi_block(shape, dtype, block_rows):
    """Several row blocks, the last one sticking out of the array."""
    x = _values(shape, dtype, "normal", seed=2)
    out = jax.jit(lambda a: sm.softmax_row_blocked(a, block_rows=block_rows))(x)
    _check(out, x)


def test_vmap_adds_leading_parallel_grid_axes():
    x = _values((3, 20, 130), "float32", "normal", seed=3)
    out = jax.jit(jax.vmap(lambda a: sm.softmax_row_blocked(a, block_rows=8)))(x)
    assert_allclose(out, sm.softmax_reference(x), reduction_length=130)


# --- block validation: one clear ValueError per rule, raised before any kernel runs ----------


@pytest.mark.parametrize(
    "block_rows, dtype, message",
    [
        (12, "float32", (r"block_rows=12 must be a multiple of 8 \(TPU sublane tiling of float32.*"
                        r"or cover the full dimension rows=50")),
        (8, "bfloat16", r"block_rows=8 must be a multiple of 16 \(TPU sublane tiling of bfloat16"),
        (0, "float32", r"block_rows must be a positive int, got 0"),
        (True, "float32", r"block_rows must be a positive int, got True"),
    ],
    ids=["f32-sublanes", "bf16-sublanes", "zero", "bool"],
)
def test_block_validation(block_rows, dtype, message):
    x = np.zeros((50, 200), ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
    with pytest.raises(ValueError, match=message):
        sm.softmax_row_blocked(x, block_rows=block_rows)


def test_operand_validation():
    with pytest.raises(ValueError, match=r"expected x of shape \(rows, cols\), got shape \(4,\)"):
        sm.softmax(np.zeros((4,), np.float32))
    with pytest.raises(ValueError, match=r"x must be float32 or bfloat16, got int32"):
        sm.softmax(np.zeros((2, 4), np.int32))


# --- oracle and cost model ------------------------------------------------------------------


def test_reference_handles_large_values_and_neg_inf():
    x = np.array([[1e30, 1e30, -np.inf]], np.float32)
    np.testing.assert_array_equal(sm.softmax_reference(x), [[0.5, 0.5, 0.0]])


def test_cost_counts_one_exp_per_element():
    cost = sm.softmax_cost(jax.ShapeDtypeStruct((16, 256), jnp.bfloat16))
    assert (cost.flops, cost.transcendentals, cost.bytes_accessed) == (4 * 4096, 4096, 2 * 4096 * 2)
