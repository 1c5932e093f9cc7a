"""Implementations wrong on one structural value only: a head ratio, a page size, s != t, a
one-element row.

Each is plain ``jax.numpy`` (a valid implementation of its op), right on every input
whose structure avoids its bug, and each bug shows on one value of a dimension of the
op's own sizes or a combination of two, which the sweep's two shapes never take: before
the sweep's structural cases (``pytest_pallas/ops/structural_sweep.py``), whether the suite
caught it depended on the seed. The ring walked the wrong way, wrong only on more than
two devices, is ``kernels.ppermute_wrong_direction``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _attention(q, k, v, mask, sm_scale):
    logits = sm_scale * jnp.einsum("bhsd,bhtd->bhst", q.astype(jnp.float32),
                                   k.astype(jnp.float32))
    logits = jnp.where(mask, logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhst,bhtd->bhsd", weights, v.astype(jnp.float32)).astype(q.dtype)


def _causal_mask(s, t, causal):
    if not causal:
        return jnp.ones((s, t), bool)
    return jnp.arange(t)[None, :] <= jnp.arange(s)[:, None]


def flash_attention_gqa_head_modulo(q, k, v, *, causal, sm_scale):
    """Query head i reads kv head ``i % g`` instead of ``i // (h // g)``.

    Right for MHA (g = h) and MQA (g = 1), where the two agree; wrong for GQA with
    1 < g < h (h = 4, g = 2: head 1 reads kv head 1 instead of 0).

    Models: the two ways of laying heads out over kv groups, mixed up.
    """
    h, g = q.shape[1], k.shape[1]
    heads = jnp.arange(h) % g  # BUG: jnp.arange(h) // (h // g)
    s, t = q.shape[2], k.shape[2]
    return _attention(q, k[:, heads], v[:, heads], _causal_mask(s, t, causal), sm_scale)


def flash_attention_key_mask_from_query_length(q, k, v, *, causal, sm_scale):
    """Keys past the query length are masked as padding: the mask is built from s, not t.

    Right whenever s = t (always under the causal mask) or t < s; wrong when t > s.

    Models: a padded-key mask written for self-attention, reused for cross-attention.
    """
    s, t = q.shape[2], k.shape[2]
    padding = jnp.arange(t)[None, :] < s  # BUG: the valid keys are the first t, all of them
    mask = _causal_mask(s, t, causal) & padding
    h, g = q.shape[1], k.shape[1]
    heads = jnp.arange(h) // (h // g)
    return _attention(q, k[:, heads], v[:, heads], mask, sm_scale)


_PAGE_SIZE = 16


def paged_attention_page_size_16(q, k_pages, v_pages, lengths, page_indices):
    """Decode attention whose token positions assume pages of 16 tokens.

    Right for page_size 16 and for sequences within their first page; for page_size 8 the
    tokens of a sequence's later pages get positions as if its pages held 16, past its
    length, and are dropped.

    Models: a page size hard-coded from the serving configuration it was written for.
    """
    b, h, d = q.shape
    g, _, page_size, _ = k_pages.shape
    pages_per_sequence = page_indices.shape[1]
    k = k_pages[:, page_indices].reshape(g, b, pages_per_sequence * page_size, d)
    v = v_pages[:, page_indices].reshape(g, b, pages_per_sequence * page_size, d)
    heads = jnp.arange(h) // (h // g)
    k, v = jnp.moveaxis(k, 0, 1)[:, heads], jnp.moveaxis(v, 0, 1)[:, heads]  # (b, h, T, d)
    page = jnp.arange(pages_per_sequence * page_size) // page_size
    position = page * _PAGE_SIZE + jnp.arange(pages_per_sequence * page_size) % page_size  # BUG
    mask = position[None, :] < lengths[:, None]  # (b, T)
    logits = jnp.einsum("bhd,bhtd->bht", q.astype(jnp.float32), k.astype(jnp.float32))
    logits = jnp.where(mask[:, None, :], logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bht,bhtd->bhd", weights, v.astype(jnp.float32)).astype(q.dtype)


def rms_norm_without_eps(x, w, *, eps):
    """RMS norm as ``x * rsqrt(mean(x^2)) * w``: eps is accepted and never added.

    Right to the tolerance wherever a row's mean square is far above eps (1e-6), as it is
    for every row of many columns of O(1) values; wrong on a row whose few values are
    small or zero (cols = 1: ``x / |x|`` instead of ``x / sqrt(x^2 + eps)``, and
    ``0 * inf = NaN`` for a zero).

    Models: the textbook formula, with the guard against a zero row forgotten.
    """
    del eps  # BUG: rsqrt(mean(x^2) + eps)
    x32 = x.astype(jnp.float32)
    inverse = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True))
    return (x32 * inverse * w.astype(jnp.float32)).astype(x.dtype)
