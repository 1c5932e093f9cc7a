"""tokamax's Pallas TPU kernels in the real-kernel corpus (optional: ``pip install tokamax``).

tokamax 0.0.12 installs beside jax 0.10.2 (it needs jax >= 0.9.2). Its ops
refuse a device that is not a TPU (``supported_on``); the adapters below
lift that refusal only, so the kernels run in the plugin's interpreter as
they would compile for the chip. Layouts are tokamax's: attention takes
(batch, sequence, heads, head_dim) and scales logits by 1/sqrt(head_dim).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np

from .corpus import Case, _causal_mask, _normal, attention64, grouped_matmul64


@functools.cache
def _ops():
    from absl import flags

    if not flags.FLAGS.is_parsed():  # tokamax reads absl flags; pytest's argv is not theirs
        flags.FLAGS.mark_as_parsed()
    from tokamax._src.ops.attention import pallas_mosaic_tpu as attention
    from tokamax._src.ops.ragged_dot import pallas_mosaic_tpu as ragged_dot

    class FlashAttention(attention.PallasMosaicTpuFlashAttention):
        def supported_on(self, device):  # the plugin's interpreter stands in for the TPU
            return True

    class RaggedDot(ragged_dot.PallasMosaicTpuRaggedDot):
        def supported_on(self, device):
            return True

    return FlashAttention(), RaggedDot()


def _heads_first(a) -> np.ndarray:
    return np.swapaxes(np.asarray(a, np.float32), 1, 2)


def _attention(causal: bool):
    def call(q, k, v):
        return _ops()[0](q, k, v, is_causal=causal)
    call.__name__ = f"tokamax_flash_attention{'_causal' if causal else ''}"
    return call


def _attention_args():
    b, s, h, d = 1, 256, 2, 128
    return tuple(_normal(70 + i, (b, s, h, d)) for i in range(3))


def _attention_reference(causal: bool):
    def reference(q, k, v):
        mask = _causal_mask(q.shape[1], k.shape[1]) if causal else None
        out = attention64(_heads_first(q), _heads_first(k), _heads_first(v), mask=mask,
                          scale=1 / math.sqrt(q.shape[-1]))
        return np.swapaxes(out, 1, 2)
    return reference


def _attention_inputs(q, k, v):
    # The error model's q is the scaled one (logits = q k / sqrt(d)).
    return _heads_first(q) / math.sqrt(q.shape[-1]), _heads_first(k), _heads_first(v)


def _ragged_dot(lhs, rhs, group_sizes):
    return _ops()[1](lhs, rhs, group_sizes=group_sizes)


def _ragged_dot_args(k: int):
    def args():
        m, n, g = 256, 256, 4
        return (_normal(80, (m, k)), _normal(81, (g, k, n)),
                jnp.asarray([100, 0, 28, 128], jnp.int32))
    return args


TOKAMAX_CASES = [
    Case("tokamax_flash_attention", _attention(False), _attention_args,
         _attention_reference(False), reduction_length=256, attention_inputs=_attention_inputs),
    Case("tokamax_flash_attention_causal", _attention(True), _attention_args,
         _attention_reference(True), reduction_length=256, attention_inputs=_attention_inputs),
    Case("tokamax_ragged_dot", _ragged_dot, _ragged_dot_args(256), grouped_matmul64,
         reduction_length=256),
    # k = 200: the kernel reads whole (.., 128) tiles past the logical end and masks them
    Case("tokamax_ragged_dot_k200", _ragged_dot, _ragged_dot_args(200), grouped_matmul64,
         reduction_length=200),
]
