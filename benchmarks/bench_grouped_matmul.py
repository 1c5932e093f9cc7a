"""``grouped_matmul`` (mixture of experts), beside plain XLA's one-hot formulation.

The group sizes are drawn by ``grouped_matmul_inputs`` (seeded): ragged, with
empty groups, or every row in one group.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from pytest_pallas.bench.fixture import xla_version
from pytest_pallas.reference_kernels import grouped_matmul as gm

pytestmark = pytest.mark.pallas

# m, k, n, g, dtype. TPU: 8192 tokens, model width 4096, expert width 1024, 8 experts.
SIZES = {
    "cpu": (256, 256, 256, 4, "float32"),
    "tpu": (8192, 4096, 1024, 8, "bfloat16"),
}


# The plain-XLA version is the record's (pytest_pallas.ops.xla_versions.grouped_matmul).
xla_grouped_matmul = xla_version("grouped_matmul")


@pytest.mark.parametrize("seed", [0, 1], ids=["draw-0", "draw-1"])
def bench_grouped_matmul(pallas_benchmark, scale, seed):
    m, k, n, g, dtype = SIZES[scale]
    lhs, rhs = pallas_benchmark.random((m, k), dtype), pallas_benchmark.random((g, k, n), dtype)
    _, _, sizes = gm.grouped_matmul_inputs({"m": m, "k": 1, "n": 1, "g": g}, "float32",
                                           np.random.default_rng(seed))
    group_sizes = jnp.asarray(sizes)
    pallas_benchmark("grouped_matmul", gm.grouped_matmul, lhs, rhs, group_sizes,
                     xla_fn=xla_grouped_matmul, cost=gm.grouped_matmul_cost(lhs, rhs, group_sizes),
                     implementation="grouped_matmul")
