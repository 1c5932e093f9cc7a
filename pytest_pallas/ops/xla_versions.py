"""The built-in ops written in plain ``jax.numpy``: what XLA makes of them without Pallas.

Same signature, dtypes and accumulation as the contract (float32 accumulation
for bfloat16 inputs), so that a kernel is compared with the version a user
would otherwise write: the benchmarks' baseline (``Operation.xla``) and, for
an op without a hand-written cost model, the source of ``pl.estimate_cost``.
JAX is imported when a function is called, not when this module is.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def add(x: Any, y: Any) -> Any:
    return x + y


def sum_leading_axis(x: Any) -> Any:
    return jnp.sum(x, axis=0, dtype=jnp.float32).astype(x.dtype)


def matmul(x: Any, y: Any) -> Any:
    return jnp.matmul(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def matmul_activation(x: Any, y: Any, *, activation: Any) -> Any:
    product = jnp.matmul(x, y, preferred_element_type=jnp.float32)
    return (product if activation is None else activation(product)).astype(x.dtype)


def softmax(x: Any) -> Any:
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def attention(q: Any, k: Any, v: Any) -> Any:
    f32 = jnp.float32
    # Leading axes batch; a size-1 axis of k and v (mqa's heads) broadcasts.
    logits = jnp.einsum("...sd,...td->...st", q, k, preferred_element_type=f32)
    weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("...st,...td->...sd", weights, v.astype(f32), preferred_element_type=f32)
    return out.astype(q.dtype)


def mqa(q: Any, k: Any, v: Any) -> Any:
    return attention(q, k[:, None], v[:, None])


def copy(x: Any) -> Any:
    return jnp.copy(x)


def ppermute(x: Any, *, axis_name: Any, shift: int) -> Any:
    n = jax.lax.axis_size(axis_name)
    return jax.lax.ppermute(x, axis_name, [(i, (i + shift) % n) for i in range(n)])


def flash_attention(q: Any, k: Any, v: Any, *, causal: bool, sm_scale: float) -> Any:
    """k and v repeated to the query heads, float32 logits and softmax, the causal mask by
    ``jnp.where``."""
    h, g = q.shape[1], k.shape[1]
    k, v = jnp.repeat(k, h // g, axis=1), jnp.repeat(v, h // g, axis=1)
    s, t = q.shape[2], k.shape[2]
    logits = sm_scale * jnp.einsum("bhsd,bhtd->bhst", q, k, preferred_element_type=jnp.float32)
    if causal:
        logits = jnp.where(jnp.arange(t)[None, :] > jnp.arange(s)[:, None], -jnp.inf, logits)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhst,bhtd->bhsd", weights, v.astype(jnp.float32)).astype(q.dtype)


def rms_norm(x: Any, w: Any, *, eps: float) -> Any:
    """In float32, rounded once to x's dtype."""
    x32 = x.astype(jnp.float32)
    inverse = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * inverse * w.astype(jnp.float32)).astype(x.dtype)


def grouped_matmul(lhs: Any, rhs: Any, group_sizes: Any) -> Any:
    """Every row times every group's rhs, the wrong groups masked away (g times the flops of
    the op: what a dense formulation costs)."""
    ends = jnp.cumsum(group_sizes)
    group_of_row = jnp.searchsorted(ends, jnp.arange(lhs.shape[0]), side="right")
    products = jnp.einsum("mk,gkn->gmn", lhs, rhs, preferred_element_type=jnp.float32)
    one_hot = jax.nn.one_hot(group_of_row, rhs.shape[0], dtype=jnp.float32)
    return jnp.einsum("gmn,mg->mn", products, one_hot).astype(lhs.dtype)


def quantized_matmul(x: Any, w: Any, scale: Any) -> Any:
    """w converted to x's dtype (exact: int8 fits bfloat16's 8-bit mantissa), the product in
    float32, then the column scale."""
    product = jnp.matmul(x, w.astype(x.dtype), preferred_element_type=jnp.float32)
    return (product * scale).astype(x.dtype)


def paged_attention(q: Any, k_pages: Any, v_pages: Any, lengths: Any, page_indices: Any) -> Any:
    """Every sequence's pages gathered to a dense (b, g, capacity, d) cache, the positions past
    each length masked, attention in float32."""
    b, h, d = q.shape
    g = k_pages.shape[0]
    k = k_pages[:, page_indices].reshape(g, b, -1, d).swapaxes(0, 1)
    v = v_pages[:, page_indices].reshape(g, b, -1, d).swapaxes(0, 1)
    grouped = q.reshape(b, g, h // g, d)
    logits = jnp.einsum("bgqd,bgtd->bgqt", grouped, k, preferred_element_type=jnp.float32)
    visible = jnp.arange(k.shape[2])[None, :] < lengths[:, None]
    logits = jnp.where(visible[:, None, None, :], logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bgqt,bgtd->bgqd", weights, v.astype(jnp.float32))
    return out.reshape(b, h, d).astype(q.dtype)


def all_gather(x: Any, *, axis_name: Any) -> Any:
    return jax.lax.all_gather(x, axis_name, tiled=True)


def reduce_scatter(x: Any, *, axis_name: Any) -> Any:
    return jax.lax.psum_scatter(x, axis_name, tiled=True)
