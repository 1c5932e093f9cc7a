"""MaxText 0.2.5's ragged attention (decode attention over per-sequence lengths).

Installed with ``pip install --no-deps maxtext==0.2.5`` (constraints/corpus-2026.txt):
MaxText's own dependencies are a training stack (flax, orbax, grain, ...). The
kernel module takes one constant from ``maxtext.common.common_types`` (which
imports flax): a stand-in gives it the same value.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from .corpus import Case, _f64, _normal
from .kernel_modules import load_kernel_module

BATCH, HEADS, SEQUENCE, D, BLOCK = 2, 4, 512, 128, 128
LENGTHS = (200, 512)   # one sequence ends inside a block, one fills the cache


def _ragged_attention():
    return load_kernel_module(
        "maxtext.kernels.attention.ragged_attention",
        skip_init=("maxtext", "maxtext.kernels", "maxtext.kernels.attention"),
        stand_ins={"maxtext.common.common_types": {
            "DEFAULT_MASK_VALUE": -0.7 * float(np.finfo(np.float32).max)}})


def _args():
    q = _normal(300, (BATCH, 1, HEADS, D)) / np.float32(np.sqrt(D))
    k, v = (_normal(301 + i, (BATCH, SEQUENCE, HEADS, D)) for i in range(2))
    return q, k, v, jnp.asarray(LENGTHS, jnp.int32)


def _ragged_mha(q, k, v, lengths):
    return _ragged_attention().ragged_mha(q, k, v, lengths, block_size=BLOCK)


def _reference(q, k, v, lengths):
    """(o * l, m, l) as ragged_mha returns them: the unnormalised output, the largest logit
    and the softmax denominator, over each sequence's first ``lengths[b]`` keys."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    out = np.zeros(q.shape)
    top = np.zeros((*q.shape[:-1], 1))
    denominator = np.zeros((*q.shape[:-1], 1))
    for b, n in enumerate(np.asarray(lengths)):
        logits = np.einsum("hd,thd->ht", q[b, 0], k[b, :n])
        m = logits.max(-1, keepdims=True)
        weights = np.exp(logits - m)
        out[b, 0] = np.einsum("ht,thd->hd", weights, v[b, :n])
        top[b, 0], denominator[b, 0] = m, weights.sum(-1, keepdims=True)
    return out, top, denominator


MAXTEXT_CASES = [dataclasses.replace(case, package="maxtext") for case in [
    Case("maxtext_ragged_mha", _ragged_mha, _args, _reference, reduction_length=SEQUENCE),
]]
