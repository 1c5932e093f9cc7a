"""Elementwise add: the contract's ``add`` and the three grid layouts of the reference module."""

import pytest

from pytest_pallas.reference_kernels import elementwise

pytestmark = pytest.mark.pallas

# (rows, cols), dtype. TPU: 256 MiB per operand, far beyond VMEM, so blocks stream from HBM.
SIZES = {
    "cpu": ((512, 1024), "float32"),
    "tpu": ((8192, 8192), "float32"),
}


@pytest.mark.bench_op("add")
def bench_add(pallas_benchmark, implementation, kernel, scale):
    shape, dtype = SIZES[scale]
    x, y = pallas_benchmark.random(shape, dtype), pallas_benchmark.random(shape, dtype)
    pallas_benchmark("add", kernel, x, y, implementation=implementation.description)


@pytest.mark.parametrize("layout", ["add_1d_grid", "add_2d_grid"])
def bench_add_layout(pallas_benchmark, scale, layout):
    shape, dtype = SIZES[scale]
    x, y = pallas_benchmark.random(shape, dtype), pallas_benchmark.random(shape, dtype)
    pallas_benchmark("add", getattr(elementwise, layout), x, y, implementation=layout)


def bench_add_whole_array(pallas_benchmark):
    # No grid: x, y and the sum must fit in the default scoped VMEM together, on any chip.
    shape = (512, 1024)
    x, y = pallas_benchmark.random(shape), pallas_benchmark.random(shape)
    pallas_benchmark("add", elementwise.add_whole_array, x, y, implementation="add_whole_array")
