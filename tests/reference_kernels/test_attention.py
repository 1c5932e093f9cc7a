"""reference_kernels.attention: flash attention, mha, mqa and the shard_map'd mha."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pytest_pallas import assert_allclose, default_tolerance
from pytest_pallas.reference_kernels import attention as at

pytestmark = pytest.mark.pallas


def _values(shape, dtype, seed):
    values = np.random.default_rng(seed).standard_normal(shape)
    return values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)


def _qkv(q_shape, kv_shape, dtype, seed=0):
    return (_values(q_shape, dtype, seed), _values(kv_shape, dtype, seed + 1),
            _values(kv_shape, dtype, seed + 2))


def _assert_attention_close(out, expected, q, k, v):
    """The comparator's default tolerance, plus what float32 logits carry.

    Each logit q.k is a d-term float32 sum, rounded by up to about
    eps * sum|q_i k_i|; the softmax turns that absolute logit error into a
    relative error of the weights, so of up to max|v| in the output. The
    default policy (output ulp plus a t-term accumulation) does not see it:
    plain XLA attention in float32 misses it by 3x at d=128.
    """
    q64, k64 = np.abs(np.asarray(q, np.float64)), np.abs(np.asarray(k, np.float64))
    if q64.ndim > k64.ndim:  # mqa: k and v shared by the heads
        k64 = k64[:, None]
    logit_magnitude = np.einsum("...sd,...td->...st", q64, k64).max()
    logit_error = (
        np.finfo(np.float32).eps * logit_magnitude * np.abs(np.asarray(v, np.float64)).max()
    )
    t = k.shape[-2]
    default = default_tolerance(out.dtype, scale=float(np.abs(expected).max()), reduction_length=t)
    assert_allclose(out, expected, reduction_length=t, atol=default.atol + logit_error)


def _check(out, expected, q, k, v):
    assert out.shape == expected.shape and out.dtype == q.dtype
    _assert_attention_close(out, expected, q, k, v)


@pytest.mark.parametrize(
    "s, t, d, dtype",
    [
        pytest.param(1, 1, 1, "float32", id="1x1x1"),
        pytest.param(5, 3, 8, "bfloat16", id="s-gt-t-bf16"),
        pytest.param(100, 300, 40, "float32", id="ragged-one-block"),
        pytest.param(100, 300, 40, "bfloat16", id="ragged-one-block-bf16"),
        # s=300 and t=700 exceed the defaults: 2 q blocks of 152 rows, 2 kv
        # blocks of 384 (the last one masked from column 700 on).
        pytest.param(300, 700, 64, "bfloat16", id="default-2x2-blocks-masked-bf16"),
    ],
)
def test_attention(s, t, d, dtype):
    q, k, v = _qkv((s, d), (t, d), dtype)
    _check(jax.jit(at.attention)(q, k, v), at.attention_reference(q, k, v), q, k, v)


@pytest.mark.parametrize(
    "dtype, block_q, block_kv",
    [
        pytest.param("float32", 32, 128, id="f32-4x3-grid-masked"),
        pytest.param("bfloat16", 32, 128, id="bf16-4x3-grid-masked"),
        pytest.param("float32", 100, 300, id="f32-blocks-equal-full-dims"),
    ],
)
def test_flash_attention_multi_block(dtype, block_q, block_kv):
    """Ragged s and t over several q and kv blocks: the online softmax's rescaling at work."""
    q, k, v = _qkv((100, 40), (300, 40), dtype, seed=3)
    out = at.flash_attention(q, k, v, block_q=block_q, block_kv=block_kv)
    _check(out, at.attention_reference(q, k, v), q, k, v)


def test_padded_kv_positions_get_no_weight():
    """All real logits are negative, so an unmasked zero-padded key (logit 0) would dominate."""
    q = np.full((16, 8), 2.0, np.float32)
    k = np.full((130, 8), -1.0, np.float32)  # t=130: 126 padded columns in the second kv block
    v = _values((130, 8), "float32", 4)
    out = at.flash_attention(q, k, v, block_q=16, block_kv=128)
    _check(out, at.attention_reference(q, k, v), q, k, v)


def test_growing_logits_rescale_without_overflow():
    """Logits up to 224 (exp overflows float32 beyond 88), larger in each later kv block.

    Integer q and k make the logits exact in float32, so only the softmax is judged.
    """
    q = np.repeat(np.arange(1.0, 5.0), 4)[:, None].repeat(8, axis=1).astype(np.float32)
    k = (np.arange(256) // 32)[:, None].repeat(8, axis=1).astype(np.float32)
    v = _values((256, 8), "float32", 5)
    out = np.asarray(at.flash_attention(q, k, v, block_q=16, block_kv=128))
    assert np.isfinite(out).all()
    _assert_attention_close(out, at.attention_reference(q, k, v), q, k, v)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mha(dtype):
    q, k, v = _qkv((2, 3, 20, 16), (2, 3, 30, 16), dtype, seed=6)
    _check(jax.jit(at.mha)(q, k, v), at.mha_reference(q, k, v), q, k, v)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mqa(dtype):
    q = _values((2, 3, 20, 16), dtype, 7)
    k, v = _values((2, 30, 16), dtype, 8), _values((2, 30, 16), dtype, 9)
    _check(jax.jit(at.mqa)(q, k, v), at.mqa_reference(q, k, v), q, k, v)


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_sharded_mha(devices):
    """The batch split over a 1-D mesh; on 2 devices b=3 is padded to a multiple of the mesh."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("x",))
    b = 3 if devices == 2 else devices
    q, k, v = _qkv((b, 1, 20, 16), (b, 1, 30, 16), "float32", seed=11)
    out = at.sharded_mha(q, k, v, mesh=mesh, axis_name="x")
    _check(out, at.mha_reference(q, k, v), q, k, v)


def test_sharded_mha_rejects_an_unknown_axis():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    q = jnp.zeros((2, 1, 8, 8))
    with pytest.raises(ValueError, match="axis_name='y' is not an axis of the mesh"):
        at.sharded_mha(q, q, q, mesh=mesh, axis_name="y")


@pytest.mark.parametrize(
    "dtype, blocks, message",
    [
        ("float32", {"block_q": 12}, ("block_q=12 must be a multiple of 8 (TPU sublane tiling "
         "of float32, the second-minor dimension of q's block) or equal the full dimension s=100")),
        ("bfloat16", {"block_q": 8}, ("block_q=8 must be a multiple of 16 (TPU sublane tiling "
         "of bfloat16")),
        ("float32", {"block_kv": 64}, ("block_kv=64 must be a multiple of 128 (TPU lane tiling, "
         "the minor dimension of the (block_q, block_kv) logits) "
         "or equal the full dimension t=300")),
        ("float32", {"block_kv": -128}, "block_kv must be a positive int, got -128"),
        ("float32", {"block_q": True}, "block_q must be a positive int, got True"),
    ],
)
def test_block_validation(dtype, blocks, message):
    q, k, v = _qkv((100, 40), (300, 40), dtype)
    with pytest.raises(ValueError) as error:
        at.flash_attention(q, k, v, **blocks)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "function, shapes, message",
    [
        (at.attention, [(4, 8), (6, 9), (6, 9)], "matching d and t"),
        (at.attention, [(4, 8), (6, 8), (5, 8)], "matching d and t"),
        (at.attention, [(1, 4, 8), (6, 8), (6, 8)], "expected q (s, d)"),
        (at.mha, [(2, 3, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8)], "expected q (b, h, s, d)"),
        (at.mqa, [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)], "k (b, t, d)"),
    ],
)
def test_operand_validation(function, shapes, message):
    with pytest.raises(ValueError) as error:
        function(*(jnp.zeros(shape) for shape in shapes))
    assert message in str(error.value)


def test_dtype_validation():
    q = jnp.zeros((4, 8))
    with pytest.raises(ValueError, match="must all be float32 or all bfloat16"):
        at.attention(q, q.astype(jnp.bfloat16), q)


def test_cost_models():
    q, k = jnp.zeros((100, 64), jnp.bfloat16), jnp.zeros((300, 64), jnp.bfloat16)
    cost = at.attention_cost(q, k, k)
    assert cost.flops == 4 * 100 * 300 * 64 + 4 * 100 * 300
    assert cost.transcendentals == 100 * 300 + 100
    assert cost.bytes_accessed == 2 * (2 * 100 * 64 + 2 * 300 * 64)
    blocked = at.attention_cost(q, k, k, block_q=50, block_kv=128)  # k, v read per q block
    assert blocked.bytes_accessed == 2 * (2 * 100 * 64 + 2 * 2 * 300 * 64)
    assert blocked.transcendentals == 100 * 300 + 3 * 100
    qb, kb = jnp.zeros((2, 3, 100, 64)), jnp.zeros((2, 3, 300, 64))
    mha = at.mha_cost(qb, kb, kb)
    assert mha.flops == 6 * cost.flops
    mqa = at.mqa_cost(qb, kb[:, 0], kb[:, 0])
    assert mqa.flops == mha.flops
    assert mqa.bytes_accessed == 4 * (2 * 6 * 100 * 64 + 2 * 2 * 300 * 64)
