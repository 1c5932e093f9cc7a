"""Matrix multiplication on a Hopper GPU with Mosaic GPU: warpgroup tiles through shared memory.

Contract op (docs/contract.md section 2): ``matmul(x, y)``, ``(m, k) @ (k, n)``, output dtype =
input dtype, float32 accumulation. Tunable variant: ``matmul_gpu_blocked(x, y, *, block_m,
block_n, block_k)``. Oracle: ``reference_kernels.matmul.matmul_reference`` (float64 NumPy);
cost model: ``matmul_gpu_cost`` (FLOPs and the global-memory bytes this blocking moves).

The GPU ideas shown here (the TPU version is ``reference_kernels/matmul.py``):

* One CUDA thread block (a Pallas program) per ``(block_m, block_n)`` output tile, the
  grid's two outer axes "parallel": the tiles spread over the GPU's streaming
  multiprocessors (132 on an H100 SXM). ``block_m`` is a multiple of 64: one warpgroup's
  WGMMA instruction takes 64 rows of the left operand.
* ``pallas_call`` with ``plgpu.CompilerParams`` pipelines the BlockSpecs: the TMA unit
  copies the next ``k`` step's ``(block_m, block_k)`` and ``(block_k, block_n)`` tiles from
  global memory (HBM) into shared memory (SMEM) while the tensor cores work on the current
  ones; ``max_concurrent_steps=2`` keeps two steps in flight (double buffering).
* The reduction over ``k`` is the grid's last, "sequential" axis; a float32 accumulator
  lives in SMEM for the whole reduction and the output tile is written once, at the last
  step. Everything in flight must fit one block's SMEM: 227 KiB (232448 bytes) on
  H100/H200, checked by ``smem_bytes`` before the kernel is built.
* TMA copies need the tile's last dimension to span a multiple of 16 bytes; the blocks
  here are multiples of 64 elements, and the operands are padded with zeros (which add
  nothing to a dot product) to whole blocks, the result sliced back.

Verified how: interpreted on the CPU (the plain interpreter: JAX's GPU interpreter takes
whole-array blocks only), by the conformance suite; not yet compiled or run on a GPU.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pytest_pallas.gpu import HOPPER_SMEM_BYTES_PER_BLOCK

from .matmul import matmul_reference

__all__ = ["H100_SMEM_BYTES_PER_BLOCK", "matmul", "matmul_gpu_blocked", "matmul_gpu_cost",
           "matmul_reference", "smem_bytes"]

# The most shared memory one thread block may use on H100 and H200 (compute capability
# 9.0): 227 KiB, the same limit Mosaic GPU reports as max_smem_bytes=232448 (the source is
# in pytest_pallas/gpu.py).
H100_SMEM_BYTES_PER_BLOCK = HOPPER_SMEM_BYTES_PER_BLOCK
WARPGROUP_ROWS = 64  # rows of the left operand one WGMMA instruction takes
STAGES = 2  # max_concurrent_steps: the k steps whose tiles are in SMEM at once
_SUPPORTED = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def smem_bytes(block_m: int, block_n: int, block_k: int, dtype: Any) -> int:
    """Shared memory one thread block holds: ``STAGES`` input tiles of each operand, the
    float32 accumulator and the output tile.

        >>> smem_bytes(128, 128, 64, "bfloat16")
        163840
    """
    itemsize = jnp.dtype(dtype).itemsize
    inputs = STAGES * (block_m * block_k + block_k * block_n) * itemsize
    return inputs + block_m * block_n * 4 + block_m * block_n * itemsize


def matmul_gpu_cost(x: Any, y: Any, *, block_m: int, block_n: int) -> pl.CostEstimate:
    """FLOPs of ``x @ y`` and the global-memory bytes this blocking moves: each block row of
    ``x`` read once per block column of the output, each block column of ``y`` once per block
    row, the output written once. Takes anything with ``.shape`` and ``.dtype``."""
    m, k = x.shape
    _, n = y.shape
    itemsize = jnp.dtype(x.dtype).itemsize
    reads = m * k * -(-n // block_n) + k * n * -(-m // block_m)
    return pl.CostEstimate(flops=2 * m * k * n, transcendentals=0,
                           bytes_accessed=itemsize * (reads + m * n))


def _kernel(x_ref, y_ref, o_ref, acc_ref, *, num_k_blocks: int):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == num_k_blocks - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_m", "block_n", "block_k"))
def _matmul(x, y, *, block_m: int, block_n: int, block_k: int):
    from jax.experimental.pallas import mosaic_gpu as plgpu  # lazy: needs absl (optional)

    m, k = x.shape
    _, n = y.shape
    pm, pk, pn = (-(-m // block_m) * block_m, -(-k // block_k) * block_k,
                  -(-n // block_n) * block_n)
    x = jnp.pad(x, ((0, pm - m), (0, pk - k)))
    y = jnp.pad(y, ((0, pk - k), (0, pn - n)))
    num_k_blocks = pk // block_k
    out = pl.pallas_call(
        functools.partial(_kernel, num_k_blocks=num_k_blocks),
        grid=(pm // block_m, pn // block_n, num_k_blocks),
        in_specs=[pl.BlockSpec((block_m, block_k), lambda i, j, s: (i, s)),
                  pl.BlockSpec((block_k, block_n), lambda i, j, s: (s, j))],
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j, s: (i, j)),
        out_shape=jax.ShapeDtypeStruct((pm, pn), x.dtype),
        scratch_shapes=[plgpu.SMEM((block_m, block_n), jnp.float32)],
        compiler_params=plgpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "sequential"),
            max_concurrent_steps=STAGES),
        cost_estimate=matmul_gpu_cost(x, y, block_m=block_m, block_n=block_n),
        name="matmul_gpu",
    )(x, y)
    return out[:m, :n]


def matmul_gpu_blocked(x: jax.Array, y: jax.Array, *, block_m: int = 64, block_n: int = 128,
                       block_k: int = 64) -> jax.Array:
    """``x @ y`` in ``(block_m, block_n)`` output tiles, ``block_k`` of the reduction per step.

    ``block_m`` must be a multiple of 64 (a warpgroup's WGMMA rows), ``block_n`` and
    ``block_k`` multiples of 16, and the tiles in flight must fit the 232448 bytes of SMEM
    one H100/H200 thread block may use.
    """
    if jnp.ndim(x) != 2 or jnp.ndim(y) != 2 or x.shape[1] != y.shape[0]:
        raise ValueError(f"expected (m, k) @ (k, n), got {jnp.shape(x)} @ {jnp.shape(y)}")
    if x.dtype != y.dtype or jnp.dtype(x.dtype) not in _SUPPORTED:
        raise ValueError(f"x and y must both be float32 or bfloat16, got {x.dtype}, {y.dtype}")
    if block_m % WARPGROUP_ROWS or block_n % 16 or block_k % 16:
        raise ValueError(f"block_m must be a multiple of {WARPGROUP_ROWS} and block_n, block_k "
                         f"of 16; got {block_m}, {block_n}, {block_k}")
    needed = smem_bytes(block_m, block_n, block_k, x.dtype)
    if needed > H100_SMEM_BYTES_PER_BLOCK:
        raise ValueError(f"blocks ({block_m}, {block_n}, {block_k}) need {needed} bytes of SMEM "
                         f"> {H100_SMEM_BYTES_PER_BLOCK} per thread block on H100/H200; use "
                         "smaller blocks")
    if math.prod(x.shape) == 0 or math.prod(y.shape) == 0:
        return jnp.zeros((x.shape[0], y.shape[1]), x.dtype)
    return _matmul(x, y, block_m=block_m, block_n=block_n, block_k=block_k)


def matmul(x: jax.Array, y: jax.Array) -> jax.Array:
    """The contract's ``matmul`` on a GPU: :func:`matmul_gpu_blocked` with 64x128x64 tiles."""
    return matmul_gpu_blocked(x, y)
