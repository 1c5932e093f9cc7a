"""reference_kernels.elementwise: add and its variants against the NumPy oracle."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pytest_pallas import assert_allclose
from pytest_pallas.reference_kernels import elementwise as ew

pytestmark = pytest.mark.pallas

INT32 = np.iinfo(np.int32)


def _values(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "int32":
        # The whole int32 range, so that sums overflow and wrap.
        return rng.integers(INT32.min, INT32.max, size=shape, endpoint=True).astype(np.int32)
    values = rng.standard_normal(shape) * 100
    return values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)


def _check(out, x, y):
    assert out.shape == x.shape and out.dtype == x.dtype
    assert_allclose(out, ew.add_reference(x, y))


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((1,), "float32"),
        ((1000,), "int32"),
        ((7, 3, 5), "bfloat16"),
        ((24, 128), "float32"),
        ((2, 20, 300), "int32"),
        ((3, 17, 129), "float32"),
        ((4, 100, 200), "bfloat16"),
    ],
)
def test_add_small_shapes(shape, dtype):
    """Small arrays (one block) of every rank, ragged and tile-aligned sizes."""
    x, y = _values(shape, dtype, 1), _values(shape, dtype, 2)
    _check(jax.jit(ew.add)(x, y), x, y)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_add_large_array_runs_pipelined(dtype):
    """Past one 1 MiB block, add runs add_1d_grid over several blocks (ragged last block)."""
    shape = (700, 1001)
    x, y = _values(shape, dtype, 3), _values(shape, dtype, 4)
    assert ew._vmem_bytes(shape, x.dtype) > ew.DEFAULT_BLOCK_BYTES
    _check(jax.jit(ew.add)(x, y), x, y)


@pytest.mark.parametrize(
    "variant, kwargs, shape, dtype",
    [
        pytest.param(ew.add_whole_array, {}, (5, 200), "float32", id="whole-5x200-f32"),
        pytest.param(ew.add_whole_array, {}, (3, 9, 130), "int32", id="whole-3x9x130-i32"),
        pytest.param(ew.add_1d_grid, {"block_size": 1024}, (3, 1001), "float32",
                     id="1d-3x1001-f32-3blocks"),
        pytest.param(ew.add_1d_grid, {"block_size": 2048}, (3, 1001), "bfloat16",
                     id="1d-3x1001-bf16-2blocks"),
        pytest.param(ew.add_1d_grid, {}, (130,), "int32", id="1d-130-i32-default"),
        pytest.param(ew.add_2d_grid, {"block_rows": 16, "block_cols": 128}, (2, 20, 300),
                     "float32", id="2d-2x20x300-f32-3x3blocks"),
        pytest.param(ew.add_2d_grid, {"block_rows": 16, "block_cols": 256}, (37, 300),
                     "bfloat16", id="2d-37x300-bf16-3x2blocks"),
        pytest.param(ew.add_2d_grid, {}, (37,), "int32", id="2d-37-i32-default"),
    ],
)
def test_variants_multi_block_and_ragged(variant, kwargs, shape, dtype):
    """Each variant with blocks that do not divide the array (several grid steps)."""
    x, y = _values(shape, dtype, 5), _values(shape, dtype, 6)
    _check(jax.jit(lambda a, b: variant(a, b, **kwargs))(x, y), x, y)


@pytest.mark.parametrize(
    "variant",
    [ew.add, ew.add_whole_array,
     lambda x, y: ew.add_1d_grid(x, y, block_size=1024),
     lambda x, y: ew.add_2d_grid(x, y, block_rows=8, block_cols=128)],
    ids=["add", "whole_array", "1d_grid", "2d_grid"],
)
def test_int32_extremes_wrap_like_jnp(variant):
    """int32 overflow wraps around, as jnp and the oracle do."""
    edge = np.array([INT32.max, INT32.min, INT32.max, INT32.min, -1, 0, 1, 12345], np.int32)
    x = np.resize(edge, (10, 130))
    y = np.resize(edge[::-1], (10, 130))
    out = jax.jit(variant)(x, y)
    expected = ew.add_reference(x, y)
    assert expected[0, 0] == INT32.min + 12344  # INT32.max + 12345, wrapped
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jnp.add(x, y)))
    assert_allclose(out, expected)


def test_vmap_adds_leading_parallel_grid_axes():
    """Under jax.vmap (both operands batched, or one broadcast) the kernels batch themselves."""
    x, y = _values((3, 5, 130), "float32", 7), _values((3, 5, 130), "float32", 8)
    _check(jax.jit(jax.vmap(ew.add))(x, y), x, y)
    two_d = jax.vmap(lambda a, b: ew.add_2d_grid(a, b, block_rows=8, block_cols=128),
                     in_axes=(0, None))
    out = jax.jit(two_d)(x, y[0])
    assert_allclose(out, ew.add_reference(x, np.broadcast_to(y[0], x.shape)))


# --- block validation: one clear ValueError per rule, raised before any kernel runs ----------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x, y: ew.add_1d_grid(x, y, block_size=1000),
         r"block_size=1000 must be a multiple of 1024 \(whole \(8, 128\) TPU tiles of float32"),
        (lambda x, y: ew.add_1d_grid(x, y, block_size=0), r"block_size must be a positive int"),
        (lambda x, y: ew.add_2d_grid(x, y, block_rows=12),
         (r"block_rows=12 must be a multiple of 8 \(TPU sublane tiling of float32.*"
         r"or cover the full dimension rows=40")),
        (lambda x, y: ew.add_2d_grid(x, y, block_cols=100),
         r"block_cols=100 must be a multiple of 128 \(TPU lane tiling.*full dimension cols=300"),
        (lambda x, y: ew.add_2d_grid(x, y, block_rows=8.0), r"block_rows must be a positive int"),
    ],
    ids=["block_size-tile", "block_size-positive", "block_rows-sublanes", "block_cols-lanes",
         "block_rows-int"],
)
def test_block_validation_float32(call, message):
    x = np.zeros((40, 300), np.float32)
    with pytest.raises(ValueError, match=message):
        call(x, x)


def test_block_validation_counts_packed_bfloat16_rows():
    x = np.zeros((40, 300), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=r"block_rows=8 must be a multiple of 16 .*bfloat16"):
        ew.add_2d_grid(x, x, block_rows=8)
    with pytest.raises(ValueError, match=r"block_size=1024 must be a multiple of 2048 .*bfloat16"):
        ew.add_1d_grid(x, x, block_size=1024)


def test_blocks_covering_the_array_are_clipped_not_rejected():
    x = _values((5, 100), "float32")
    _check(ew.add_2d_grid(x, x, block_rows=1000, block_cols=1000), x, x)


def test_operand_validation():
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match=r"same shape and dtype"):
        ew.add(x, np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match=r"same shape and dtype"):
        ew.add(x, np.zeros((4, 4), np.int32))
    with pytest.raises(ValueError, match=r"unsupported dtype complex64"):
        ew.add(x.astype(np.complex64), x.astype(np.complex64))


# --- oracle and cost model ------------------------------------------------------------------


def test_reference_is_float64_or_exact_int():
    assert ew.add_reference(np.float32([1.5]), np.float32([2.0])).dtype == np.float64
    wrapped = ew.add_reference(np.int32([INT32.max]), np.int32([1]))
    assert wrapped.dtype == np.int32 and wrapped[0] == INT32.min


def test_cost_counts_one_op_and_three_transfers_per_element():
    cost = ew.add_cost(jax.ShapeDtypeStruct((3, 10, 128), jnp.bfloat16),
                       jax.ShapeDtypeStruct((3, 10, 128), jnp.bfloat16))
    assert (cost.flops, cost.transcendentals, cost.bytes_accessed) == (3840, 0, 3 * 3840 * 2)
