"""Correct alternatives to the reference kernels: the conformance suite must pass every one.

Four kinds, each a contract-signature callable (docs/contract.md section 2):

* plain ``jnp`` for every op (the contract: "a plain jnp implementation is
  valid and must pass");
* the project's reference kernels with block sizes other than their defaults
  (so that test-sized inputs take several grid steps, ragged edges included);
* for ppermute, which has no block size, a different remote-DMA kernel
  (``ppermute_in_chunks``: two chunks in flight at once);
* the kernels JAX ships in ``jax.experimental.pallas.ops.tpu``:
  ``flash_attention.flash_attention`` for attention/mha/mqa and
  ``matmul.matmul`` for matmul, each with the ``@supports`` declaration of the
  part of the domain it really handles (see the wrappers' docstrings).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash
from jax.experimental.pallas.ops.tpu import matmul as jax_matmul

from pytest_pallas import supports
from pytest_pallas.reference_kernels import attention as ref_attention
from pytest_pallas.reference_kernels import dma as ref_dma
from pytest_pallas.reference_kernels import elementwise as ref_elementwise
from pytest_pallas.reference_kernels import matmul as ref_matmul
from pytest_pallas.reference_kernels import reduction as ref_reduction
from pytest_pallas.reference_kernels import softmax as ref_softmax

_F32 = jnp.float32
_HIGHEST = lax.Precision.HIGHEST  # a float32 dot in float32 on a TPU too


# --- plain jnp ----------------------------------------------------------------------------


def add_jnp(x, y):
    return x + y  # int32 wraps around, as the contract says


def sum_jnp(x):
    return jnp.sum(x, axis=0, dtype=_F32).astype(x.dtype)


def matmul_jnp(x, y):
    return jnp.dot(x, y, precision=_HIGHEST, preferred_element_type=_F32).astype(x.dtype)


def matmul_activation_jnp(x, y, *, activation):
    z = jnp.dot(x, y, precision=_HIGHEST, preferred_element_type=_F32)
    return (z if activation is None else activation(z)).astype(x.dtype)


def batched_matmul_jnp(x, y):
    return jnp.einsum("bmk,bkn->bmn", x, y, precision=_HIGHEST,
                      preferred_element_type=_F32).astype(x.dtype)


def softmax_jnp(x):
    return jax.nn.softmax(x.astype(_F32), axis=-1).astype(x.dtype)


def _attention_jnp(q, k, v, logits_spec: str, output_spec: str):
    logits = jnp.einsum(logits_spec, q, k, precision=_HIGHEST, preferred_element_type=_F32)
    weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum(output_spec, weights, v.astype(_F32), precision=_HIGHEST)
    return out.astype(q.dtype)


def attention_jnp(q, k, v):
    return _attention_jnp(q, k, v, "sd,td->st", "st,td->sd")


def mha_jnp(q, k, v):
    return _attention_jnp(q, k, v, "bhsd,bhtd->bhst", "bhst,bhtd->bhsd")


def mqa_jnp(q, k, v):
    return _attention_jnp(q, k, v, "bhsd,btd->bhst", "bhst,btd->bhsd")


def copy_jnp(x):
    return jnp.copy(x)


def ppermute_jnp(x, *, axis_name, shift):
    n = lax.axis_size(axis_name)
    return lax.ppermute(x, axis_name, perm=[(j, (j + shift) % n) for j in range(n)])


# --- the reference kernels with other block sizes -----------------------------------------
# Blocks of 16 rows are legal for float32 (tiles of 8 rows) and bfloat16 (16)
# alike; small blocks make test-sized inputs take several grid steps.

add_2d_grid_small_blocks = functools.partial(
    ref_elementwise.add_2d_grid, block_rows=16, block_cols=128)
add_1d_grid_small_blocks = functools.partial(ref_elementwise.add_1d_grid, block_size=2048)

sum_tiled_small_blocks = functools.partial(
    ref_reduction.sum_leading_axis_tiled, block_rows=16, block_cols=128, block_n=2)
sum_whole_slab = ref_reduction.sum_leading_axis_whole_slab

_SMALL_MATMUL_BLOCKS = {"block_m": 16, "block_k": 128, "block_n": 128}
matmul_small_blocks = functools.partial(ref_matmul.matmul_blocked, **_SMALL_MATMUL_BLOCKS)
matmul_activation_small_blocks = functools.partial(
    ref_matmul.matmul_blocked, **_SMALL_MATMUL_BLOCKS)  # takes activation= as keyword


def batched_matmul_small_blocks(x, y):
    return jax.vmap(matmul_small_blocks)(x, y)


softmax_small_blocks = functools.partial(ref_softmax.softmax_row_blocked, block_rows=16)

attention_small_blocks = functools.partial(ref_attention.flash_attention, block_q=16,
                                           block_kv=128)


def mha_small_blocks(q, k, v):
    return jax.vmap(jax.vmap(attention_small_blocks))(q, k, v)


def mqa_small_blocks(q, k, v):
    per_batch = jax.vmap(attention_small_blocks, in_axes=(0, None, None))
    return jax.vmap(per_batch)(q, k, v)


copy_double_buffered_small_blocks = functools.partial(ref_dma.double_buffered_copy,
                                                      block_rows=16)


# --- ppermute: another remote-DMA kernel ----------------------------------------------------

def _ppermute_in_chunks_kernel(peers_smem, x_hbm, o_hbm, send_sems, recv_sems, *, axis_name,
                               chunks):
    dst, src = peers_smem[0], peers_smem[1]
    # Handshake as in the reference: tell the device that writes into us that
    # our output exists, and wait until the device we write into has told us.
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis_name: src})
    pl.semaphore_wait(barrier, 1)
    copies = []
    for i, (start, size) in enumerate(chunks):
        rows = pl.ds(start, size)
        copy = pltpu.make_async_remote_copy(
            x_hbm.at[rows], o_hbm.at[rows], send_sems.at[i], recv_sems.at[i],
            device_id={axis_name: dst})
        copy.start()  # all chunks in flight at once, each with its own semaphores
        copies.append(copy)
    for copy in copies:
        copy.wait_send()
        copy.wait_recv()


def ppermute_in_chunks(x, *, axis_name, shift):
    """ppermute by remote DMAs, the block sent as two row chunks in flight together."""
    n = lax.axis_size(axis_name)
    shift = shift % n
    if shift == 0:
        return x
    rows = x.shape[0]
    half = rows // 2
    chunks = ((0, rows),) if half == 0 else ((0, half), (half, rows - half))
    me = lax.axis_index(axis_name)
    # lax.rem keeps the dividend's sign: keep both operands non-negative.
    peers = jnp.stack([lax.rem(me + shift, n), lax.rem(me + n - shift, n)]).astype(jnp.int32)
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        functools.partial(_ppermute_in_chunks_kernel, axis_name=axis_name, chunks=chunks),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, in_specs=[hbm], out_specs=hbm,
            scratch_shapes=[pltpu.SemaphoreType.DMA((len(chunks),)),
                            pltpu.SemaphoreType.DMA((len(chunks),))]),
        compiler_params=pltpu.CompilerParams(collective_id=shift),
    )(peers, x)


# --- the kernels JAX ships: jax.experimental.pallas.ops.tpu --------------------------------


def _jax_flash(q, k, v, block_sizes=None):
    # (b, h, s, d) layout; sm_scale defaults to 1.0, causal to False: exactly
    # the contract's softmax(q @ k.T) @ v.
    return jax_flash.flash_attention(q, k, v, causal=False, sm_scale=1.0,
                                     block_sizes=block_sizes)


# With its default BlockSizes (128 everywhere) the kernel requires
# block_q <= s, and t divisible by block_k_major = block_k = 128 (its
# _verify_block raises otherwise); with t > 128 (several kv steps) a head
# dimension above 128 must be a multiple of 128, which every drawn d
# (1, 32, 128) is. s need not be a multiple of 128 (the q grid is cdiv), but
# must be at least 128; no size bucket of s lies between 128 and a multiple
# of it, so multiple_of={"s": 128} is the declaration that expresses s >= 128.
_FLASH_DEFAULT_DOMAIN = {"multiple_of": {"s": 128, "t": 128}}


@supports(**_FLASH_DEFAULT_DOMAIN)
def attention_jax_flash(q, k, v):
    """JAX's flash attention (default 128 blocks) on one (s, d) head."""
    return _jax_flash(q[None, None], k[None, None], v[None, None])[0, 0]


@supports(**_FLASH_DEFAULT_DOMAIN)
def mha_jax_flash(q, k, v):
    """JAX's flash attention (default 128 blocks), (b, h, s, d) as it is."""
    return _jax_flash(q, k, v)


@supports(**_FLASH_DEFAULT_DOMAIN)
def mqa_jax_flash(q, k, v):
    """JAX's flash attention (default 128 blocks), the shared k and v broadcast over the heads."""
    b, h, _, d = q.shape
    t = k.shape[1]
    k = jnp.broadcast_to(k[:, None], (b, h, t, d))
    v = jnp.broadcast_to(v[:, None], (b, h, t, d))
    return _jax_flash(q, k, v)


def _fitted_block_sizes(s: int, t: int) -> jax_flash.BlockSizes:
    # block_q may be any size up to s (its grid is cdiv); the kv block must
    # divide t: 128 when it does, else the whole of t in one step (the
    # kernel's single-step path, which has no further constraint).
    block_k = 128 if t % 128 == 0 else t
    return jax_flash.BlockSizes(block_q=min(128, s), block_k_major=block_k, block_k=block_k,
                                block_b=1)


@supports(dtypes=("float32", "bfloat16"))
def mha_jax_flash_fitted_blocks(q, k, v):
    """JAX's flash attention with blocks fitted to the shape: the whole contract domain."""
    return _jax_flash(q, k, v, _fitted_block_sizes(q.shape[2], k.shape[2]))


@supports(dtypes=("float32", "bfloat16"))
def attention_jax_flash_fitted_blocks(q, k, v):
    """JAX's flash attention with blocks fitted to the shape, on one (s, d) head."""
    block_sizes = _fitted_block_sizes(q.shape[0], k.shape[0])
    return _jax_flash(q[None, None], k[None, None], v[None, None], block_sizes)[0, 0]


# JAX's matmul sizes its grid with floor division (m // bm, n // bn, k // bk):
# a dimension the block does not divide silently loses its remainder. Its
# blocks are (bm, bk), (bk, bn), (bm, bn): TPU-legal with bm a multiple of 8
# and bk, bn multiples of 128.
_JAX_MATMUL_BLOCKS = {"block_shape": (8, 128), "block_k": 128}


@supports(multiple_of={"m": 8, "k": 128, "n": 128})
def matmul_jax(x, y):
    """JAX's matmul kernel with (8, 128) output blocks and 128-deep k blocks."""
    return jax_matmul.matmul(x, y, **_JAX_MATMUL_BLOCKS)
