"""``sum`` over the leading axis: the tiled reference kernel and the whole-slab variant."""

import pytest

from pytest_pallas.reference_kernels import reduction

pytestmark = pytest.mark.pallas

# (n, r, c), dtype: n slices of (r, c) summed into one.
SIZES = {
    "cpu": ((8, 256, 512), "float32"),
    "tpu": ((64, 2048, 4096), "bfloat16"),
}


@pytest.mark.bench_op("sum")
def bench_sum(pallas_benchmark, implementation, kernel, scale):
    shape, dtype = SIZES[scale]
    x = pallas_benchmark.random(shape, dtype)
    pallas_benchmark("sum", kernel, x, implementation=implementation.description)


def bench_sum_whole_slab(pallas_benchmark, scale):
    shape, dtype = SIZES[scale]
    if scale == "tpu":
        shape = (64, 512, 2048)  # one (r, c) slab per grid step must fit in VMEM
    x = pallas_benchmark.random(shape, dtype)
    pallas_benchmark("sum", reduction.sum_leading_axis_whole_slab, x,
                     implementation="sum_leading_axis_whole_slab")
