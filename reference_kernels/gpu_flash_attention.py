"""Flash attention on a Hopper GPU with Mosaic GPU: q tiles resident, k and v streamed
through shared memory, the online softmax in registers.

Contract op (docs/contract.md section 2): ``attention(q, k, v)`` = ``softmax(q @ k.T) @ v``,
q ``(s, d)``, k and v ``(t, d)``, no scaling, no mask. Tunable variant:
``flash_attention_gpu(q, k, v, *, block_q, block_kv)``. Oracle:
``reference_kernels.attention.attention_reference`` (float64 NumPy); cost model:
``reference_kernels.attention.attention_cost``.

The GPU ideas shown here (the TPU version is ``reference_kernels/flash_attention.py``):

* One thread block per ``block_q`` rows of q (a multiple of 64: one warpgroup's WGMMA
  rows); the q axis of the grid is "parallel", spread over the SMs.
* The kv axis is the grid's "sequential" last axis: ``pallas_call`` with
  ``plgpu.CompilerParams(max_concurrent_steps=2)`` has the TMA unit bring the next
  ``(block_kv, d)`` tiles of k and v into SMEM while the tensor cores work on the current
  ones; the logits never leave the block.
* The online softmax (running maximum ``m``, denominator ``l``, unnormalised output
  ``acc``, rescaled by ``exp(m_old - m_new)`` at each kv step) keeps float32 state in
  SMEM scratch across the kv steps; the output tile is written once, at the last one.
* Padded keys (``t`` rounded up to ``block_kv``) are masked to ``-inf`` before the
  softmax; padded query rows are computed and sliced away.
* SMEM: q's tile, two stages of k and v tiles, and the float32 state must fit the 232448
  bytes of an H100/H200 thread block; ``smem_bytes`` checks it before the kernel is built.

Verified how: interpreted on the CPU (the plain interpreter: JAX's GPU interpreter takes
whole-array blocks only) by the conformance suite; not yet compiled or run on a GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .attention import attention_cost, attention_reference, online_softmax_step
from .gpu_matmul import H100_SMEM_BYTES_PER_BLOCK, WARPGROUP_ROWS

__all__ = ["attention", "attention_cost", "attention_reference", "flash_attention_gpu",
           "smem_bytes"]

STAGES = 2
_SUPPORTED = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def smem_bytes(block_q: int, block_kv: int, d: int, dtype: Any) -> int:
    """SMEM one thread block holds: q's and the output's tiles, ``STAGES`` tiles of k and v,
    and the float32 state (``m``, ``l``, ``acc``).

        >>> smem_bytes(64, 64, 128, "bfloat16")
        131584
    """
    itemsize = jnp.dtype(dtype).itemsize
    tiles = 2 * block_q * d * itemsize + STAGES * 2 * block_kv * d * itemsize
    return tiles + 4 * block_q * (d + 2)


def _kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, block_kv: int,
            kv_len: int, num_kv_blocks: int):
    step = pl.program_id(1)

    @pl.when(step == 0)
    def _():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    logits = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)
    if kv_len % block_kv:
        # Only the last kv tile holds padding, fewer than block_kv keys of it: every row
        # keeps a finite maximum.
        key = step * block_kv + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        logits = jnp.where(key < kv_len, logits, -jnp.inf)
    m_ref[...], l_ref[...], acc_ref[...] = online_softmax_step(
        m_ref[...], l_ref[...], acc_ref[...], logits, v_ref[...])

    @pl.when(step == num_kv_blocks - 1)
    def _():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "block_kv"))
def _flash(q, k, v, *, block_q: int, block_kv: int):
    from jax.experimental.pallas import mosaic_gpu as plgpu  # lazy: needs absl (optional)

    s, d = q.shape
    t, _ = k.shape
    ps, pt = -(-s // block_q) * block_q, -(-t // block_kv) * block_kv
    q = jnp.pad(q, ((0, ps - s), (0, 0)))
    k = jnp.pad(k, ((0, pt - t), (0, 0)))
    v = jnp.pad(v, ((0, pt - t), (0, 0)))
    num_kv_blocks = pt // block_kv
    kv_spec = pl.BlockSpec((block_kv, d), lambda i, j: (j, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, block_kv=block_kv, kv_len=t, num_kv_blocks=num_kv_blocks),
        grid=(ps // block_q, num_kv_blocks),
        in_specs=[pl.BlockSpec((block_q, d), lambda i, j: (i, 0)), kv_spec, kv_spec],
        out_specs=pl.BlockSpec((block_q, d), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((ps, d), q.dtype),
        scratch_shapes=[plgpu.SMEM((block_q, 1), jnp.float32),
                        plgpu.SMEM((block_q, 1), jnp.float32),
                        plgpu.SMEM((block_q, d), jnp.float32)],
        compiler_params=plgpu.CompilerParams(dimension_semantics=("parallel", "sequential"),
                                             max_concurrent_steps=STAGES),
        cost_estimate=attention_cost(q, k, v, block_q=block_q, block_kv=block_kv),
        name="flash_attention_gpu",
    )(q, k, v)
    return out[:s]


def flash_attention_gpu(q: jax.Array, k: jax.Array, v: jax.Array, *, block_q: int = 64,
                        block_kv: int = 64) -> jax.Array:
    """``softmax(q @ k.T) @ v`` in ``block_q`` query rows per thread block, ``block_kv`` keys
    per sequential step. ``block_q`` a multiple of 64; the tiles must fit SMEM."""
    if jnp.ndim(q) != 2 or jnp.shape(k) != jnp.shape(v) or jnp.ndim(k) != 2 \
            or q.shape[1] != k.shape[1]:
        raise ValueError(f"expected q (s, d), k and v (t, d); got {jnp.shape(q)}, "
                         f"{jnp.shape(k)}, {jnp.shape(v)}")
    if not (q.dtype == k.dtype == v.dtype) or jnp.dtype(q.dtype) not in _SUPPORTED:
        raise ValueError(f"q, k, v must all be float32 or bfloat16; got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    if block_q % WARPGROUP_ROWS or block_kv % 16:
        raise ValueError(f"block_q must be a multiple of {WARPGROUP_ROWS} and block_kv of 16; "
                         f"got {block_q}, {block_kv}")
    needed = smem_bytes(block_q, block_kv, q.shape[1], q.dtype)
    if needed > H100_SMEM_BYTES_PER_BLOCK:
        raise ValueError(f"blocks ({block_q}, {block_kv}) with d={q.shape[1]} need {needed} "
                         f"bytes of SMEM > {H100_SMEM_BYTES_PER_BLOCK} per thread block on "
                         "H100/H200; use smaller blocks")
    return _flash(q, k, v, block_q=block_q, block_kv=block_kv)


def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The contract's ``attention`` on a GPU: :func:`flash_attention_gpu`, 64x64 tiles (32
    keys per step where d is too wide for 64)."""
    d = q.shape[-1]
    block_kv = 64
    while block_kv > 16 and smem_bytes(64, block_kv, d, q.dtype) > H100_SMEM_BYTES_PER_BLOCK:
        block_kv //= 2
    return flash_attention_gpu(q, k, v, block_kv=block_kv)
