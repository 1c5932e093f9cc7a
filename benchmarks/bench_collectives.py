"""Collectives by remote DMA: ``ppermute`` and ``all_gather`` inside ``jax.shard_map``.

All the devices JAX sees form a ring (8 simulated CPU devices by default, every
chip of the slice on a TPU). Times are of the whole ``shard_map`` call; the
roofline spans all devices.
"""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from pytest_pallas.bench.fixture import xla_version
from pytest_pallas.reference_kernels import collectives

# Simulated devices on the CPU: the plugin skips these, saying why, when JAX sees fewer.
pytestmark = [pytest.mark.pallas, pytest.mark.devices(2)]

# Per-device block (rows, cols), dtype. TPU: 64 MiB per device. CPU: 64 KiB, for a quick run
# (blocks of 100 KiB and more once hung the interpreter on 8 devices: see
# pytest_pallas/_compat/interpreter_fixes.py, interpreter_callbacks_on_host_arrays).
SIZES = {
    "cpu": ((32, 512), "float32"),
    "tpu": ((2048, 8192), "float32"),
}
AXIS = "ring"


def _ring():
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip(f"a ring needs 2 or more devices, JAX sees {len(devices)}")
    return Mesh(np.array(devices), (AXIS,))


def _sharded(function, mesh):
    return jax.shard_map(function, mesh=mesh, in_specs=PartitionSpec(AXIS),
                         out_specs=PartitionSpec(AXIS), check_vma=False)


@pytest.mark.bench_op("ppermute")
def bench_ppermute(pallas_benchmark, implementation, kernel, scale):
    mesh = _ring()
    n = mesh.shape[AXIS]
    (rows, cols), dtype = SIZES[scale]
    x = pallas_benchmark.random((n * rows, cols), dtype)
    block = jax.ShapeDtypeStruct((rows, cols), x.dtype)
    per_device = collectives.ppermute_cost(block, num_devices=n, shift=1)
    cost = type(per_device)(flops=0, transcendentals=0,
                            bytes_accessed=n * per_device.bytes_accessed,
                            remote_bytes_transferred=n * per_device.remote_bytes_transferred)
    pallas_benchmark(
        "ppermute",
        _sharded(functools.partial(kernel, axis_name=AXIS, shift=1), mesh), x,
        xla_fn=_sharded(functools.partial(xla_version("ppermute"), axis_name=AXIS, shift=1), mesh),
        cost=cost, devices=n, implementation=implementation.description,
    )


# The plain-XLA version is the record's (pytest_pallas.ops.xla_versions.all_gather).
xla_all_gather = xla_version("all_gather")


def bench_all_gather(pallas_benchmark, scale):
    mesh = _ring()
    n = mesh.shape[AXIS]
    (rows, cols), dtype = SIZES[scale]
    # Each device receives all n blocks: n times less per block keeps the output's size.
    rows = max(1, rows // n)
    x = pallas_benchmark.random((n * rows, cols), dtype)
    per_device = collectives.all_gather_cost(jax.ShapeDtypeStruct((rows, cols), x.dtype),
                                             num_devices=n)
    cost = type(per_device)(flops=0, transcendentals=0,
                            bytes_accessed=n * per_device.bytes_accessed,
                            remote_bytes_transferred=n * per_device.remote_bytes_transferred)

    def gathered(function):
        # Every device returns all n blocks; the mesh stacks the n copies.
        return _sharded(functools.partial(function, axis_name=AXIS), mesh)

    pallas_benchmark(
        "all_gather", gathered(collectives.all_gather), x,
        xla_fn=gathered(xla_all_gather),
        cost=cost, devices=n, implementation="all_gather",
    )


# The plain-XLA version is the record's (pytest_pallas.ops.xla_versions.reduce_scatter).
xla_reduce_scatter = xla_version("reduce_scatter")


def bench_reduce_scatter(pallas_benchmark, scale):
    mesh = _ring()
    n = mesh.shape[AXIS]
    (rows, cols), dtype = SIZES[scale]
    # Each device holds all n blocks of x: n times less per block keeps its size.
    rows = max(1, rows // n)
    x = pallas_benchmark.random((n * n * rows, cols), dtype)
    per_device = collectives.reduce_scatter_cost(
        jax.ShapeDtypeStruct((n * rows, cols), x.dtype), num_devices=n)
    cost = type(per_device)(flops=n * per_device.flops, transcendentals=0,
                            bytes_accessed=n * per_device.bytes_accessed,
                            remote_bytes_transferred=n * per_device.remote_bytes_transferred)

    def scattered(function):
        return _sharded(functools.partial(function, axis_name=AXIS), mesh)

    pallas_benchmark(
        "reduce_scatter", scattered(collectives.reduce_scatter), x,
        xla_fn=scattered(xla_reduce_scatter),
        cost=cost, devices=n, implementation="reduce_scatter",
    )
