"""JAX's own kernels as 2026 uses them: splash attention with sinks (forward and backward)
and paged attention split over a megacore chip's two TensorCores.

Both ship with JAX (``jax.experimental.pallas.ops.tpu``) at both ends of the
supported range, so these cases run on every leg.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .corpus import PAGES_PER_SEQUENCE, Case, _normal, _paged_attention_inputs, _paged_reference
from .references_2026 import attention_forward64, attention_vjp64, causal_mask

HEADS, S, D, BLOCK = 2, 256, 128, 128


def _splash_with_sinks():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    mask = sm.MultiHeadMask([sm.CausalMask((S, S)) for _ in range(HEADS)])
    blocks = sk.BlockSizes(block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK,
                           block_q_dkv=BLOCK, block_kv_dkv=BLOCK, block_kv_dkv_compute=BLOCK,
                           block_q_dq=BLOCK, block_kv_dq=BLOCK)
    return sk.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1)


def _sinks():
    # One learned logit per head that takes weight but carries no value: one head's sink
    # above most logits, the other's below.
    return jnp.asarray([1.5, -2.0], jnp.float32)


def _args():
    q = _normal(400, (HEADS, S, D)) / np.float32(np.sqrt(D))   # callers pass q scaled
    return (q, *(_normal(401 + i, (HEADS, S, D)) for i in range(2)), _sinks())


def _splash_sinks(q, k, v, sinks):
    return _splash_with_sinks()(q, k, v, sinks=sinks)


def _splash_sinks_backward(q, k, v, sinks, d_out):
    kernel = _splash_with_sinks()
    return jax.vjp(lambda q, k, v: kernel(q, k, v, sinks=sinks), q, k, v)[1](d_out)


# --- paged attention on a megacore chip ---------------------------------------------------

def _paged_megacore(mode: str):
    def call(q, k_pages, v_pages, lengths, page_indices):
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

        return paged_attention(q, k_pages, v_pages, lengths, page_indices,
                               pages_per_compute_block=4, megacore_mode=mode)
    call.__name__ = f"paged_attention_megacore_{mode}"
    return call


def _paged_args():
    # bfloat16 pages: the kernel computes in bfloat16 whatever it is given (the float32
    # case of corpus.py is an xfail for that), so the megacore split is judged alone.
    b, h, g, d, page_size, total_pages = 2, 4, 2, 128, 16, 32
    q = _normal(410, (b, h, d), jnp.bfloat16)
    k_pages = _normal(411, (g, total_pages, page_size, d), jnp.bfloat16)
    v_pages = _normal(412, (g, total_pages, page_size, d), jnp.bfloat16)
    pages = np.random.default_rng(413).permutation(total_pages)[: b * PAGES_PER_SEQUENCE]
    return (q, k_pages, v_pages, jnp.asarray([37, 128], jnp.int32),
            jnp.asarray(pages.reshape(b, PAGES_PER_SEQUENCE), jnp.int32))


JAX_2026_CASES = [
    Case("jax_splash_sinks", _splash_sinks, _args,
         lambda q, k, v, sinks: attention_forward64(q, k, v, mask=causal_mask(S, S),
                                                    sinks=sinks),
         reduction_length=S, attention_inputs=lambda q, k, v, sinks: (q, k, v)),
    Case("jax_splash_sinks_backward", _splash_sinks_backward,
         lambda: (*_args(), _normal(404, (HEADS, S, D))),
         lambda q, k, v, sinks, d_out: attention_vjp64(q, k, v, d_out, mask=causal_mask(S, S),
                                                       sinks=sinks),
         reduction_length=S),
    *(Case(f"jax_paged_attention_megacore_{mode}", _paged_megacore(mode), _paged_args,
           _paged_reference, reduction_length=128, attention_inputs=_paged_attention_inputs,
           min_tensor_cores=2)
      for mode in ("kv_head", "batch")),
]
