"""Matrix products: ``matmul``, ``matmul_activation``, ``batched_matmul`` and the
emit_pipeline form."""

import jax
import pytest

from pytest_pallas.reference_kernels import matmul

pytestmark = pytest.mark.pallas

# (m, k, n), dtype.
SIZES = {
    "cpu": ((256, 512, 256), "float32"),
    "tpu": ((4096, 4096, 4096), "bfloat16"),
}
# (b, m, k, n), dtype. TPU: the seed material's 4 x 1024 x 2048 x 4096.
BATCHED_SIZES = {
    "cpu": ((2, 128, 256, 256), "float32"),
    "tpu": ((4, 1024, 2048, 4096), "bfloat16"),
}


def _operands(pallas_benchmark, m, k, n, dtype, batch=()):
    return (pallas_benchmark.random((*batch, m, k), dtype),
            pallas_benchmark.random((*batch, k, n), dtype))


@pytest.mark.bench_op("matmul")
def bench_matmul(pallas_benchmark, implementation, kernel, scale):
    (m, k, n), dtype = SIZES[scale]
    x, y = _operands(pallas_benchmark, m, k, n, dtype)
    pallas_benchmark("matmul", kernel, x, y, implementation=implementation.description)


@pytest.mark.bench_op("matmul_activation")
def bench_matmul_gelu(pallas_benchmark, implementation, kernel, scale):
    (m, k, n), dtype = SIZES[scale]
    x, y = _operands(pallas_benchmark, m, k, n, dtype)
    pallas_benchmark("matmul_activation", kernel, x, y, activation=jax.nn.gelu,
                     implementation=implementation.description)


@pytest.mark.bench_op("batched_matmul")
def bench_batched_matmul(pallas_benchmark, implementation, kernel, scale):
    (b, m, k, n), dtype = BATCHED_SIZES[scale]
    x, y = _operands(pallas_benchmark, m, k, n, dtype, batch=(b,))
    pallas_benchmark("batched_matmul", kernel, x, y, implementation=implementation.description)


def bench_matmul_blocked(pallas_benchmark, scale):
    (m, k, n), dtype = SIZES[scale]
    x, y = _operands(pallas_benchmark, m, k, n, dtype)
    blocks = ({"block_m": 128, "block_k": 256, "block_n": 128} if scale == "cpu"
              else {"block_m": 1024, "block_k": 1024, "block_n": 1024})
    pallas_benchmark("matmul", matmul.matmul_blocked, x, y, blocks=blocks,
                     implementation="matmul_blocked")


def bench_matmul_emit_pipeline(pallas_benchmark, scale):
    (m, k, n), dtype = SIZES[scale]
    x, y = _operands(pallas_benchmark, m, k, n, dtype)
    pallas_benchmark("matmul", matmul.matmul_emit_pipeline, x, y,
                     implementation="matmul_emit_pipeline")
