"""``rms_norm``: one fused pass over x, beside plain XLA (which fuses it too)."""

import pytest

from pytest_pallas.bench.fixture import xla_version
from pytest_pallas.reference_kernels import norms

pytestmark = pytest.mark.pallas

# (rows, cols), dtype. TPU: a batch of 8 x 4096 tokens of a 4096-wide model.
SIZES = {
    "cpu": ((512, 1024), "float32"),
    "tpu": ((32768, 4096), "bfloat16"),
}
EPS = 1e-6


# The plain-XLA version is the record's (pytest_pallas.ops.xla_versions.rms_norm).
xla_rms_norm = xla_version("rms_norm")


def bench_rms_norm(pallas_benchmark, scale):
    (rows, cols), dtype = SIZES[scale]
    x, w = pallas_benchmark.random((rows, cols), dtype), pallas_benchmark.random((cols,), dtype)
    pallas_benchmark("rms_norm", norms.rms_norm, x, w, eps=EPS, xla_fn=xla_rms_norm,
                     cost=norms.rms_norm_cost(x, w), implementation="rms_norm")
