"""Flash attention: ``attention``, ``mha``, ``mqa`` and a sweep of ``flash_attention``'s blocks.

On a TPU, ``mha`` runs the seed material's size: sequence 32768, head_dim 128,
2 x 8 batch-heads. Plain XLA would materialise the (32768, 32768) logits of
every head (64 GiB in float32), so its baseline there is the same jnp
attention computed over chunks of query rows (``attention_by_query_chunks``).
"""

import jax
import jax.numpy as jnp
import pytest

from pytest_pallas.bench.fixture import xla_version
from pytest_pallas.reference_kernels import attention

pytestmark = pytest.mark.pallas

# s, t, d, dtype.
ATTENTION_SIZES = {
    "cpu": (256, 256, 128, "float32"),
    "tpu": (8192, 8192, 128, "bfloat16"),
}
# b, h, s, t, d, dtype.
MHA_SIZES = {
    "cpu": (1, 2, 256, 256, 128, "float32"),
    "tpu": (2, 8, 32768, 32768, 128, "bfloat16"),
}
MQA_SIZES = {
    "cpu": (1, 2, 256, 256, 128, "float32"),
    "tpu": (2, 8, 4096, 4096, 128, "bfloat16"),
}
# (block_q, block_kv) of the sweep.
BLOCKS = {
    "cpu": [(128, 128), (256, 256)],
    "tpu": [(128, 512), (256, 512), (512, 1024), (1024, 1024)],
}
QUERY_CHUNK = 2048


def attention_by_query_chunks(q, k, v):
    """Plain jnp attention, ``QUERY_CHUNK`` query rows at a time (logits of one chunk in memory)."""
    *batch, s, d = q.shape
    chunks = q.reshape(*batch, s // QUERY_CHUNK, QUERY_CHUNK, d)
    chunks = jnp.moveaxis(chunks, -3, 0)
    out = jax.lax.map(lambda chunk: xla_version("mha")(chunk, k, v), chunks)
    return jnp.moveaxis(out, 0, -3).reshape(q.shape)


@pytest.mark.bench_op("attention")
def bench_attention(pallas_benchmark, implementation, kernel, scale):
    s, t, d, dtype = ATTENTION_SIZES[scale]
    q = pallas_benchmark.random((s, d), dtype)
    k, v = pallas_benchmark.random((t, d), dtype), pallas_benchmark.random((t, d), dtype)
    pallas_benchmark("attention", kernel, q, k, v, implementation=implementation.description)


@pytest.mark.bench_op("mha")
def bench_mha(pallas_benchmark, implementation, kernel, scale):
    b, h, s, t, d, dtype = MHA_SIZES[scale]
    q = pallas_benchmark.random((b, h, s, d), dtype)
    k = pallas_benchmark.random((b, h, t, d), dtype)
    v = pallas_benchmark.random((b, h, t, d), dtype)
    xla_fn = attention_by_query_chunks if scale == "tpu" else xla_version("mha")
    pallas_benchmark("mha", kernel, q, k, v, xla_fn=xla_fn,
                     implementation=implementation.description)


@pytest.mark.bench_op("mqa")
def bench_mqa(pallas_benchmark, implementation, kernel, scale):
    b, h, s, t, d, dtype = MQA_SIZES[scale]
    q = pallas_benchmark.random((b, h, s, d), dtype)
    k, v = pallas_benchmark.random((b, t, d), dtype), pallas_benchmark.random((b, t, d), dtype)
    pallas_benchmark("mqa", kernel, q, k, v, implementation=implementation.description)


def pytest_generate_tests(metafunc):
    if metafunc.definition.name == "bench_flash_attention_blocks":
        blocks = BLOCKS["tpu" if metafunc.config.getoption("--pallas-tpu") else "cpu"]
        metafunc.parametrize("block_q, block_kv", blocks, ids=[f"{q}x{kv}" for q, kv in blocks])


def bench_flash_attention_blocks(pallas_benchmark, scale, block_q, block_kv):
    s, t, d, dtype = ATTENTION_SIZES[scale]
    q = pallas_benchmark.random((s, d), dtype)
    k, v = pallas_benchmark.random((t, d), dtype), pallas_benchmark.random((t, d), dtype)
    pallas_benchmark("attention", attention.flash_attention, q, k, v,
                     blocks={"block_q": block_q, "block_kv": block_kv},
                     implementation="flash_attention")
