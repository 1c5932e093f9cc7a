"""reference_kernels.flash_attention: causal masking, sm_scale, MHA/GQA/MQA, a tight allowance."""

import math

import jax
import ml_dtypes
import numpy as np
import pytest
from seeded_bugs import new_ops as bugs

from pytest_pallas import assert_allclose
from pytest_pallas.reference_kernels import flash_attention as fa

pytestmark = pytest.mark.pallas


def _values(shape, dtype, rng):
    values = rng.standard_normal(shape)
    return values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)


def _qkv(b, h, g, s, t, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (_values((b, h, s, d), dtype, rng), _values((b, g, t, d), dtype, rng),
            _values((b, g, t, d), dtype, rng))


def assert_within_allowance(out, q, k, v, *, causal, sm_scale):
    """The op's error model, as the suite judges it: the comparator's default for the output
    dtype and t, plus attention's logit allowance."""
    expected = fa.flash_attention_reference(q, k, v, causal=causal, sm_scale=sm_scale)
    assert out.shape == expected.shape and out.dtype == q.dtype
    assert_allclose(out, expected, op="flash_attention", inputs=(q, k, v),
                    op_params={"causal": causal, "sm_scale": sm_scale})


@pytest.mark.parametrize(
    "b, h, g, s, t, d, dtype, causal, scaled",
    [
        pytest.param(1, 1, 1, 1, 1, 1, "float32", True, False, id="1x1-causal"),
        pytest.param(2, 2, 2, 5, 3, 8, "bfloat16", False, True, id="mha-s-gt-t-bf16"),
        pytest.param(1, 4, 2, 37, 37, 16, "float32", True, True, id="gqa2-causal-ragged"),
        pytest.param(1, 4, 1, 24, 40, 16, "bfloat16", False, False, id="mqa-bf16"),
        pytest.param(1, 4, 1, 24, 24, 16, "float32", True, True, id="mqa-causal"),
        pytest.param(1, 3, 3, 20, 20, 8, "bfloat16", True, False, id="mha-causal-bf16"),
        pytest.param(1, 4, 2, 12, 30, 8, "bfloat16", False, True, id="gqa2-bf16"),
    ],
)
def test_flash_attention(b, h, g, s, t, d, dtype, causal, scaled):
    """Group ratios h/g of 1 (MHA), 2 (GQA) and h (MQA); one block per axis; sm_scale 1 and
    1/sqrt(d)."""
    q, k, v = _qkv(b, h, g, s, t, d, dtype, seed=s + t)
    sm_scale = 1 / math.sqrt(d) if scaled else 1.0
    out = jax.jit(fa.flash_attention, static_argnames=("causal", "sm_scale"))(
        q, k, v, causal=causal, sm_scale=sm_scale)
    assert_within_allowance(out, q, k, v, causal=causal, sm_scale=sm_scale)


@pytest.mark.parametrize(
    "dtype, causal, s, t, blocks",
    [
        # s = t = 200 over 32-row q blocks and 128-key kv blocks: 7 x 2 blocks, the
        # ones above the diagonal skipped, the last kv block padded from key 200 on.
        pytest.param("float32", True, 200, 200, (32, 128), id="causal-7x2-blocks-f32"),
        pytest.param("bfloat16", True, 200, 200, (64, 128), id="causal-4x2-blocks-bf16"),
        pytest.param("float32", False, 100, 300, (32, 128), id="4x3-blocks-f32"),
        # q blocks larger than kv blocks: one q block needs several kv blocks.
        pytest.param("float32", True, 136, 136, (136, 128), id="causal-wide-q-block"),
    ],
)
def test_multi_block(dtype, causal, s, t, blocks):
    q, k, v = _qkv(1, 1, 1, s, t, 16, dtype, seed=7)
    block_q, block_kv = blocks
    out = fa.flash_attention_blocked(q, k, v, causal=causal, sm_scale=0.25, block_q=block_q,
                                     block_kv=block_kv)
    assert_within_allowance(out, q, k, v, causal=causal, sm_scale=0.25)


def test_masked_keys_get_no_weight_even_when_largest():
    """Future keys with the largest logits: a leaked future key would dominate its row."""
    s = t = 160
    q = np.ones((1, 1, s, 8), np.float32)
    k = np.broadcast_to(np.linspace(-1, 1, t, dtype=np.float32)[:, None], (1, 1, t, 8)).copy()
    v = _values((1, 1, t, 8), "float32", np.random.default_rng(1))
    out = fa.flash_attention_blocked(q, k, v, causal=True, sm_scale=1.0, block_q=80,
                                     block_kv=128)
    assert_within_allowance(out, q, k, v, causal=True, sm_scale=1.0)


def test_blocks_above_the_diagonal_are_never_computed():
    """Keys 128 to 255 are in the future of every one of the 100 queries: their kv block is
    skipped. NaN there would reach the output of a kernel that only masked it (0 * NaN)."""
    q, k, v = _qkv(1, 2, 1, 100, 256, 16, "float32", seed=8)
    k_future, v_future = k.copy(), v.copy()
    k_future[:, :, 128:] = np.nan
    v_future[:, :, 128:] = np.nan
    out = fa.flash_attention_blocked(q, k_future, v_future, causal=True, sm_scale=0.25,
                                     block_kv=128)
    assert_within_allowance(out, q, k, v, causal=True, sm_scale=0.25)


# --- the allowance is tight: these kernels are wrong and must fail with it -----------------------


SEEDED_BUGS = [
    bugs.flash_attention_bfloat16_accumulator,
    bugs.flash_attention_unscaled,
    bugs.flash_attention_mask_off_by_one,
    # Right inside the first kv block, wrong in the others: needs t > 128.
    bugs.flash_attention_mask_block_local,
]


def test_seeded_bugs_fail_the_allowance_where_the_kernel_passes():
    """float32, causal, sm_scale 1/4, two kv blocks: the reference kernel passes; a bfloat16
    accumulator, an unscaled attention and two wrong masks each fail."""
    q, k, v = _qkv(1, 2, 1, 160, 160, 16, "float32", seed=6)
    params = {"causal": True, "sm_scale": 0.25}
    assert_within_allowance(fa.flash_attention_blocked(q, k, v, block_kv=128, **params),
                            q, k, v, **params)
    for bug in SEEDED_BUGS:
        try:
            assert_within_allowance(bug(q, k, v, **params), q, k, v, **params)
        except AssertionError as error:
            assert "Arrays are not close" in str(error), bug.__name__
        else:
            pytest.fail(f"seeded bug {bug.__name__} passed the allowance")


@pytest.mark.parametrize("g_drawn, g_used", [(3, 2), (4, 4), (1, 1), (5, 4)])
def test_the_input_builder_keeps_h_a_multiple_of_g(g_drawn, g_used):
    q, k, v = fa.flash_attention_inputs(dict(b=1, h=4, g=g_drawn, s=3, t=5, d=2), "bfloat16",
                                        np.random.default_rng(0))
    assert q.shape == (1, 4, 3, 2) and k.shape == v.shape == (1, g_used, 5, 2)
    assert q.dtype == k.dtype == ml_dtypes.bfloat16


# --- validation, oracle and cost -----------------------------------------------------------------


@pytest.mark.parametrize(
    "shapes, kwargs, message",
    [
        ([(1, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)], {},
         "the number of query heads h=3 must be a multiple of the number of kv heads g=2"),
        ([(1, 2, 4, 8), (1, 2, 4, 8)[1:], (1, 2, 4, 8)], {}, "expects q (b, h, s, d)"),
        ([(1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 4, 8)], {}, "matching b, g, t and d"),
        ([(1, 2, 40, 8), (1, 2, 300, 8), (1, 2, 300, 8)], {"block_q": 12},
         "block_q=12 must be a multiple of 8 (TPU sublane tiling of float32"),
        ([(1, 2, 40, 8), (1, 2, 300, 8), (1, 2, 300, 8)], {"block_kv": 64},
         "block_kv=64 must be a multiple of 128 (TPU lane tiling"),
    ],
)
def test_validation(shapes, kwargs, message):
    q, k, v = (np.zeros(shape, np.float32) for shape in shapes)
    with pytest.raises(ValueError) as error:
        fa.flash_attention_blocked(q, k, v, causal=False, sm_scale=1.0, **kwargs)
    assert message in str(error.value)


def test_causal_must_be_a_bool():
    q = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(TypeError, match="causal must be True or False"):
        fa.flash_attention(q, q, q, causal="yes", sm_scale=1.0)


def test_oracle_gqa_uses_head_over_group_ratio():
    """Query head i reads kv head i // (h // g): heads 0, 1 use kv 0; heads 2, 3 use kv 1."""
    q = np.zeros((1, 4, 1, 1))
    v = np.array([1.0, 2.0]).reshape(1, 2, 1, 1)
    out = fa.flash_attention_reference(q, np.zeros_like(v), v, causal=False, sm_scale=1.0)
    assert out[0, :, 0, 0].tolist() == [1.0, 1.0, 2.0, 2.0]


def test_cost_model_counts_the_causal_half():
    q = jax.ShapeDtypeStruct((1, 4, 256, 64), np.float32)
    kv = jax.ShapeDtypeStruct((1, 2, 256, 64), np.float32)
    full = fa.flash_attention_cost(q, kv, kv, causal=False)
    causal = fa.flash_attention_cost(q, kv, kv, causal=True)
    assert full.flops == 4 * (4 * 256 * 256 * 64 + 5 * 256 * 256)
    assert causal.flops == 4 * (4 * 64 + 5) * (256 * 257 // 2)
    # Blocked: 2 q blocks of 128; q block 0 visits kv block 0, q block 1 both.
    blocked = fa.flash_attention_cost(q, kv, kv, causal=True, block_q=128, block_kv=128)
    assert blocked.flops == 4 * (4 * 64 + 5) * 3 * 128 * 128
    assert full.bytes_accessed == 4 * (2 * 4 * 256 * 64 + 2 * 2 * 256 * 64)
