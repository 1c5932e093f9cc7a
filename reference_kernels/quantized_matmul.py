"""Weight-only int8 matrix multiplication: int8 weights dequantised inside the MXU loop.

Contract op (docs/contract.md section 2, version 0.2):

* ``quantized_matmul(x, w, scale)``: ``x @ (w * scale)`` for x ``(m, k)`` float32
  or bfloat16, w ``(k, n)`` int8 and scale ``(n,)`` float32 (one per output
  column), accumulated in float32, in x's dtype.

Tunable variant: ``quantized_matmul_blocked(..., block_m=, block_k=, block_n=)``.
Beside the kernel: its float64 oracle ``quantized_matmul_reference``, its cost
model ``quantized_matmul_cost`` and an input builder ``quantized_matmul_inputs``
(int8 over its whole range, scales spanning six orders of magnitude).

The TPU ideas:

* **The weights cross HBM as int8.** A decode-time matmul (small m) is bound by
  reading w; int8 halves those bytes against bfloat16 and quarters them against
  float32. So w's blocks are DMA'd to VMEM as int8 and converted to x's dtype
  only there, step by step inside the k loop, right before the MXU consumes
  them: the float copy of w never exists in HBM. The conversion is exact (an
  int8 has 8 significant bits, as many as bfloat16's mantissa holds).
* **A per-column scale commutes with the k sum.** ``x @ (w * s) = (x @ w) * s``
  when s scales the columns, so the kernel accumulates ``x @ w`` in float32
  over the k blocks and multiplies by the scale once, in the epilogue at the
  last k step, instead of k times. It is also more accurate: ``w * s``
  rounded to bfloat16 would add an error per product.
* int8 blocks tile as (32, 128) (four values per 32-bit sublane word): block_k,
  w's second-minor dimension, is a multiple of 128 anyway, being x's minor one.

The error allowance is the comparator's default for the output dtype with
reduction length k, as for ``matmul``: the float32 sum of k products (exact
products for bfloat16 x, each rounded once for float32 x), then one float32
rounding for the scale and one for the output dtype. A bfloat16 accumulator
fails it from k = 512 on. Each column's error is proportional to its own
scale, so the same allowance holds column by column, each relative to its
column's largest value: with scales orders of magnitude apart, a tolerance
relative to the whole output's largest value would barely check the
small-scale columns.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas.ops.domains import supports

from ._tiling import (
    LANES,
    native_sublanes,
    output_struct,
    pad_to,
    resolve_block,
    round_up,
)
from .matmul import _SUPPORTED_DTYPES

__all__ = [
    "DEFAULT_BLOCK_K",
    "DEFAULT_BLOCK_M",
    "DEFAULT_BLOCK_N",
    "quantized_matmul",
    "quantized_matmul_blocked",
    "quantized_matmul_cost",
    "quantized_matmul_inputs",
    "quantized_matmul_reference",
]

# As matmul's: 512 x 512 output blocks and 512-deep k blocks; an int8 w block
# is a quarter of a float32 one, so VMEM use is below matmul's.
DEFAULT_BLOCK_M = 512
DEFAULT_BLOCK_K = 512
DEFAULT_BLOCK_N = 512


def _check_operands(x: Any, w: Any, scale: Any) -> None:
    if jnp.ndim(x) != 2 or jnp.ndim(w) != 2 or jnp.ndim(scale) != 1:
        raise ValueError(
            "quantized_matmul expects x (m, k), w (k, n) and scale (n,), got shapes "
            f"{jnp.shape(x)}, {jnp.shape(w)}, {jnp.shape(scale)}"
        )
    if x.shape[1] != w.shape[0] or w.shape[1] != scale.shape[0]:
        raise ValueError(
            "quantized_matmul expects x (m, k), w (k, n) and scale (n,) with matching k and n, "
            f"got shapes {x.shape}, {w.shape}, {scale.shape}"
        )
    if jnp.dtype(x.dtype) not in _SUPPORTED_DTYPES:
        raise ValueError(f"quantized_matmul: x must be float32 or bfloat16, got {x.dtype}")
    if jnp.dtype(w.dtype) != jnp.dtype(jnp.int8):
        raise ValueError(f"quantized_matmul: w must be int8, got {w.dtype}")
    if jnp.dtype(scale.dtype) != jnp.dtype(jnp.float32):
        raise ValueError(f"quantized_matmul: scale must be float32, got {scale.dtype}")


# --- the oracle, the cost model and the inputs ---------------------------------------------------


def quantized_matmul_reference(x: np.ndarray, w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``x @ (w * scale)`` in float64 NumPy, scale broadcast over w's columns.

    >>> quantized_matmul_reference(np.ones((1, 2)), np.int8([[1, -128], [2, 127]]),
    ...                            np.float32([0.5, 2.0]))
    array([[ 1.5, -2. ]])
    """
    x = np.asarray(x).astype(np.float64)
    w = np.asarray(w).astype(np.float64)
    return x @ (w * np.asarray(scale).astype(np.float64)[None, :])


def quantized_matmul_cost(x: Any, w: Any, scale: Any) -> pl.CostEstimate:
    """Flops and HBM bytes: each operand read once (w as int8), the output written once."""
    m, k = x.shape
    n = w.shape[1]
    itemsize = jnp.dtype(x.dtype).itemsize
    return pl.CostEstimate(
        # The product, plus the scale once per output element.
        flops=2 * m * k * n + m * n,
        transcendentals=0,
        bytes_accessed=itemsize * (m * k + m * n) + k * n + 4 * n,
    )


def quantized_matmul_inputs(dims: dict[str, int], dtype: str,
                            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, w, scale)`` for dimensions ``m, k, n``; x in ``dtype``.

    w is int8 drawn uniformly over its whole range, -128 and 127 included
    (placed at random when w has two elements or more); scale is float32 with
    log-uniform magnitudes from 1e-4 to 1e2, so the columns' outputs differ by
    up to six orders of magnitude.
    """
    m, k, n = (int(dims[name]) for name in ("m", "k", "n"))
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = rng.standard_normal((m, k)).astype(np_dtype)
    w = rng.integers(-128, 127, size=(k, n), endpoint=True, dtype=np.int8)
    if w.size >= 2:
        extremes = rng.choice(w.size, size=2, replace=False)
        w.flat[extremes] = [-128, 127]
    scale = (10.0 ** rng.uniform(-4, 2, size=n)).astype(np.float32)
    return x, w, scale


# --- the kernel ----------------------------------------------------------------------------------


def _quantized_matmul_kernel(x_ref, w_ref, scale_ref, o_ref, acc_ref, *, num_k_blocks: int):
    k_block = pl.program_id(2)

    @pl.when(k_block == 0)
    def _initialise():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # Dequantise in VMEM, right before the MXU: exact, and w never exists as
    # floats in HBM. The per-column scale waits for the epilogue.
    w = w_ref[...].astype(x_ref.dtype)
    acc_ref[...] += jnp.dot(x_ref[...], w, preferred_element_type=jnp.float32)

    @pl.when(k_block == num_k_blocks - 1)
    def _scale_and_write():
        o_ref[...] = (acc_ref[...] * scale_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_m", "block_k", "block_n"))
def _quantized_matmul(x, w, scale, *, block_m: int, block_k: int, block_n: int):
    m, k = x.shape
    n = w.shape[1]
    m_pad, k_pad, n_pad = round_up(m, block_m), round_up(k, block_k), round_up(n, block_n)
    x = pad_to(x, (m_pad, k_pad))
    w = pad_to(w, (k_pad, n_pad))
    scale = pad_to(scale.reshape(1, n), (1, n_pad))
    num_k = k_pad // block_k
    out = pl.pallas_call(
        functools.partial(_quantized_matmul_kernel, num_k_blocks=num_k),
        out_shape=output_struct((m_pad, n_pad), x.dtype, x, w, scale),
        grid=(m_pad // block_m, n_pad // block_n, num_k),
        in_specs=[
            pl.BlockSpec((block_m, block_k), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((block_k, block_n), lambda i, j, kk: (kk, j)),
            pl.BlockSpec((1, block_n), lambda i, j, kk: (0, j)),
        ],
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        cost_estimate=quantized_matmul_cost(x, w, scale[0]),
        name="quantized_matmul",
    )(x, w, scale)
    return out[:m, :n]


def quantized_matmul_blocked(x: jax.Array, w: jax.Array, scale: jax.Array, *,
                             block_m: int | None = None, block_k: int | None = None,
                             block_n: int | None = None) -> jax.Array:
    """``quantized_matmul`` with chosen blocks.

    ``block_m`` must be a multiple of the sublane tiling of x's dtype (8 for
    float32, 16 for bfloat16) or equal m; ``block_k`` and ``block_n`` multiples of
    128 or equal k and n. ``None`` picks a default (at most 512 each).

    >>> x = jnp.ones((16, 300)); w = jnp.ones((300, 200), jnp.int8)
    >>> quantized_matmul_blocked(x, w, jnp.ones(200), block_k=128, block_n=128).shape
    (16, 200)
    """
    _check_operands(x, w, scale)
    (m, k), n = x.shape, w.shape[1]
    sublanes = native_sublanes(x.dtype)
    block_m = resolve_block("block_m", block_m, "m", m, sublanes,
                            f"TPU sublane tiling of {jnp.dtype(x.dtype).name}, the second-minor "
                            "dimension of x's block", cap=DEFAULT_BLOCK_M)
    block_k = resolve_block("block_k", block_k, "k", k, LANES,
                            "TPU lane tiling, the minor dimension of x's block; also a multiple of "
                            "int8's 32-row sublane tiling of w's block", cap=DEFAULT_BLOCK_K)
    block_n = resolve_block("block_n", block_n, "n", n, LANES,
                            "TPU lane tiling, the minor dimension of w's, scale's and the output's "
                            "block", cap=DEFAULT_BLOCK_N)
    return _quantized_matmul(x, w, scale, block_m=block_m, block_k=block_k, block_n=block_n)


@supports(blocks={"block_m": "m", "block_k": "k", "block_n": "n"})
def quantized_matmul(x: jax.Array, w: jax.Array, scale: jax.Array, *,
                     block_m: int | None = None, block_k: int | None = None,
                     block_n: int | None = None) -> jax.Array:
    """``x @ (w * scale)``: x ``(m, k)`` float32 or bfloat16, w ``(k, n)`` int8, scale ``(n,)``
    float32; accumulated in float32, in x's dtype. Any sizes.

    >>> quantized_matmul(jnp.ones((1, 2)), jnp.array([[1, -128], [2, 127]], jnp.int8),
    ...                  jnp.array([0.5, 2.0]))
    Array([[ 1.5, -2. ]], dtype=float32)
    """
    return quantized_matmul_blocked(x, w, scale, block_m=block_m, block_k=block_k,
                                    block_n=block_n)
