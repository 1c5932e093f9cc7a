"""Row softmax on a Hopper GPU with Mosaic GPU: rows staged in shared memory by the TMA unit.

Contract op (docs/contract.md section 2): ``softmax(x)`` over the last axis of ``(rows, cols)``,
float32 or bfloat16, output in the input dtype. Two kernels: ``softmax_gpu_smem`` (one
``plgpu.kernel``: the whole array through SMEM, for arrays that fit one thread block's
SMEM) and ``softmax_gpu_blocked`` (``pallas_call`` with ``plgpu.CompilerParams``, blocks of
whole rows, for any size). ``softmax`` picks the first when it fits. Oracle:
``reference_kernels.softmax.softmax_reference`` (float64 NumPy); cost model:
``reference_kernels.softmax.softmax_cost``.

The GPU ideas shown here (the TPU version is ``reference_kernels/softmax.py``):

* Data moves global memory -> SMEM -> registers -> SMEM -> global memory. In the
  ``plgpu.kernel`` the moves are explicit: ``plgpu.copy_gmem_to_smem`` starts a TMA copy
  that arrives on a ``plgpu.Barrier``; the kernel waits on the barrier before reading
  SMEM, calls ``plgpu.commit_smem()`` so that its SMEM writes are visible to the TMA unit
  before ``plgpu.copy_smem_to_gmem``, and waits for that copy before the kernel ends.
  Leave out either wait and JAX's GPU interpreter reports a race under
  ``--pallas-detect-races``.
* A thread block holds whole rows, so the row max and the row sum (warp shuffles and a
  cross-warp reduction on the GPU) see a whole row at once and no state passes between
  blocks. The math runs in float32; subtracting the row max keeps every exponent <= 0.
* SMEM is the budget: 232448 bytes per thread block on H100/H200 (the input and output
  tiles, double-buffered in the blocked kernel); ``softmax`` sizes the blocks to it.

Verified how: interpreted on the CPU by the conformance suite, ``softmax_gpu_smem`` in
JAX's GPU interpreter (simulated SMEM, barriers, TMA, NaN-poisoned memory),
``softmax_gpu_blocked`` in the plain interpreter (JAX's GPU interpreter takes whole-array
blocks only); not yet compiled or run on a GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .gpu_matmul import H100_SMEM_BYTES_PER_BLOCK
from .softmax import softmax_cost, softmax_reference

__all__ = ["softmax", "softmax_cost", "softmax_gpu_blocked", "softmax_gpu_smem",
           "softmax_reference"]

STAGES = 2  # the blocked kernel's max_concurrent_steps
_SUPPORTED = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def _row_softmax(x):
    x = x.astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def _check(x: Any) -> None:
    if jnp.ndim(x) != 2 or jnp.dtype(x.dtype) not in _SUPPORTED:
        raise ValueError(f"expected a float32 or bfloat16 (rows, cols) array, got "
                         f"{jnp.shape(x)} {jnp.result_type(x)}")


def smem_fits(x: Any) -> bool:
    """Whether ``x`` and its output fit one thread block's SMEM together."""
    return 2 * x.size * jnp.dtype(x.dtype).itemsize <= H100_SMEM_BYTES_PER_BLOCK


@jax.jit
def softmax_gpu_smem(x: jax.Array) -> jax.Array:
    """Softmax of an array that fits SMEM, in one thread block: TMA in, compute, TMA out."""
    from jax.experimental.pallas import mosaic_gpu as plgpu  # lazy: needs absl (optional)

    _check(x)
    if not smem_fits(x):
        raise ValueError(f"{x.shape} {x.dtype} does not fit {H100_SMEM_BYTES_PER_BLOCK} bytes "
                         "of SMEM with its output; use softmax_gpu_blocked")

    @functools.partial(
        plgpu.kernel,
        out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_types=dict(
            x_smem=plgpu.SMEM(x.shape, x.dtype),
            out_smem=plgpu.SMEM(x.shape, x.dtype),
            loaded=plgpu.Barrier(num_arrivals=1),
        ),
    )
    def softmax_smem(x_gmem, out_gmem, x_smem, out_smem, loaded):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, loaded)
        plgpu.barrier_wait(loaded)  # the TMA copy has landed
        out_smem[...] = _row_softmax(x_smem[...]).astype(out_smem.dtype)
        plgpu.commit_smem()  # visible to the TMA unit before it reads SMEM
        plgpu.copy_smem_to_gmem(out_smem, out_gmem)
        plgpu.wait_smem_to_gmem(0)  # the copy out is done before the block exits

    return softmax_smem(x)


def _blocked_kernel(x_ref, o_ref):
    o_ref[...] = _row_softmax(x_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_rows",))
def _blocked(x, *, block_rows: int):
    from jax.experimental.pallas import mosaic_gpu as plgpu  # lazy: needs absl (optional)

    rows, cols = x.shape
    padded = -(-rows // block_rows) * block_rows
    # Zero rows: a finite softmax, sliced away.
    x = jnp.pad(x, ((0, padded - rows), (0, 0)))
    spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    out = pl.pallas_call(
        _blocked_kernel,
        grid=(padded // block_rows,),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=plgpu.CompilerParams(dimension_semantics=("parallel",),
                                             max_concurrent_steps=STAGES),
        cost_estimate=softmax_cost(x),
        name="softmax_gpu",
    )(x)
    return out[:rows]


def default_block_rows(rows: int, cols: int, dtype: Any) -> int:
    """The most rows (a power of two, at most 64) whose double-buffered input and output
    tiles fit one thread block's SMEM; at least 1."""
    row_bytes = 2 * STAGES * cols * jnp.dtype(dtype).itemsize
    block = 64
    while block > 1 and block * row_bytes > H100_SMEM_BYTES_PER_BLOCK:
        block //= 2
    return min(block, max(1, rows))


def softmax_gpu_blocked(x: jax.Array, *, block_rows: int | None = None) -> jax.Array:
    """Softmax over the last axis, ``block_rows`` whole rows per thread block."""
    _check(x)
    rows, cols = x.shape
    if rows * cols == 0:
        return jax.nn.softmax(x, axis=-1)
    if block_rows is None:
        block_rows = default_block_rows(rows, cols, x.dtype)
    return _blocked(x, block_rows=block_rows)


def softmax(x: jax.Array) -> jax.Array:
    """The contract's ``softmax`` on a GPU: through SMEM in one block when it fits."""
    _check(x)
    if x.size and smem_fits(x):
        return softmax_gpu_smem(x)
    return softmax_gpu_blocked(x)
