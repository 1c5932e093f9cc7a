"""A GPU kernel author's tests, written for the GPU (no ``interpret=``): Mosaic GPU kernels
(``plgpu.kernel``, ``pl.core_map`` over a ``plgpu.Mesh``, ``pallas_call`` with
``plgpu.CompilerParams``) and Triton-parameter kernels. Under pytest-pallas they run on the
CPU, each in the interpreter that can run it. tests/test_gpu_kernels.py runs this module as
a user's ``test_gpu_author.py`` (its name keeps the project's own run from collecting it)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas import triton as pltriton

pytestmark = pytest.mark.pallas


@functools.partial(
    plgpu.kernel,
    out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
    scratch_types=dict(
        x_smem=plgpu.SMEM((8, 128), jnp.float32),
        out_smem=plgpu.SMEM((8, 128), jnp.float32),
        barrier=plgpu.Barrier(num_arrivals=1),
    ),
)
def scale_through_smem(x_gmem, out_gmem, x_smem, out_smem, barrier):
    """GMEM -> SMEM by TMA, compute, SMEM -> GMEM by TMA, each copy awaited."""
    plgpu.copy_gmem_to_smem(x_gmem, x_smem, barrier)
    plgpu.barrier_wait(barrier)
    out_smem[...] = x_smem[...] * 2.0 + 1.0
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem)
    plgpu.wait_smem_to_gmem(0)


def add_body(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


# Built at import time, before any interpreter is chosen.
add_mosaic_gpu = pl.pallas_call(
    add_body,
    out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
    compiler_params=plgpu.CompilerParams(),
)


def blocked_matmul(x, y, *, block=64):
    m, k = x.shape
    _, n = y.shape

    def body(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    return pl.pallas_call(
        body,
        grid=(m // block, n // block),
        in_specs=[pl.BlockSpec((block, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, block), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((block, block), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=plgpu.CompilerParams(),
    )(x, y)


def triton_softmax(x, *, block_rows=4):
    rows, cols = x.shape

    def body(x_ref, o_ref):
        row = x_ref[...]
        exp = jnp.exp(row - jnp.max(row, axis=-1, keepdims=True))
        o_ref[...] = exp / jnp.sum(exp, axis=-1, keepdims=True)

    return pl.pallas_call(
        body,
        grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block_rows, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
    )(x)


def test_plgpu_kernel_through_smem():
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    np.testing.assert_allclose(scale_through_smem(x), x * 2.0 + 1.0)


def test_pallas_call_with_mosaic_gpu_params_built_at_import():
    x = jnp.ones((16, 128), jnp.float32)
    np.testing.assert_allclose(add_mosaic_gpu(x, x * 3.0), 4.0 * np.ones((16, 128)))


def test_pallas_call_with_mosaic_gpu_params_under_jit():
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    f = jax.jit(pl.pallas_call(add_body, out_shape=x, compiler_params=plgpu.CompilerParams()))
    np.testing.assert_allclose(f(x, x), 2 * np.asarray(x))


def test_blocked_mosaic_gpu_matmul():
    x = jax.random.normal(jax.random.key(0), (128, 64), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (64, 128), jnp.float32)
    # XLA's own dot: on a GPU both take the float32 operands as TF32.
    np.testing.assert_allclose(blocked_matmul(x, y), jnp.dot(x, y), rtol=1e-5, atol=1e-4)


def test_triton_softmax():
    x = jax.random.normal(jax.random.key(2), (16, 128), jnp.float32)
    np.testing.assert_allclose(triton_softmax(x), jax.nn.softmax(x, axis=-1), rtol=1e-5,
                               atol=1e-6)


def test_core_map_over_a_gpu_mesh():
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)

    @jax.jit
    def negate(x):
        def stateful(refs):
            x_ref, o_ref = refs

            @pl.core_map(plgpu.Mesh(num_threads=1, thread_name="t"))
            def _():
                o_ref[...] = -x_ref[...]

        _, out = pl.run_state(stateful)((x, jnp.zeros_like(x)))
        return out

    np.testing.assert_allclose(negate(x), -np.asarray(x))
