"""reference_kernels.reduction: sum over the leading axis against the float64 oracle."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pytest_pallas import assert_allclose
from pytest_pallas.reference_kernels import reduction as red

pytestmark = pytest.mark.pallas


def _values(shape, dtype, seed=0):
    values = np.random.default_rng(seed).standard_normal(shape)
    return values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)


def _check(out, x):
    assert out.shape == x.shape[1:] and out.dtype == x.dtype
    assert_allclose(out, red.sum_leading_axis_reference(x), reduction_length=x.shape[0])


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((1, 1, 1), "float32"),
        ((1, 1, 1), "bfloat16"),
        ((5, 24, 200), "float32"),
        ((5, 24, 200), "bfloat16"),
        ((300, 5, 100), "float32"),
        ((640, 8, 128), "bfloat16"),
    ],
)
def test_sum_leading_axis(shape, dtype):
    """Ragged and tile-aligned (r, c), short and long reductions; default blocks."""
    x = _values(shape, dtype, 1)
    _check(jax.jit(red.sum_leading_axis)(x), x)


def test_default_blocks_tile_large_slabs():
    """A slab past the default (256, 512) tile runs on a (3, 2, 1) grid of ragged blocks."""
    x = _values((3, 600, 700), "float32", 2)
    _check(jax.jit(red.sum_leading_axis)(x), x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiled_ragged_in_every_dimension(dtype):
    """r, c and n all ragged: partial edge blocks of (r, c), a short last block of n."""
    x = _values((7, 40, 300), dtype, 3)
    out = jax.jit(lambda a: red.sum_leading_axis_tiled(
        a, block_rows=16, block_cols=128, block_n=3))(x)
    _check(out, x)


@pytest.mark.parametrize("block_n", [4, 64], ids=["75-steps", "5-steps"])
def test_bfloat16_accumulates_in_float32(block_n):
    """300 bfloat16 ones sum to 300: a bfloat16 accumulator would stall at 256 (256 + 1 rounds
    to 256)."""
    x = np.ones((300, 16, 128), ml_dtypes.bfloat16)
    out = jax.jit(lambda a: red.sum_leading_axis_tiled(a, block_n=block_n))(x)
    np.testing.assert_array_equal(np.asarray(out, np.float32), 300.0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_whole_slab(dtype):
    x = _values((4, 24, 200), dtype, 4)
    _check(jax.jit(red.sum_leading_axis_whole_slab)(x), x)


def test_vmap_adds_leading_parallel_grid_axes():
    x = _values((2, 5, 24, 130), "float32", 5)
    expected = red.sum_leading_axis_reference(np.moveaxis(x, 1, 0))
    out = jax.jit(jax.vmap(lambda a: red.sum_leading_axis_tiled(a, block_rows=8, block_n=2)))(x)
    assert_allclose(out, expected, reduction_length=5)
    assert_allclose(jax.jit(jax.vmap(red.sum_leading_axis_whole_slab))(x), expected,
                    reduction_length=5)


# --- block validation: one clear ValueError per rule, raised before any kernel runs ----------


@pytest.mark.parametrize(
    "kwargs, dtype, message",
    [
        ({"block_rows": 12}, "float32",
         (r"block_rows=12 must be a multiple of 8 \(TPU sublane tiling of float32.*"
         r"or cover the full dimension r=40")),
        ({"block_rows": 8}, "bfloat16",
         r"block_rows=8 must be a multiple of 16 \(TPU sublane tiling of bfloat16"),
        ({"block_cols": 100}, "float32",
         r"block_cols=100 must be a multiple of 128 \(TPU lane tiling.*full dimension c=300"),
        ({"block_n": 0}, "float32", r"block_n must be a positive int, got 0"),
        ({"block_rows": -8}, "float32", r"block_rows must be a positive int, got -8"),
    ],
    ids=["block_rows-f32", "block_rows-bf16", "block_cols", "block_n", "negative"],
)
def test_block_validation(kwargs, dtype, message):
    x = np.zeros((3, 40, 300), ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
    with pytest.raises(ValueError, match=message):
        red.sum_leading_axis_tiled(x, **kwargs)


def test_operand_validation():
    with pytest.raises(ValueError, match=r"expected x of shape \(n, r, c\), got shape \(4, 4\)"):
        red.sum_leading_axis(np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"x must be float32 or bfloat16, got int32"):
        red.sum_leading_axis(np.zeros((2, 4, 4), np.int32))


# --- oracle and cost model ------------------------------------------------------------------


def test_reference_is_float64():
    x = np.full((3, 2, 2), 0.1, np.float32)
    assert red.sum_leading_axis_reference(x).dtype == np.float64


def test_cost_reads_input_once_and_writes_output_once():
    cost = red.sum_leading_axis_cost(jax.ShapeDtypeStruct((10, 8, 128), jnp.float32))
    assert (cost.flops, cost.transcendentals, cost.bytes_accessed) == (10240, 0, 11 * 1024 * 4)
