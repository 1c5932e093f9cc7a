"""The reference Mosaic GPU kernels (reference_kernels/gpu_*.py), interpreted on the CPU."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("absl", reason="jax.experimental.pallas.mosaic_gpu imports absl-py")

from pytest_pallas.compare import assert_allclose  # noqa: E402
from pytest_pallas.reference_kernels import (  # noqa: E402
    gpu_flash_attention,
    gpu_matmul,
    gpu_softmax,
)
from pytest_pallas.reference_kernels.attention import attention_reference  # noqa: E402
from pytest_pallas.reference_kernels.matmul import matmul_reference  # noqa: E402
from pytest_pallas.reference_kernels.softmax import softmax_reference  # noqa: E402


@pytest.mark.pallas
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("m, k, n", [(64, 64, 128), (70, 130, 33), (1, 7, 200)])
def test_matmul_matches_the_float64_oracle(m, k, n, dtype):
    x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32).astype(dtype)
    y = jax.random.normal(jax.random.key(1), (k, n), jnp.float32).astype(dtype)
    assert_allclose(gpu_matmul.matmul(x, y), matmul_reference(x, y), reduction_length=k)


@pytest.mark.pallas
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(8, 128), (3, 5), (300, 257)])
def test_softmax_matches_the_float64_oracle(shape, dtype):
    x = (jax.random.normal(jax.random.key(2), shape, jnp.float32) * 30).astype(dtype)
    assert_allclose(gpu_softmax.softmax(x), softmax_reference(x), reduction_length=shape[1])


@pytest.mark.pallas
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("s, t, d", [(64, 64, 64), (130, 77, 32), (1, 200, 128)])
def test_flash_attention_matches_the_float64_oracle(s, t, d, dtype):
    q, k, v = (jax.random.normal(jax.random.key(i), shape, jnp.float32).astype(dtype)
               for i, shape in enumerate([(s, d), (t, d), (t, d)]))
    assert_allclose(gpu_flash_attention.attention(q, k, v), attention_reference(q, k, v),
                    reduction_length=t, op="attention", inputs=(q, k, v))


def test_each_kernel_runs_in_the_interpreter_that_can_run_it():
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas._compat import gpu_interpreter, pallas_call_hooks

    seen = []
    x = jnp.ones((8, 128), jnp.float32)
    with contextlib.ExitStack() as stack:
        stack.enter_context(pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()))
        stack.enter_context(pallas_call_hooks.forced_interpreter_when_called())
        stack.enter_context(gpu_interpreter.gpu_kernels_routed(
            gpu_interpreter.make_gpu_params(detect_races=True), seen.append))
        gpu_softmax.softmax_gpu_smem(x).block_until_ready()
        gpu_softmax.softmax_gpu_blocked(x).block_until_ready()
        gpu_matmul.matmul(x, x.T).block_until_ready()
    where = {kernel.name: kernel.interpreter for kernel in seen}
    assert where == {"softmax_smem": "gpu", "softmax_gpu": "plain", "matmul_gpu": "plain"}
    # The TMA copies are awaited and SMEM committed: no race.
    assert not gpu_interpreter.races_pending()


def test_blocks_beyond_a_thread_blocks_smem_are_refused():
    x = jnp.ones((64, 1024), jnp.float32)
    assert gpu_matmul.smem_bytes(128, 256, 64, "float32") > gpu_matmul.H100_SMEM_BYTES_PER_BLOCK
    with pytest.raises(ValueError, match=r"need \d+ bytes of SMEM > 232448 per thread block"):
        gpu_matmul.matmul_gpu_blocked(x, x.T, block_m=128, block_n=256, block_k=64)
    with pytest.raises(ValueError, match="multiple of 64"):
        gpu_matmul.matmul_gpu_blocked(x, x.T, block_m=32)
    q = jnp.ones((64, 256), jnp.float32)
    with pytest.raises(ValueError, match=r"need \d+ bytes of SMEM > 232448"):
        gpu_flash_attention.flash_attention_gpu(q, q, q, block_kv=128)
    assert not gpu_softmax.smem_fits(jnp.ones((256, 256), jnp.float32))
    np.testing.assert_array_equal(gpu_softmax.default_block_rows(1000, 8192, jnp.float32), 1)
