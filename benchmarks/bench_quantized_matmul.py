"""``quantized_matmul`` (int8 weights, per-column scales), beside plain XLA.

Two shapes: decode (few rows, bound by reading w, where int8 pays) and prefill.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from pytest_pallas.bench.fixture import xla_version
from pytest_pallas.reference_kernels import quantized_matmul as qm

pytestmark = pytest.mark.pallas

# name -> (m, k, n), dtype of x.
SIZES = {
    "cpu": {"decode": ((8, 1024, 1024), "float32"), "prefill": ((256, 512, 256), "float32")},
    "tpu": {"decode": ((16, 8192, 8192), "bfloat16"),
            "prefill": ((4096, 8192, 8192), "bfloat16")},
}


# The plain-XLA version is the record's (pytest_pallas.ops.xla_versions.quantized_matmul).
xla_quantized_matmul = xla_version("quantized_matmul")


@pytest.mark.parametrize("shape", ["decode", "prefill"])
def bench_quantized_matmul(pallas_benchmark, scale, shape):
    (m, k, n), dtype = SIZES[scale][shape]
    _, w, column_scale = qm.quantized_matmul_inputs({"m": 1, "k": k, "n": n}, "float32",
                                                    np.random.default_rng(0))
    x = pallas_benchmark.random((m, k), dtype)
    w, column_scale = jnp.asarray(w), jnp.asarray(column_scale)
    pallas_benchmark("quantized_matmul", qm.quantized_matmul, x, w, column_scale,
                     xla_fn=xla_quantized_matmul, cost=qm.quantized_matmul_cost(x, w, column_scale),
                     implementation="quantized_matmul")
