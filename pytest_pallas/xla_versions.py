"""The built-in ops written in plain ``jax.numpy``: what XLA makes of them without Pallas.

Same signature, dtypes and accumulation as the contract (float32 accumulation
for bfloat16 inputs), so that a kernel is compared with the version a user
would otherwise write: the benchmarks' baseline (``Operation.xla``) and, for
an op without a hand-written cost model, the source of ``pl.estimate_cost``.
JAX is imported when a function is called, not when this module is.
"""

from __future__ import annotations

from typing import Any


def add(x: Any, y: Any) -> Any:
    return x + y


def sum_leading_axis(x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.sum(x, axis=0, dtype=jnp.float32).astype(x.dtype)


def matmul(x: Any, y: Any) -> Any:
    import jax.numpy as jnp

    return jnp.matmul(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def matmul_activation(x: Any, y: Any, *, activation: Any) -> Any:
    import jax.numpy as jnp

    product = jnp.matmul(x, y, preferred_element_type=jnp.float32)
    return (product if activation is None else activation(product)).astype(x.dtype)


def softmax(x: Any) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def attention(q: Any, k: Any, v: Any) -> Any:
    import jax
    import jax.numpy as jnp

    f32 = jnp.float32
    # Leading axes batch; a size-1 axis of k and v (mqa's heads) broadcasts.
    logits = jnp.einsum("...sd,...td->...st", q, k, preferred_element_type=f32)
    weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("...st,...td->...sd", weights, v.astype(f32), preferred_element_type=f32)
    return out.astype(q.dtype)


def mqa(q: Any, k: Any, v: Any) -> Any:
    return attention(q, k[:, None], v[:, None])


def copy(x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.copy(x)


def ppermute(x: Any, *, axis_name: Any, shift: int) -> Any:
    import jax

    n = jax.lax.axis_size(axis_name)
    return jax.lax.ppermute(x, axis_name, [(i, (i + shift) % n) for i in range(n)])
