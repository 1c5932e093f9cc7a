"""reference_kernels.dma: DMA copies, scalar prefetch, in-place aliasing and refs, against
their oracles."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pytest_pallas import assert_allclose
from pytest_pallas.checks.compile_check import libtpu_version
from pytest_pallas.reference_kernels import dma

# With libtpu installed the plugin compiles each kernel for the TPU (--pallas-compile).
_LIBTPU = libtpu_version() is not None
# libtpu 0.0.50 (jax 0.12's) compiles what 0.0.42 rejects; the compiler is the judge.
_LIBTPU_BEFORE_0_0_50 = _LIBTPU and tuple(
    int(part) for part in libtpu_version().split(".") if part.isdigit()) < (0, 0, 50)

pytestmark = pytest.mark.pallas

INT32 = np.iinfo(np.int32)
_NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "int32": np.int32}


def _values(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "int32":
        return rng.integers(INT32.min, INT32.max, size=shape, endpoint=True).astype(np.int32)
    return (rng.standard_normal(shape) * 100).astype(_NUMPY_DTYPES[dtype])


def _special_values(shape, dtype):
    """Values a copy must not touch: NaN payloads (quiet, signalling, negative), -0, inf,
    subnormals.

    Built from bit patterns, so that nothing on the way rounds or quiets them.
    """
    if dtype == "int32":
        pattern = np.array([INT32.min, INT32.max, 0, -1, 1, INT32.min + 1, INT32.max - 1], np.int32)
        view = np.int32
    elif dtype == "float32":
        pattern = np.array([0x7FC00000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0x7FBFFFFF,
                            0x80000000, 0x00000001, 0x7F800000, 0xFF800000, 0x3F800000],
                           np.uint32)
        view = np.float32
    else:
        pattern = np.array([0x7FC1, 0xFFC0, 0x7F81, 0x7FFF, 0x8000, 0x0001, 0x7F80, 0xFF80,
                            0x3F80], np.uint16)
        view = ml_dtypes.bfloat16
    size = int(np.prod(shape))
    return np.resize(pattern, size).reshape(shape).view(view)


def _assert_bits_equal(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    unsigned = np.dtype(f"u{actual.dtype.itemsize}")
    assert np.array_equal(actual.view(unsigned), expected.view(unsigned)), "not bit for bit"
    assert_allclose(actual, expected, exact=True)


# --- copy --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("shape", [(1, 1), (8, 128), (37, 5), (100, 130)], ids=str)
def test_copy_small_shapes(shape, dtype):
    """One chunk: tile-aligned, tiny and ragged shapes."""
    x = _values(shape, dtype, 1)
    _assert_bits_equal(jax.jit(dma.copy)(x), dma.copy_reference(x))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_copy_large_array_runs_in_chunks(dtype):
    """Past one 2 MiB staging buffer, copy loops over chunks, the last one ragged."""
    shape = (9001, 130) if dtype == "bfloat16" else (4501, 130)
    x = _values(shape, dtype, 2)
    assert shape[0] * 256 * np.dtype(_NUMPY_DTYPES[dtype]).itemsize > dma.COPY_CHUNK_BYTES
    _assert_bits_equal(jax.jit(dma.copy)(x), dma.copy_reference(x))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_copy_is_bit_exact_on_special_values(dtype):
    """int32 extremes, NaN payloads, signalling NaNs, -0.0, infinities and subnormals survive."""
    x = _special_values((19, 7), dtype)
    _assert_bits_equal(jax.jit(dma.copy)(x), dma.copy_reference(x))


@pytest.mark.parametrize(
    "kernel, dtype",
    [
        pytest.param(dma.copy, "float32", id="copy"),
        # 10 rows: a block equal to the full dimension, not a multiple of 16, which
        # must become legal again once the batch is folded into 30 rows.
        pytest.param(lambda a: dma.double_buffered_copy(a, block_rows=10), "bfloat16",
                     id="double-buffered-full-dim-block",
                     # Known defect: libtpu 0.0.42's compiler rejects the 10-row VMEM slice
                     # ("Slice sizes along tiled dimensions must be aligned to tiles");
                     # libtpu 0.0.50's accepts it.
                     marks=pytest.mark.xfail(
                         _LIBTPU_BEFORE_0_0_50, strict=True,
                         reason="the TPU compile check rejects this kernel (docs/hardware.md)")),
    ],
)
def test_copy_under_vmap(kernel, dtype):
    """A batch of arrays is copied as one taller array (the batch folded into rows)."""
    x = _values((3, 10, 7), dtype, 3)
    _assert_bits_equal(jax.jit(jax.vmap(kernel))(x), x)


def test_add_one_in_place_under_vmap():
    x = _values((2, 9, 5), "int32", 4)
    out = jax.jit(jax.vmap(lambda a: dma.add_one_in_place(a, block_rows=9)))(x)
    assert_allclose(out, dma.add_one_in_place_reference(x))


# --- double-buffered copy ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, dtype, block_rows",
    [
        pytest.param((8, 128), "float32", 8, id="8x128-f32-1block"),
        pytest.param((16, 3), "int32", 8, id="16x3-i32-2blocks"),
        pytest.param((37, 5), "float32", 8, id="37x5-f32-5blocks-ragged"),
        pytest.param((50, 130), "bfloat16", 16, id="50x130-bf16-4blocks-ragged"),
        pytest.param((20, 7), "int32", None, id="20x7-i32-default"),
    ],
)
def test_double_buffered_copy(shape, dtype, block_rows):
    """Odd and even block counts exercise both slots, the prefetch and the two-DMA drain."""
    x = _values(shape, dtype, 4)
    out = jax.jit(lambda a: dma.double_buffered_copy(a, block_rows=block_rows))(x)
    _assert_bits_equal(out, dma.double_buffered_copy_reference(x))


def test_double_buffered_copy_special_values():
    x = _special_values((29, 9), "float32")
    _assert_bits_equal(dma.double_buffered_copy(x, block_rows=8), x)


# --- gather_rows ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, dtype, block_cols",
    [
        pytest.param((8, 128), "float32", None, id="8x128-f32"),
        pytest.param((5, 300), "bfloat16", 128, id="5x300-bf16-3colblocks-ragged"),
        pytest.param((4, 1), "int32", None, id="4x1-i32"),
    ],
)
def test_gather_rows(shape, dtype, block_cols):
    """Repeated, reversed and out-of-range (clipped) indices."""
    x = _values(shape, dtype, 5)
    indices = np.array([3, 0, 0, 100, -4, 1], np.int32)
    out = jax.jit(lambda a, i: dma.gather_rows(a, i, block_cols=block_cols))(x, indices)
    _assert_bits_equal(out, dma.gather_rows_reference(x, indices))


def test_gather_rows_uses_scalar_prefetch():
    """The indices reach the kernel as a scalar-prefetch (SMEM) operand."""
    x = _values((4, 128), "float32")
    jaxpr = jax.make_jaxpr(lambda a, i: dma.gather_rows(a, i))(x, np.array([1, 2], np.int32))
    (call,) = [eqn for eqn in _all_eqns(jaxpr.jaxpr) if eqn.primitive.name == "pallas_call"]
    assert call.params["grid_mapping"].num_index_operands == 1


# --- add_one_in_place --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, dtype, block_rows",
    [
        pytest.param((8, 128), "float32", None, id="8x128-f32"),
        pytest.param((37, 300), "int32", 8, id="37x300-i32-5blocks-ragged"),
        pytest.param((40, 5), "bfloat16", 16, id="40x5-bf16-3blocks-ragged"),
    ],
)
def test_add_one_in_place(shape, dtype, block_rows):
    x = _values(shape, dtype, 6)
    out = jax.jit(lambda a: dma.add_one_in_place(a, block_rows=block_rows))(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert_allclose(out, dma.add_one_in_place_reference(x))


def test_add_one_in_place_wraps_int32_and_reuses_the_buffer():
    """INT32_MAX + 1 wraps to INT32_MIN; the output aliases input 0, also when donated."""
    x = _special_values((9, 3), "int32")
    expected = dma.add_one_in_place_reference(x)
    assert expected.min() == INT32.min
    jaxpr = jax.make_jaxpr(dma.add_one_in_place)(x)
    (call,) = [eqn for eqn in _all_eqns(jaxpr.jaxpr) if eqn.primitive.name == "pallas_call"]
    assert call.params["input_output_aliases"] == ((0, 0),)
    donated = jax.jit(dma.add_one_in_place, donate_argnums=0)(jnp.asarray(x))
    assert_allclose(donated, expected)


# --- add_refs_style ------------------------------------------------------------------------------


@pytest.fixture
def tpu_interpreter(pallas_backend):
    if pallas_backend.interpreter == "plain":
        pytest.skip("needs TPU interpret mode: the plain interpreter drops writes to refs "
                    "passed to pl.kernel (jax 0.10)")
    return pallas_backend


@pytest.mark.parametrize(
    "shape, dtype, block_rows",
    [
        pytest.param((8, 128), "float32", None, id="8x128-f32"),
        pytest.param((37, 5), "bfloat16", None, id="37x5-bf16-1block"),
        pytest.param((37, 130), "int32", 8, id="37x130-i32-5blocks-padded"),
    ],
)
def test_add_refs_style(tpu_interpreter, shape, dtype, block_rows):
    x, y = _values(shape, dtype, 7), _values(shape, dtype, 8)
    out = jax.jit(lambda a, b: dma.add_refs_style(a, b, block_rows=block_rows))(x, y)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert_allclose(out, dma.add_refs_style_reference(x, y))


# --- block validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        pytest.param(lambda: dma.double_buffered_copy(np.zeros((100, 128), np.float32),
                                                       block_rows=12),
                     "block_rows=12 must be a multiple of 8 (TPU sublane tiling of float32) "
                     "or equal the full dimension rows=100", id="f32-rows-12"),
        pytest.param(lambda: dma.double_buffered_copy(np.zeros((100, 128), ml_dtypes.bfloat16),
                                                       block_rows=8),
                     "block_rows=8 must be a multiple of 16 (TPU sublane tiling of bfloat16)",
                     id="bf16-rows-8"),
        pytest.param(lambda: dma.add_one_in_place(np.zeros((100, 128), np.int32), block_rows=0),
                     "block_rows must be a positive int, got 0", id="rows-0"),
        pytest.param(lambda: dma.add_refs_style(np.zeros((9, 4), np.float32),
                                                np.zeros((9, 4), np.float32), block_rows=4),
                     "block_rows=4 must be a multiple of 8", id="refs-rows-4"),
        pytest.param(lambda: dma.gather_rows(np.zeros((4, 300), np.float32), np.zeros(2, np.int32),
                                             block_cols=100),
                     "block_cols=100 must be a multiple of 128 (TPU lane tiling",
                     id="gather-cols-100"),
    ],
)
def test_block_validation(call, message):
    with pytest.raises(ValueError, match=_literal(message)):
        call()


@pytest.mark.parametrize(
    "call, message",
    [
        pytest.param(lambda: dma.copy(np.zeros((2, 3, 4), np.float32)), "x must have rank 2",
                     id="rank"),
        pytest.param(lambda: dma.copy(np.zeros((2, 3), np.float16)),
                     "x must be float32, bfloat16 or int32", id="dtype"),
        pytest.param(lambda: dma.copy(np.zeros((0, 3), np.float32)), "sizes >= 1", id="empty"),
        pytest.param(lambda: dma.gather_rows(np.zeros((4, 3), np.float32), np.zeros((2, 2), int)),
                     "indices must be a 1-D integer array", id="indices"),
        pytest.param(lambda: dma.add_refs_style(np.zeros((4, 3), np.float32),
                                                np.zeros((4, 3), np.int32)),
                     "x and y must have the same shape and dtype", id="refs-mismatch"),
    ],
)
def test_operand_validation(call, message):
    with pytest.raises(ValueError, match=_literal(message)):
        call()


def test_block_equal_to_full_dimension_is_legal():
    """A block equal to the whole dimension needs no tiling multiple."""
    x = _values((10, 3), "bfloat16", 9)
    _assert_bits_equal(dma.double_buffered_copy(x, block_rows=10), x)


# --- cost models ----------------------------------------------------------------------------------


def test_cost_models():
    x = jax.ShapeDtypeStruct((100, 130), jnp.bfloat16)
    nbytes = 100 * 130 * 2
    assert dma.copy_cost(x) == dma.double_buffered_copy_cost(x)
    assert (dma.copy_cost(x).flops, dma.copy_cost(x).bytes_accessed) == (0, 2 * nbytes)
    assert dma.add_one_in_place_cost(x).flops == 100 * 130
    assert dma.add_refs_style_cost(x, x).bytes_accessed == 3 * nbytes
    gather = dma.gather_rows_cost(x, jax.ShapeDtypeStruct((7,), jnp.int32))
    assert gather.bytes_accessed == 2 * 7 * 130 * 2 + 7 * 4


def test_oracles():
    x = _special_values((3, 4), "float32")
    _assert_bits_equal(dma.copy_reference(x), x)
    np.testing.assert_array_equal(
        dma.gather_rows_reference(np.arange(6).reshape(3, 2), np.array([5, -1, 1])),
        [[4, 5], [0, 1], [2, 3]])
    ints = np.array([[INT32.max, -1]], np.int32)
    np.testing.assert_array_equal(dma.add_one_in_place_reference(ints), [[INT32.min, 0]])
    floats = np.array([[1.5]], ml_dtypes.bfloat16)
    assert dma.add_refs_style_reference(floats, floats).dtype == np.float64


# --- helpers --------------------------------------------------------------------------------------


def _literal(message):
    return re.escape(message)


def _all_eqns(jaxpr):
    """Every equation of a jaxpr and of the jaxprs nested in its equations (jit, custom_vmap)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield from _all_eqns(inner)
