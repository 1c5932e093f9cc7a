"""The kernels JAX ships, through adapters to the 0.2 contract signatures, judged by the same
oracles and allowances as the reference kernels: a correct second implementation must pass
(no false alarm), a documented defect must fail.

* ``jax.experimental.pallas.ops.tpu.flash_attention`` (MHA only: the adapter repeats k and v
  to the query heads for GQA/MQA),
* ``megablox.gmm`` (grouped matmul; its m must be a multiple of its row tile),
* ``paged_attention`` (its pages_per_compute_block must divide pages_per_sequence),
* ``all_gather`` (called on the global array with its mesh: it makes its own shard_map).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu import all_gather as jax_all_gather
from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash
from jax.experimental.pallas.ops.tpu.megablox import gmm as jax_gmm  # ops.gmm, a custom_vjp
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as jax_paged
from test_flash_attention import assert_within_allowance as flash_within_allowance
from test_grouped_matmul import assert_within_allowance as grouped_within_allowance
from test_paged_attention import assert_within_allowance as paged_within_allowance

from pytest_pallas.reference_kernels import collectives
from pytest_pallas.reference_kernels import flash_attention as fa
from pytest_pallas.reference_kernels import grouped_matmul as gm
from pytest_pallas.reference_kernels import paged_attention as pa

pytestmark = pytest.mark.pallas


def jax_flash_attention(q, k, v, *, causal, sm_scale):
    """JAX's flash attention, k and v repeated to the h query heads."""
    ratio = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, ratio, axis=1), jnp.repeat(v, ratio, axis=1)
    return jax_flash.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)


def jax_grouped_matmul(lhs, rhs, group_sizes):
    # Positional: preferred_element_type and tiling are nondiff arguments of the custom_vjp.
    return jax_gmm(lhs, rhs, group_sizes, lhs.dtype, (128, 128, 128))


def jax_paged_attention(q, k_pages, v_pages, lengths, page_indices):
    return jax_paged.paged_attention(q, k_pages, v_pages, lengths, page_indices,
                                     pages_per_compute_block=2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_jax_flash_attention_passes(dtype, causal):
    q, k, v = fa.flash_attention_inputs(dict(b=1, h=2, g=1, s=128, t=128, d=64), dtype,
                                        np.random.default_rng(0))
    params = {"causal": causal, "sm_scale": 1 / math.sqrt(64)}
    out = jax.jit(functools.partial(jax_flash_attention, **params))(q, k, v)
    flash_within_allowance(out, q, k, v, **params)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jax_megablox_gmm_passes(dtype):
    lhs, rhs, _ = gm.grouped_matmul_inputs(dict(m=256, k=128, n=128, g=4), dtype,
                                           np.random.default_rng(1))
    group_sizes = np.array([0, 100, 0, 156], np.int32)
    out = jax.jit(jax_grouped_matmul)(lhs, rhs, group_sizes)
    grouped_within_allowance(out, lhs, rhs, group_sizes)


PAGED_DIMS = dict(b=4, h=4, g=2, d=128, pages=40, page_size=16, pages_per_sequence=4)


@pytest.fixture
def _tpu_interpreter(pallas_backend):
    if pallas_backend.interpreter == "plain":
        pytest.skip("manual DMAs need TPU interpret mode (--pallas-interpret=tpu)")


@pytest.mark.usefixtures("_tpu_interpreter")
def test_jax_paged_attention_passes_in_bfloat16():
    args = pa.paged_attention_inputs(PAGED_DIMS, "bfloat16", np.random.default_rng(2))
    paged_within_allowance(jax.jit(jax_paged_attention)(*args), *args)


@pytest.mark.usefixtures("_tpu_interpreter")
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="JAX's paged_attention computes float32 K and V in bfloat16 (a "
                          "documented defect): its logits err by 2**-9 relative, far beyond "
                          "float32's allowance")
def test_jax_paged_attention_in_float32():
    args = pa.paged_attention_inputs(PAGED_DIMS, "float32", np.random.default_rng(2))
    paged_within_allowance(jax.jit(jax_paged_attention)(*args), *args)


@pytest.mark.usefixtures("_tpu_interpreter")
def test_jax_paged_attention_float32_error_is_the_bfloat16_rounding_of_k_and_v():
    """The evidence for the xfail above: with K and V rounded to bfloat16 first, the oracle
    agrees with JAX's float32 result within the float32 allowance."""
    q, k_pages, v_pages, lengths, page_indices = pa.paged_attention_inputs(
        PAGED_DIMS, "float32", np.random.default_rng(2))
    out = jax.jit(jax_paged_attention)(q, k_pages, v_pages, lengths, page_indices)
    rounded = [np.asarray(jnp.asarray(p).astype(jnp.bfloat16).astype(jnp.float32))
               for p in (k_pages, v_pages)]
    paged_within_allowance(out, q, *rounded, lengths, page_indices)


def _jax_all_gather_run(device_mesh, n):
    """JAX's ring all_gather over n devices (its blocks in HBM); returns (result, expected)."""
    blocks = np.random.default_rng(n).standard_normal((n, 8, 128)).astype(np.float32)
    out = jax_all_gather.all_gather(jnp.asarray(blocks.reshape(n * 8, 128)),
                                    mesh=device_mesh(n), axis_name="x", memory_space=pl.ANY)
    return np.asarray(out).reshape(n * 8, 128), collectives.all_gather_reference(blocks)


@pytest.mark.usefixtures("_tpu_interpreter")
def test_jax_all_gather_passes_on_two_devices(device_mesh):
    """One ring step: its shared receive semaphore has nothing to confuse."""
    out, expected = _jax_all_gather_run(device_mesh, 2)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.usefixtures("_tpu_interpreter")
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="JAX's all_gather waits on one receive semaphore per direction across "
                          "ring steps: a later step's arrival releases the wait for an earlier "
                          "one, and it forwards slots not yet written (NaN-poisoned in the TPU "
                          "interpreter); seen on every one of 3 runs on 4 and 8 devices")
def test_jax_all_gather_on_eight_devices(device_mesh):
    out, expected = _jax_all_gather_run(device_mesh, 8)
    assert not np.isnan(out).any(), f"{int(np.isnan(out).sum())} elements never written"
    np.testing.assert_array_equal(out, expected)
