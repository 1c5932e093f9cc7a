"""reference_kernels.collectives: ppermute and all_gather by remote DMA on 2, 4 and 8 devices."""

import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from pytest_pallas import assert_allclose, default_tolerance
from pytest_pallas.reference_kernels import collectives

pytestmark = pytest.mark.pallas

INT32 = np.iinfo(np.int32)


@pytest.fixture
def mesh(pallas_backend, device_mesh):
    """``mesh(n)``: a 1-D mesh ``("x",)`` of n devices; skips in the plain interpreter."""
    if pallas_backend.interpreter == "plain":
        pytest.skip("remote DMAs and semaphores need TPU interpret mode (--pallas-interpret=tpu)")
    return device_mesh


def _blocks(n, shape, dtype, seed=0):
    """n per-device blocks: distinct values, the whole int32 range, NaN payloads among floats."""
    rng = np.random.default_rng(seed)
    if dtype == "int32":
        return rng.integers(INT32.min, INT32.max, size=(n, *shape), endpoint=True).astype(np.int32)
    blocks = rng.standard_normal((n, *shape)).astype(np.float32)
    if dtype == "bfloat16":
        return blocks.astype(ml_dtypes.bfloat16)
    bits = blocks.view(np.uint32)
    bits.flat[::5] = 0x7FC00000 + np.arange(bits.size)[::5] % 977  # NaN payloads, exactly
    return blocks


def _run(op, mesh, blocks, **kwargs):
    """``op`` inside shard_map over ``mesh``: device i gets ``blocks[i]``; returns the
    per-device outputs."""
    n = len(blocks)
    body = functools.partial(op, axis_name="x", **kwargs)
    global_array = jnp.asarray(np.concatenate(list(blocks)))
    out = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(global_array)
    out = np.asarray(out)
    return out.reshape(n, out.shape[0] // n, *out.shape[1:])


def _assert_bits_equal(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    unsigned = np.dtype(f"u{actual.dtype.itemsize}")
    assert np.array_equal(actual.view(unsigned), expected.view(unsigned)), "not bit for bit"
    assert_allclose(actual, expected, exact=True)


# --- ppermute -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [1, -1])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ppermute_both_directions(mesh, n, shift):
    """A ragged float32 block (NaN payloads included) moves one device right or left."""
    blocks = _blocks(n, (5, 7), "float32", seed=n)
    _assert_bits_equal(_run(collectives.ppermute, mesh(n), blocks, shift=shift),
                       collectives.ppermute_reference(blocks, shift))


@pytest.mark.parametrize(
    "shape, dtype, shift",
    [
        pytest.param((16, 128), "bfloat16", 1, id="16x128-bf16-right"),
        pytest.param((1, 1), "int32", -1, id="1x1-i32-left"),
        pytest.param((3, 130), "int32", 3, id="3x130-i32-by-3"),
        pytest.param((2, 3), "float32", -5, id="2x3-f32-by-minus-5"),
        pytest.param((2, 3), "float32", 4, id="2x3-f32-by-n-stays"),
        pytest.param((2, 3), "int32", 0, id="2x3-i32-by-0-stays"),
    ],
)
def test_ppermute_dtypes_and_shifts(mesh, shape, dtype, shift):
    """On 4 devices: every dtype, and shifts reduced modulo n (a multiple of n copies locally)."""
    blocks = _blocks(4, shape, dtype, seed=1)
    _assert_bits_equal(_run(collectives.ppermute, mesh(4), blocks, shift=shift),
                       collectives.ppermute_reference(blocks, shift))


def test_ppermute_matches_lax_ppermute(mesh):
    n = 4
    blocks = _blocks(n, (3, 5), "int32", seed=2)
    pairs = [(j, (j + 1) % n) for j in range(n)]
    expected = _run(lambda x, axis_name: jax.lax.ppermute(x, axis_name, pairs), mesh(n), blocks)
    _assert_bits_equal(_run(collectives.ppermute, mesh(n), blocks, shift=1), expected)


def test_ppermute_under_vmap(mesh):
    """A batched block is sent whole."""
    n = 2
    blocks = _blocks(n, (3, 4, 5), "float32", seed=3)
    vmapped = lambda x, axis_name: jax.vmap(
        functools.partial(collectives.ppermute, axis_name=axis_name, shift=-1))(x)
    _assert_bits_equal(_run(vmapped, mesh(n), blocks), collectives.ppermute_reference(blocks, -1))


# --- all_gather -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_gather(mesh, n):
    """n - 1 ring steps: every device ends with every block, in mesh order."""
    blocks = _blocks(n, (5, 7), "float32", seed=10 + n)
    expected = np.stack([collectives.all_gather_reference(blocks)] * n)
    _assert_bits_equal(_run(collectives.all_gather, mesh(n), blocks), expected)


@pytest.mark.parametrize("dtype", ["bfloat16", "int32"])
def test_all_gather_dtypes(mesh, dtype):
    blocks = _blocks(4, (3, 130), dtype, seed=20)
    expected = np.stack([collectives.all_gather_reference(blocks)] * 4)
    _assert_bits_equal(_run(collectives.all_gather, mesh(4), blocks), expected)


def test_all_gather_matches_lax_and_vmap(mesh):
    """Same as lax.all_gather(tiled=True); under vmap each batch element gathers its own rows."""
    n = 2
    blocks = _blocks(n, (2, 3, 4), "int32", seed=30)
    gather = lambda x, axis_name: jax.vmap(
        functools.partial(collectives.all_gather, axis_name=axis_name))(x)
    lax_gather = lambda x, axis_name: jax.vmap(
        lambda b: jax.lax.all_gather(b, axis_name, tiled=True))(x)
    _assert_bits_equal(_run(gather, mesh(n), blocks), _run(lax_gather, mesh(n), blocks))


def test_all_gather_single_device(mesh):
    blocks = _blocks(1, (3, 4), "float32", seed=40)
    _assert_bits_equal(_run(collectives.all_gather, mesh(1), blocks), blocks)


def test_all_gather_with_one_receive_semaphore_fails(mesh):
    """JAX's shipped ring shares one receive semaphore across steps: on 8 devices the TPU
    interpreter, completing DMAs out of order, leaves slots unwritten (NaN-poisoned)."""
    from seeded_bugs import new_ops

    blocks = _blocks(8, (5, 7), "float32", seed=90)
    expected = np.stack([collectives.all_gather_reference(blocks)] * 8)
    _assert_bits_equal(_run(collectives.all_gather, mesh(8), blocks), expected)
    with pytest.raises(AssertionError):
        _assert_bits_equal(_run(new_ops.all_gather_one_receive_semaphore, mesh(8), blocks),
                           expected)


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        pytest.param(lambda: collectives.ppermute(jnp.zeros((2, 3)), axis_name="x", shift=1),
                     "ppermute must be called inside jax.shard_map over a mesh with axis 'x'",
                     id="outside-shard-map"),
        pytest.param(lambda: collectives.all_gather(jnp.zeros((2, 3)), axis_name="x"),
                     "all_gather must be called inside jax.shard_map", id="gather-outside"),
        pytest.param(lambda: collectives.ppermute(jnp.zeros(()), axis_name="x", shift=1),
                     "ppermute: x must have rank >= 1", id="scalar"),
        pytest.param(lambda: collectives.all_gather(jnp.zeros((0, 3)), axis_name="x"),
                     "all_gather: x must have sizes >= 1", id="empty"),
    ],
)
def test_validation(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("shift", [1.0, True, "1"])
def test_shift_must_be_an_int(shift):
    with pytest.raises(TypeError,
                       match=re.escape(f"ppermute: shift must be an int, got {shift!r}")):
        collectives.ppermute(jnp.zeros((2, 3)), axis_name="x", shift=shift)


def test_wrong_axis_name_inside_shard_map(mesh):
    body = functools.partial(collectives.ppermute, axis_name="y", shift=1)
    run = jax.shard_map(body, mesh=mesh(2), in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(ValueError, match="over a mesh with axis 'y'"):
        jax.jit(run)(jnp.zeros((4, 3)))


# --- oracles and cost models ----------------------------------------------------------------------


def test_oracles():
    blocks = np.arange(8, dtype=np.int32).reshape(4, 2)
    np.testing.assert_array_equal(collectives.ppermute_reference(blocks, 1),
                                  np.roll(blocks, 1, axis=0))
    np.testing.assert_array_equal(collectives.ppermute_reference(list(blocks), -5),
                                  np.roll(blocks, -1, axis=0))
    assert collectives.ppermute_reference(blocks, 1).dtype == np.int32
    np.testing.assert_array_equal(collectives.all_gather_reference(blocks), blocks.reshape(-1))


def test_cost_models():
    block = jax.ShapeDtypeStruct((16, 128), jnp.bfloat16)
    nbytes = 16 * 128 * 2
    cost = collectives.ppermute_cost(block, num_devices=8, shift=-1)
    assert (cost.flops, cost.bytes_accessed, cost.remote_bytes_transferred) == (0, 2 * nbytes,
                                                                                nbytes)
    assert collectives.ppermute_cost(block, num_devices=4, shift=8).remote_bytes_transferred == 0
    cost = collectives.all_gather_cost(block, num_devices=8)
    assert cost.remote_bytes_transferred == 7 * nbytes
    assert cost.bytes_accessed == 2 * 8 * nbytes


# --- reduce_scatter ------------------------------------------------------------------------------


def _assert_reduce_scatter_close(out, blocks):
    """Integers exact; floats within the default for reduction length n plus the derived
    ring allowance (``reduce_scatter_error_allowance``)."""
    expected = collectives.reduce_scatter_reference(blocks)
    assert out.shape == expected.shape and out.dtype == blocks.dtype
    if np.issubdtype(out.dtype, np.integer):
        _assert_bits_equal(out, expected)
        return
    n = len(blocks)
    default = default_tolerance(out.dtype, scale=float(np.abs(expected).max()),
                                reduction_length=n)
    assert_allclose(out, expected, reduction_length=n,
                    atol=default.atol + collectives.reduce_scatter_error_allowance(blocks))


def _reduce_blocks(n, shape, dtype, seed):
    """n per-device x of ``(n * rows, cols)``: normal floats, or int32 over its whole range."""
    rng = np.random.default_rng(seed)
    rows, cols = shape
    if dtype == "int32":
        return rng.integers(INT32.min, INT32.max, size=(n, n * rows, cols),
                            endpoint=True).astype(np.int32)
    values = rng.standard_normal((n, n * rows, cols)).astype(np.float32)
    return values.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else values


@pytest.mark.parametrize("n", [2, 4, 8])
def test_reduce_scatter(mesh, n):
    """n - 1 ring steps: device i ends with block i of the sum."""
    blocks = _reduce_blocks(n, (5, 7), "float32", seed=50 + n)
    _assert_reduce_scatter_close(_run(collectives.reduce_scatter, mesh(n), blocks), blocks)


@pytest.mark.parametrize("dtype", ["bfloat16", "int32"])
def test_reduce_scatter_dtypes(mesh, dtype):
    """bfloat16 summed in float32; int32 over its whole range wraps as jnp does."""
    blocks = _reduce_blocks(4, (3, 130), dtype, seed=60)
    _assert_reduce_scatter_close(_run(collectives.reduce_scatter, mesh(4), blocks), blocks)


def test_reduce_scatter_matches_lax_and_vmap(mesh):
    n = 2
    # Per device: a batch of 3 arrays of (n * 2, 3).
    blocks = _reduce_blocks(n, (2, 9), "int32", seed=70).reshape(n, n * 2, 3, 3).swapaxes(1, 2)
    scatter = lambda x, axis_name: jax.vmap(
        functools.partial(collectives.reduce_scatter, axis_name=axis_name))(x)
    lax_scatter = lambda x, axis_name: jax.vmap(
        lambda b: jax.lax.psum_scatter(b, axis_name, tiled=True))(x)
    _assert_bits_equal(_run(scatter, mesh(n), blocks), _run(lax_scatter, mesh(n), blocks))


def test_reduce_scatter_rejects_rows_not_divisible(mesh):
    with pytest.raises(ValueError, match="x has 3 rows, not a multiple of the 2 devices"):
        _run(collectives.reduce_scatter, mesh(2), np.zeros((2, 3, 4), np.float32))


@pytest.mark.parametrize(
    "bug",
    [
        pytest.param("reduce_scatter_bfloat16_partial_sums", id="bfloat16-partial-sums"),
        pytest.param("reduce_scatter_keeps_the_next_block", id="keeps-the-next-block"),
    ],
)
def test_reduce_scatter_seeded_bugs_fail_the_allowance(mesh, bug):
    """float32 on 4 devices: the allowance (u32 per hop) passes the kernel, fails the bugs."""
    from seeded_bugs import new_ops

    blocks = _reduce_blocks(4, (4, 128), "float32", seed=80)
    _assert_reduce_scatter_close(_run(collectives.reduce_scatter, mesh(4), blocks), blocks)
    with pytest.raises(AssertionError, match="Arrays are not close"):
        _assert_reduce_scatter_close(_run(getattr(new_ops, bug), mesh(4), blocks), blocks)


def test_reduce_scatter_cost_model():
    cost = collectives.reduce_scatter_cost(jax.ShapeDtypeStruct((8 * 4, 128), ml_dtypes.bfloat16),
                                           num_devices=8)
    assert cost.flops == 7 * 4 * 128
    assert cost.bytes_accessed == 2 * (8 * 4 * 128 + 4 * 128)
    assert cost.remote_bytes_transferred == 7 * 4 * 128 * 4  # float32 partial sums
