"""``flash_attention``: causal and not, grouped kv heads, beside plain XLA attention.

On a TPU it runs the seed material's flash attention size (sequence 32768,
head_dim 128, 8 query heads) with 2 kv heads (GQA). Plain XLA would
materialise every head's (32768, 32768) logits (32 GiB in float32), so the
baseline there is the same jnp attention over chunks of query rows.
"""

import functools
import math

import jax
import jax.numpy as jnp
import pytest

from pytest_pallas.reference_kernels import flash_attention as fa

pytestmark = pytest.mark.pallas

# b, h, g, s, t, d, dtype.
SIZES = {
    "cpu": (1, 4, 2, 256, 256, 64, "float32"),
    "tpu": (1, 8, 2, 32768, 32768, 128, "bfloat16"),
}
QUERY_CHUNK = {"cpu": 256, "tpu": 2048}


def xla_flash_attention(q, k, v, *, causal, sm_scale, query_chunk=None):
    """Plain jnp: k and v repeated to the query heads, float32 logits and softmax, the causal
    mask by ``jnp.where``; ``query_chunk`` rows of queries at a time when given."""
    h, g = q.shape[1], k.shape[1]
    k, v = jnp.repeat(k, h // g, axis=1), jnp.repeat(v, h // g, axis=1)
    s, t = q.shape[2], k.shape[2]

    def rows(q_rows, first_row):
        logits = sm_scale * jnp.einsum("bhsd,bhtd->bhst", q_rows, k,
                                       preferred_element_type=jnp.float32)
        if causal:
            row = first_row + jnp.arange(q_rows.shape[2])[:, None]
            logits = jnp.where(jnp.arange(t)[None, :] > row, -jnp.inf, logits)
        weights = jax.nn.softmax(logits, axis=-1)
        return jnp.einsum("bhst,bhtd->bhsd", weights, v.astype(jnp.float32)).astype(q.dtype)

    if query_chunk is None or query_chunk >= s:
        return rows(q, 0)
    chunks = q.reshape(*q.shape[:2], s // query_chunk, query_chunk, q.shape[3])
    chunks = jnp.moveaxis(chunks, 2, 0)
    starts = jnp.arange(s // query_chunk) * query_chunk
    out = jax.lax.map(lambda args: rows(*args), (chunks, starts))
    return jnp.moveaxis(out, 0, 2).reshape(q.shape)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def bench_flash_attention(pallas_benchmark, scale, causal):
    b, h, g, s, t, d, dtype = SIZES[scale]
    q = pallas_benchmark.random((b, h, s, d), dtype)
    k, v = (pallas_benchmark.random((b, g, t, d), dtype) for _ in range(2))
    pallas_benchmark(
        "flash_attention", fa.flash_attention, q, k, v,
        causal=causal, sm_scale=1 / math.sqrt(d),
        xla_fn=functools.partial(xla_flash_attention, query_chunk=QUERY_CHUNK[scale]),
        cost=fa.flash_attention_cost(q, k, v, causal=causal),
        implementation="flash_attention",
    )
