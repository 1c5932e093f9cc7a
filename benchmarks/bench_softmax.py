"""Row softmax: the reference kernel at its default blocks and at a chosen ``block_rows``."""

import pytest

from pytest_pallas.reference_kernels import softmax

pytestmark = pytest.mark.pallas

# (rows, cols), dtype.
SIZES = {
    "cpu": ((256, 1024), "float32"),
    "tpu": ((16384, 8192), "bfloat16"),
}


@pytest.mark.bench_op("softmax")
def bench_softmax(pallas_benchmark, implementation, kernel, scale):
    shape, dtype = SIZES[scale]
    x = pallas_benchmark.random(shape, dtype)
    pallas_benchmark("softmax", kernel, x, implementation=implementation.description)


def bench_softmax_row_blocked(pallas_benchmark, scale):
    shape, dtype = SIZES[scale]
    block_rows = 64 if scale == "cpu" else 128
    x = pallas_benchmark.random(shape, dtype)
    pallas_benchmark("softmax", softmax.softmax_row_blocked, x,
                     blocks={"block_rows": block_rows}, implementation="softmax_row_blocked")
