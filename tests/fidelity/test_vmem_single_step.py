"""Class 9: a call with no grid (or a grid of one step) keeps one copy of each block.

Settled against the TPU compiler (libtpu 0.0.42.1, ahead-of-time compilation for a v5e
topology, 16 MiB scoped VMEM): a whole-array float32 matmul compiles at 1152 x 1152
(15.2 MiB single-buffered, 30.4 MiB if double-buffered) and is rejected at 1280
(18.8 MiB single-buffered), with no grid and with grid=(1,) alike.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from pytest_pallas.checks.kernel_check import CheckOptions, check_kernel
from pytest_pallas.checks.violations import TpuRuleViolation
from pytest_pallas.checks.vmem_footprint import VMEM

STATIC_ONLY = CheckOptions(lower_for_tpu=False)


def _kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def gridless(x, y):
    return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32))(x, y)


def one_step(x, y):
    n = x.shape[0]
    spec = pl.BlockSpec((n, n), lambda i: (0, 0))
    return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32),
                          grid=(1,), in_specs=[spec, spec], out_specs=spec)(x, y)


@pytest.mark.parametrize("call", [gridless, one_step])
@pytest.mark.parametrize("n", [1024, 1152])
def test_what_the_compiler_accepts_passes(call, n):
    x = jax.ShapeDtypeStruct((n, n), jnp.float32)
    (report,) = check_kernel(call, x, x, chip="v5e", check_options=STATIC_ONLY)
    assert report.vmem_bytes == 3 * n * n * 4


@pytest.mark.parametrize("call", [gridless, one_step])
def test_what_the_compiler_rejects_fails_saying_single_buffered(call):
    x = jax.ShapeDtypeStruct((1280, 1280), jnp.float32)
    with pytest.raises(TpuRuleViolation, match="single-buffered: a grid of one step") as failure:
        check_kernel(call, x, x, chip="v5e", check_options=STATIC_ONLY)
    assert failure.value.rule == VMEM
