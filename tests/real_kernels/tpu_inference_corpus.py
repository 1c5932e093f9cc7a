"""tpu-inference 0.32.0's Pallas TPU kernels (vLLM's TPU backend) in the real-kernel corpus.

Installed with ``pip install --no-deps tpu-inference==0.32.0`` (constraints/corpus-2026.txt):
its ``__init__`` and its ``logger`` / ``utils`` modules import vLLM and torch,
which no kernel here needs. ``kernel_modules.load_kernel_module`` imports the
kernel modules without them: the package's ``__init__`` is left unrun, and
``tpu_inference.logger`` and ``tpu_inference.utils`` are stand-ins with the
three names the kernels take from them.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from .corpus import Case, _f64, _normal, grouped_matmul64
from .kernel_modules import load_kernel_module
from .references_2026 import attention_forward64, causal_mask, local_mask


class _KernelLogger(logging.LoggerAdapter):
    """vLLM's logger API as the kernels use it (``warning_once`` on a missing tuned size)."""

    def warning_once(self, msg, *args):
        self.warning(msg, *args)

    def info_once(self, msg, *args):
        self.info(msg, *args)

    def debug_once(self, msg, *args):
        self.debug(msg, *args)


def _align_to(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _device_name(num_devices: int | None = None) -> str:
    # Read only to look up tuned block sizes; every case below passes its own.
    return "TPU v5e" if num_devices is None else f"TPU v5e-{num_devices}"


STAND_INS = {
    "tpu_inference.logger": {
        "init_logger": lambda name: _KernelLogger(logging.getLogger(name), {})},
    "tpu_inference.utils": {"align_to": _align_to, "get_device_name": _device_name},
}


def load(module: str):
    """``tpu_inference.<module>`` without vLLM."""
    return load_kernel_module(f"tpu_inference.{module}", skip_init=("tpu_inference",),
                              stand_ins=STAND_INS)


# --- flash attention ----------------------------------------------------------------------

def _flash_module():
    return load("kernels.flash_attention.kernel")


def _blocks():
    fa = _flash_module()
    return fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)


SCALE = 1 / math.sqrt(128)


def _flash_args():
    b, h, s, d = 1, 2, 256, 128
    return tuple(_normal(100 + i, (b, h, s, d)) for i in range(3))


def _flash_causal(q, k, v):
    return _flash_module().flash_attention(q, k, v, causal=True, sm_scale=SCALE,
                                           block_sizes=_blocks())


def _segment_ids():
    # Three segments, the middle one straddling both 128-row blocks.
    return jnp.asarray(np.repeat([0, 1, 1, 2], 64)[None, :], jnp.int32)


def _flash_segments(q, k, v, ids):
    fa = _flash_module()
    return fa.flash_attention(q, k, v, segment_ids=fa.SegmentIds(q=ids, kv=ids),
                              sm_scale=SCALE, block_sizes=_blocks())


def _flash_segment_reference(q, k, v, ids):
    ids = np.asarray(ids)
    mask = ids[:, None, :, None] == ids[:, None, None, :]
    return attention_forward64(q, k, v, mask=mask, scale=SCALE)


# Encoder-only attention: two sequences of 80 and 120 tokens packed in 200 rows (padded to
# 256 inside), each token seeing the tokens of its own sequence within 32 positions.
SEQUENCE_LENGTHS, WINDOW = (80, 120), 32


def _window_args():
    t, h, d = sum(SEQUENCE_LENGTHS), 2, 128
    return (*(_normal(110 + i, (t, h, d)) for i in range(3)),
            jnp.asarray(SEQUENCE_LENGTHS, jnp.int32))


def _flash_sliding_window(q, k, v, seq_lens):
    return _flash_module().encoder_only_flash_attention(
        q, k, v, seq_lens, sliding_window=WINDOW, block_sizes=_blocks())


def _window_reference(q, k, v, seq_lens):
    sequence = np.repeat(np.arange(len(seq_lens)), np.asarray(seq_lens))
    t = len(sequence)
    mask = (sequence[:, None] == sequence[None, :]) & local_mask(t, t, WINDOW, WINDOW)
    heads_first = [np.swapaxes(_f64(a), 0, 1) for a in (q, k, v)]
    out = attention_forward64(*heads_first, mask=mask, scale=1 / math.sqrt(q.shape[-1]))
    return np.swapaxes(out, 0, 1)


def _scaled_heads_first(q, k, v, *rest):
    return (np.swapaxes(_f64(q), 0, 1) / math.sqrt(q.shape[-1]),
            np.swapaxes(_f64(k), 0, 1), np.swapaxes(_f64(v), 0, 1))


# --- quantized matmul ---------------------------------------------------------------------

def _quantized_args(x_dtype):
    def args():
        batch, n_in, n_out = 128, 512, 256
        x = _normal(120, (batch, n_in), x_dtype)
        w_q = jnp.asarray(np.random.default_rng(121).integers(-128, 128, (n_out, n_in)),
                          jnp.int8)
        w_scale = jnp.asarray(np.random.default_rng(122).uniform(0.001, 0.01, n_out),
                              jnp.float32)
        return x, w_q, w_scale
    return args


def _quantized_matmul(x_q_dtype):
    def call(x, w_q, w_scale):
        qm = load("kernels.quantized_matmul.kernel")
        tuned = load("kernels.quantized_matmul.tuned_block_sizes").TunedValue(128, 128, 256)
        return qm.quantized_matmul_kernel(x, w_q, w_scale, x_q_dtype=x_q_dtype,
                                          tuned_value=tuned)
    call.__name__ = "quantized_matmul_w8a8" if x_q_dtype else "quantized_matmul_w8a16"
    return call


def _w8a16_reference(x, w_q, w_scale):
    return _f64(x) @ (_f64(w_q).T * _f64(w_scale))


def _w8a8_reference(x, w_q, w_scale):
    """The w8a8 contract: activations quantized per token to int8 by the package's own
    ``quantize_array`` (scale absmax / 127, truncated), then an exact integer product
    rescaled in float64. The quantization runs in XLA, outside the kernel: NumPy's float32
    and XLA's truncate differently the few products within an ulp of an integer (3 of
    65,536 here), and the contract leaves that rounding to the implementation."""
    util = load("kernels.quantized_matmul.util")
    x_abs_max = jnp.max(jnp.abs(x), axis=-1)[None]
    x_q, x_scale = jax.jit(util.quantize_array, static_argnums=2)(x, x_abs_max, jnp.int8)
    return (_f64(x_q) @ _f64(w_q).T) * _f64(w_scale) * _f64(x_scale)


# --- grouped matmul with int8 weights (megablox gmm) --------------------------------------

def _gmm_int8_args():
    m, k, n, groups = 256, 256, 256, 4
    rng = np.random.default_rng(130)
    lhs = _normal(131, (m, k), jnp.bfloat16)
    rhs = jnp.asarray(rng.integers(-128, 128, (groups, k, n)), jnp.int8)
    rhs_scale = jnp.asarray(rng.uniform(0.001, 0.01, (groups, 1, 1, n)), jnp.float32)
    return lhs, rhs, rhs_scale, jnp.asarray([100, 0, 28, 128], jnp.int32)


def _gmm_int8(lhs, rhs, rhs_scale, group_sizes):
    gmm = load("kernels.megablox.gmm")
    return gmm.gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16,
                   rhs_scale=rhs_scale, tiling=(128, 128, 128))


def _gmm_int8_reference(lhs, rhs, rhs_scale, group_sizes):
    return grouped_matmul64(lhs, _f64(rhs) * _f64(rhs_scale)[:, 0], group_sizes)


# --- ragged causal conv1d (Mamba / gated delta net layers) -------------------------------

# Four sequences of 128, 7, 64 and 15 new tokens: 214 rows in tiles of 64, so tiles mix
# sequences and one sequence ends inside a tile (the tiles past the last real row are the
# kernel's no-op tiles, with zero-length DMAs).
CONV_QUERY_START, CONV_LENGTHS, CONV_WIDTH, CONV_DIM = (0, 128, 135, 199, 214), \
    (150, 20, 100, 30), 4, 128


def _conv_args():
    sequences = len(CONV_LENGTHS)
    query_start = jnp.asarray(CONV_QUERY_START, jnp.int32)
    new_tokens = np.diff(CONV_QUERY_START)
    return (_normal(140, (CONV_QUERY_START[-1], CONV_DIM)),
            _normal(141, (sequences + 1, CONV_WIDTH - 1, CONV_DIM)),
            _normal(142, (CONV_DIM, 1, CONV_WIDTH)), _normal(143, (CONV_DIM,)),
            query_start, jnp.arange(1, sequences + 1, dtype=jnp.int32),
            jnp.asarray([0, 0, sequences], jnp.int32),
            jnp.asarray(np.asarray(CONV_LENGTHS) > new_tokens))


def _causal_conv1d(x, state, weight, bias, query_start, state_indices, distribution,
                   has_initial_state):
    conv = load("kernels.causal_conv1d.causal_conv1d")
    # The kernel donates x and the state (as vLLM calls it): pass copies, as its tests do.
    x, state = jnp.copy(x), jnp.copy(state)
    return conv.ragged_causal_conv1d(x, state, weight, bias, query_start, state_indices,
                                     distribution, has_initial_state,
                                     kernel_size=CONV_WIDTH)


def _causal_conv1d_reference(x, state, weight, bias, query_start, state_indices,
                             distribution, has_initial_state):
    """Per sequence: its state rows (or zeros without one) then its new tokens, convolved
    causally with a width-4 window per channel, plus the bias; the new state is the last
    3 rows of that history."""
    x, state, weight, bias = _f64(x), _f64(state), _f64(weight)[:, 0], _f64(bias)
    out, new_state = np.zeros_like(x), state.copy()
    width = weight.shape[1]
    for s in range(int(distribution[2])):
        start, end = int(query_start[s]), int(query_start[s + 1])
        slot = int(state_indices[s])
        past = state[slot] if bool(has_initial_state[s]) else np.zeros_like(state[slot])
        history = np.concatenate([past, x[start:end]])
        for row in range(end - start):
            out[start + row] = (history[row:row + width] * weight.T).sum(0) + bias
        if end > start:
            new_state[slot] = history[-(width - 1):]
    return out, new_state


# --- ragged paged attention v3 (vLLM's TPU attention) -------------------------------------

# Three sequences, as vLLM batches them: a decode (1 new token of 70), a prefill (16 of 16)
# and a chunked prefill (8 new of 40), in pages of 16 tokens, 8 pages a sequence. The
# distribution (1, 1, 3) says: sequence 0 decode-only, 1 and 2 mixed. (Sequences in
# [distribution[0], distribution[1]) are prefill-only, run by a kernel only when the call
# passes chunk_prefill_size: without one they are left out, output and cache alike.)
RPA_Q_LENS, RPA_KV_LENS = (1, 16, 8), (70, 16, 40)
RPA_HEADS, RPA_KV_HEADS, RPA_PAGE, RPA_PAGES_PER_SEQ, RPA_PAGES = 4, 2, 16, 8, 32


def _rpa_args():
    tokens, d = 32, 128                      # 25 real tokens, padded as vLLM pads a batch
    queries = _normal(150, (tokens, RPA_HEADS, d))
    keys, values = (_normal(151 + i, (tokens, RPA_KV_HEADS, d)) for i in range(2))
    kv_cache = _normal(153, (RPA_PAGES, RPA_PAGE, 2 * RPA_KV_HEADS, 1, d))
    pages = np.random.default_rng(154).permutation(RPA_PAGES)[:3 * RPA_PAGES_PER_SEQ]
    return (queries, keys, values, kv_cache, jnp.asarray(RPA_KV_LENS, jnp.int32),
            jnp.asarray(pages, jnp.int32), jnp.asarray(np.cumsum([0, *RPA_Q_LENS]), jnp.int32),
            jnp.asarray([1, 1, 3], jnp.int32))


# The v3 kernel's jit donates queries, keys, values and the cache (vLLM's update in place);
# the new keys and values match no output, so jit says their buffers were not usable.
V3_DONATION = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable:UserWarning")


def _ragged_paged_attention_v3(queries, keys, values, kv_cache, *metadata):
    rpa = load("kernels.ragged_paged_attention.v3.kernel")
    # The kernel donates the new tokens and the cache (vLLM's update in place): copies.
    queries, keys, values, kv_cache = (jnp.copy(a) for a in (queries, keys, values, kv_cache))
    out, cache = rpa.ragged_paged_attention(queries, keys, values, kv_cache, *metadata,
                                            sm_scale=SCALE, d_block_sizes=(1, 128, 1, 128),
                                            m_block_sizes=(16, 128, 16, 64))
    # The rows past the batch's last token are padding, which the kernel leaves unwritten.
    return out[:sum(RPA_Q_LENS)], cache


def _rpa_reference(queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens,
                   distribution):
    """(attention output, updated cache): each sequence's new keys and values written at
    positions kv_len - q_len ..., then causal attention of its queries over its kv_len."""
    queries, keys, values = _f64(queries), _f64(keys), _f64(values)
    cache = _f64(kv_cache).copy()
    out = np.zeros_like(queries[:sum(RPA_Q_LENS)])
    group = RPA_HEADS // RPA_KV_HEADS
    for s in range(int(distribution[-1])):
        start, end = int(cu_q_lens[s]), int(cu_q_lens[s + 1])
        n, q_len = int(kv_lens[s]), end - start
        pages = np.asarray(page_indices[s * RPA_PAGES_PER_SEQ:(s + 1) * RPA_PAGES_PER_SEQ])
        sequence = cache[pages].reshape(-1, 2 * RPA_KV_HEADS, cache.shape[-1])
        sequence[n - q_len:n, 0::2] = keys[start:end]         # heads interleaved: k0 v0 k1 v1
        sequence[n - q_len:n, 1::2] = values[start:end]
        cache[pages] = sequence.reshape(cache[pages].shape)
        k, v = sequence[:n, 0::2], sequence[:n, 1::2]
        mask = np.arange(n)[None, :] <= (n - q_len + np.arange(q_len))[:, None]
        for head in range(RPA_HEADS):
            out[start:end, head] = attention_forward64(
                queries[start:end, head], k[:, head // group], v[:, head // group],
                mask=mask, scale=SCALE)
    return out, cache


# --- fused expert-parallel MoE -----------------------------------------------------------

# 16 bfloat16 tokens of width 256 routed to the top 2 of 4 experts (intermediate width 256),
# the experts split over 2 devices (expert parallelism: each device holds 2 experts and 8
# tokens, and tokens travel to their experts' device and back). bfloat16 packs two tokens a
# 32-bit row, which the kernel reads and writes through bitcast refs.
MOE_TOKENS, MOE_HIDDEN, MOE_INTERMEDIATE, MOE_EXPERTS, MOE_TOP_K, MOE_DEVICES = \
    16, 256, 256, 4, 2, 2


def _moe_args():
    tokens = _normal(170, (MOE_TOKENS, MOE_HIDDEN), jnp.bfloat16)
    w1 = (_normal(171, (MOE_EXPERTS, 2, MOE_HIDDEN, MOE_INTERMEDIATE)) / 16).astype(jnp.bfloat16)
    w2 = (_normal(172, (MOE_EXPERTS, MOE_INTERMEDIATE, MOE_HIDDEN)) / 16).astype(jnp.bfloat16)
    # Distinct router logits in every row (a permutation, exact in bfloat16): no tie for
    # the top 2 that the kernel and the reference could break differently.
    rng = np.random.default_rng(173)
    gating = np.stack([rng.permutation(MOE_EXPERTS) for _ in range(MOE_TOKENS)]) * 0.5 - 1.0
    return tokens, w1, w2, jnp.asarray(gating, jnp.bfloat16)


def _fused_ep_moe(tokens, w1, w2, gating):
    moe = load("kernels.fused_moe.v1.kernel")
    # A 2D mesh whose other axis has size 1, as the kernel requires; automatic axes (the
    # kernel's shard_map places its operands itself).
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:MOE_DEVICES]).reshape(1, MOE_DEVICES),
                             ("data", "model"))
    # The whole of every dimension in one block: the tuned table has no entry this small.
    return moe.fused_ep_moe(mesh, tokens, w1, w2, gating, MOE_TOP_K, bt=8, btc=8,
                            bf=MOE_INTERMEDIATE, bfc=MOE_INTERMEDIATE, bd1=MOE_HIDDEN,
                            bd1c=MOE_HIDDEN, bd2=MOE_HIDDEN, bd2c=MOE_HIDDEN)


# The kernel truncates each expert's float32 output to bfloat16 (it keeps the high 16 bits:
# up to 1 ulp, toward zero) and weights and sums the experts' outputs in bfloat16, so its
# output is within 2 bfloat16 ulps (2 ** -6) of the exact answer, not the default 1 (2 ** -7).
MOE_RTOL = 2.0 ** -6


def _fused_moe_reference(tokens, w1, w2, gating):
    """Each token: softmax over the router logits, its top 2 experts, each a SwiGLU MLP
    (silu(x w1[e, 0]) * (x w1[e, 1])) w2[e], summed with the experts' softmax weights."""
    x, w1, w2, logits = _f64(tokens), _f64(w1), _f64(w2), _f64(gating)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e in np.argsort(-weights[t], kind="stable")[:MOE_TOP_K]:
            gate, up = x[t] @ w1[e, 0], x[t] @ w1[e, 1]
            out[t] += weights[t, e] * ((gate / (1 + np.exp(-gate)) * up) @ w2[e])
    return out


# --- all-gather matmul (tensor parallelism) -----------------------------------------------

def _all_gather_matmul(devices: int):
    def call(x, y):
        agm = load("kernels.collectives.all_gather_matmul")
        mesh = jax.make_mesh((devices,), ("x",), devices=jax.devices()[:devices])
        spec = jax.sharding.PartitionSpec
        # Rows of x and columns of y sharded, as the kernel's shard_map takes them.
        x = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec("x", None)))
        y = jax.device_put(y, jax.sharding.NamedSharding(mesh, spec(None, "x")))
        # k in two 128-column blocks: the kernel accumulates across them.
        return agm.all_gather_matmul(x, y, mesh, "x", bn=128, bk=128)
    call.__name__ = f"all_gather_matmul_{devices}_devices"
    return call


def _all_gather_matmul_args(devices: int):
    # m = 32 rows a device (16 a direction of the ring), k = 256, n = 128 columns a device.
    return lambda: (_normal(160, (32 * devices, 256)), _normal(161, (256, 128 * devices)))


TPU_INFERENCE_CASES = [dataclasses.replace(case, package="tpu-inference") for case in [
    Case("tpu_inference_flash_attention_causal", _flash_causal, _flash_args,
         lambda q, k, v: attention_forward64(q, k, v, mask=causal_mask(256, 256), scale=SCALE),
         reduction_length=256, attention_inputs=lambda q, k, v: (_f64(q) * SCALE, k, v)),
    Case("tpu_inference_flash_attention_segments", _flash_segments,
         lambda: (*_flash_args(), _segment_ids()), _flash_segment_reference,
         reduction_length=256, attention_inputs=lambda q, k, v, ids: (_f64(q) * SCALE, k, v)),
    Case("tpu_inference_flash_attention_sliding_window", _flash_sliding_window, _window_args,
         _window_reference, reduction_length=2 * WINDOW + 1,
         attention_inputs=_scaled_heads_first),
    Case("tpu_inference_quantized_matmul_w8a16", _quantized_matmul(None),
         _quantized_args(jnp.bfloat16), _w8a16_reference, reduction_length=512),
    Case("tpu_inference_quantized_matmul_w8a8", _quantized_matmul(jnp.int8),
         _quantized_args(jnp.float32), _w8a8_reference, reduction_length=512),
    Case("tpu_inference_gmm_int8", _gmm_int8, _gmm_int8_args, _gmm_int8_reference,
         reduction_length=256),
    Case("tpu_inference_ragged_causal_conv1d", _causal_conv1d, _conv_args,
         _causal_conv1d_reference, reduction_length=CONV_WIDTH),
    Case("tpu_inference_ragged_paged_attention_v3", _ragged_paged_attention_v3, _rpa_args,
         _rpa_reference, reduction_length=max(RPA_KV_LENS), slow=True),
    Case("tpu_inference_fused_ep_moe", _fused_ep_moe, _moe_args, _fused_moe_reference,
         reduction_length=MOE_HIDDEN, devices=MOE_DEVICES, rtol=MOE_RTOL, slow=True,
         vmem_limit_mib=100),  # its vmem_limit_bytes: a kernel for 128 MiB chips (v5e, v6e)
    *(Case(f"tpu_inference_all_gather_matmul_{n}_devices", _all_gather_matmul(n),
           _all_gather_matmul_args(n), lambda x, y: _f64(x) @ _f64(y), reduction_length=256,
           devices=n) for n in (2, 4)),
]]
