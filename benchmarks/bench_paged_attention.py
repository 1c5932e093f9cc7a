"""``paged_attention`` (decode over page tables), beside plain XLA's gather-then-attend.

Lengths and shuffled page tables come from ``paged_attention_inputs`` (seeded):
1, a page boundary, full capacity, and random lengths for the other sequences.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from pytest_pallas.bench.fixture import xla_version
from pytest_pallas.reference_kernels import paged_attention as pa

pytestmark = pytest.mark.pallas

# TPU: 32 sequences of up to 4096 tokens, 32 query heads over 8 kv heads, d=128,
# pages of 16 tokens.
SIZES = {
    "cpu": (dict(b=4, h=4, g=2, d=64, pages=64, page_size=16, pages_per_sequence=16),
            "float32"),
    "tpu": (dict(b=32, h=32, g=8, d=128, pages=8192, page_size=16, pages_per_sequence=256),
            "bfloat16"),
}


# The plain-XLA version is the record's (pytest_pallas.ops.xla_versions.paged_attention).
xla_paged_attention = xla_version("paged_attention")


def bench_paged_attention(pallas_benchmark, scale):
    dims, dtype = SIZES[scale]
    args = pa.paged_attention_inputs(dims, dtype, np.random.default_rng(0))
    args = tuple(jnp.asarray(a) for a in args)
    pallas_benchmark("paged_attention", pa.paged_attention, *args,
                     xla_fn=xla_paged_attention, cost=pa.paged_attention_cost(*args),
                     implementation="paged_attention")
