"""Data movement by hand: ``copy`` and the other DMA kernels of the reference module."""

import jax.numpy as jnp
import pytest

from pytest_pallas.reference_kernels import dma

pytestmark = pytest.mark.pallas

# (rows, cols), dtype. TPU: 256 MiB, streamed through VMEM in chunks.
SIZES = {
    "cpu": ((1024, 1024), "float32"),
    "tpu": ((8192, 8192), "float32"),
}


@pytest.mark.bench_op("copy")
def bench_copy(pallas_benchmark, implementation, kernel, scale):
    shape, dtype = SIZES[scale]
    x = pallas_benchmark.random(shape, dtype)
    pallas_benchmark("copy", kernel, x, implementation=implementation.description)


def bench_double_buffered_copy(pallas_benchmark, scale):
    shape, dtype = SIZES[scale]
    x = pallas_benchmark.random(shape, dtype)
    pallas_benchmark("copy", dma.double_buffered_copy, x, implementation="double_buffered_copy")


def xla_add_one(x):
    return x + 1


def xla_gather_rows(x, indices):
    return x[indices]


def bench_add_one_in_place(pallas_benchmark, scale):
    shape, dtype = SIZES[scale]
    x = pallas_benchmark.random(shape, dtype)
    pallas_benchmark("add_one_in_place", dma.add_one_in_place, x, xla_fn=xla_add_one,
                     cost=dma.add_one_in_place_cost(x), implementation="add_one_in_place")


def bench_add_refs_style(pallas_benchmark, scale):
    shape, dtype = SIZES[scale]
    x, y = pallas_benchmark.random(shape, dtype), pallas_benchmark.random(shape, dtype)
    pallas_benchmark("add", dma.add_refs_style, x, y, implementation="add_refs_style")


def bench_gather_rows(pallas_benchmark, scale):
    shape, dtype = SIZES[scale]
    x = pallas_benchmark.random(shape, dtype)
    count = 16 if scale == "cpu" else 2048
    indices = jnp.abs(pallas_benchmark.random((count,), "int32")) % shape[0]
    pallas_benchmark("gather_rows", dma.gather_rows, x, indices,
                     xla_fn=xla_gather_rows,
                     cost=dma.gather_rows_cost(x, indices), implementation="gather_rows")
