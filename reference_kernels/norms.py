"""RMS normalisation on the TPU: a row reduction fused with an elementwise scale.

Contract op (docs/contract.md section 2, version 0.2):

* ``rms_norm(x, w, *, eps)``: ``x / sqrt(mean(x**2, -1) + eps) * w`` for x
  ``(rows, cols)`` and w ``(cols,)``, computed in float32, output dtype = x's.

Tunable variant: ``rms_norm_blocked(x, w, *, eps, block_rows=)``. Beside the
kernel: its float64 oracle ``rms_norm_reference`` and cost model ``rms_norm_cost``.

The TPU idea: a row block holds whole rows, so the reduction over ``cols`` (a
cross-lane sum on the vector unit) and the elementwise scale that uses its result
happen on the same VMEM block, in one pass: x is read from HBM once and the output
written once, instead of a reduction kernel writing the row statistics to HBM and
a second kernel reading x again. The mean of squares and the reciprocal square
root (``lax.rsqrt``, one EUP instruction per row) are float32 whatever x's dtype;
the output is rounded once, at the end. Rows are independent, so the row axis is
"parallel" and need not divide the block: the last block may run past the end of
x, and its extra rows (garbage on the TPU, NaN in the TPU interpreter) produce
output rows Pallas never writes back.

The error allowance is the comparator's default for the output dtype with
reduction length ``cols``, and 2 ulp of ``max|output|`` in float32 for rsqrt and
the two products (``ops.error_models.rms_norm_allowance``): the float32 sum of
``cols`` squares is off by at most about ``eps32 * (1 + log2 cols)`` relative
(every term is positive, so no cancellation), half of that reaches the output
through the square root, XLA's rsqrt is off by up to 2 ulp and the two products
by half an ulp each, and the output's rounding is the default's one ulp. At
``cols = 1`` the default alone is about one ulp, which this kernel missed by
1.02 times. A bfloat16 accumulator for the sum of squares (2**-9 relative per
addition) is far over both for float32 x.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas.ops.domains import supports

from ._tiling import check_block, native_sublanes, output_struct, round_up
from .attention import _SUPPORTED_DTYPES

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "rms_norm",
    "rms_norm_blocked",
    "rms_norm_cost",
    "rms_norm_reference",
]

# The largest default x block, in bytes: x and the output are double-buffered,
# so 4 x 2 MiB = 8 MiB of VMEM, under the 16 MiB of a v4, and large enough that
# the ~0.35 us per grid step stays small beside each step's HBM transfer.
DEFAULT_BLOCK_BYTES = 2 * 1024 * 1024


def _check_operands(x: Any, w: Any) -> None:
    if jnp.ndim(x) != 2 or jnp.ndim(w) != 1 or x.shape[1] != w.shape[0]:
        raise ValueError(
            f"rms_norm expects x (rows, cols) and w (cols,), got shapes {jnp.shape(x)}, "
            f"{jnp.shape(w)}"
        )
    if jnp.dtype(x.dtype) not in _SUPPORTED_DTYPES or jnp.dtype(w.dtype) not in _SUPPORTED_DTYPES:
        raise ValueError(
            f"rms_norm: x and w must be float32 or bfloat16, got {x.dtype} and {w.dtype}"
        )


def _static_eps(eps: Any) -> float:
    try:
        return float(eps)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise TypeError(
            f"rms_norm: eps must be a Python float known when tracing, got {eps!r}"
        ) from None


# --- the oracle and the cost model --------------------------------------------------------


def rms_norm_reference(x: np.ndarray, w: np.ndarray, *, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x**2, -1) + eps) * w`` in float64 NumPy.

    >>> rms_norm_reference(np.array([[3.0, 4.0]]), np.array([1.0, 2.0]), eps=0.0)
    array([[0.84852814, 2.2627417 ]])
    """
    x, w = np.asarray(x).astype(np.float64), np.asarray(w).astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rms_norm_cost(x: Any, w: Any, *, eps: float = 1e-6) -> pl.CostEstimate:
    """Flops, transcendentals and HBM bytes: x and w read once, the output written once."""
    del eps
    rows, cols = x.shape
    itemsize = jnp.dtype(x.dtype).itemsize
    return pl.CostEstimate(
        # Square and add per element, then the two products per element.
        flops=4 * rows * cols,
        transcendentals=rows,  # one rsqrt per row
        bytes_accessed=2 * rows * cols * itemsize + cols * jnp.dtype(w.dtype).itemsize,
    )


# --- the kernel --------------------------------------------------------------------------------


def _rms_norm_kernel(x_ref, w_ref, o_ref, *, eps: float):
    x = x_ref[...].astype(jnp.float32)
    mean_square = jnp.mean(x * x, axis=1, keepdims=True)
    scaled = x * jax.lax.rsqrt(mean_square + eps)
    o_ref[...] = (scaled * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("eps", "block_rows"))
def _rms_norm(x, w, *, eps: float, block_rows: int):
    rows, cols = x.shape
    return pl.pallas_call(
        functools.partial(_rms_norm_kernel, eps=eps),
        out_shape=output_struct(x.shape, x.dtype, x, w),
        grid=(pl.cdiv(rows, block_rows),),
        in_specs=[
            pl.BlockSpec((block_rows, cols), lambda i: (i, 0)),
            pl.BlockSpec((1, cols), lambda i: (0, 0)),  # the same w block at every step
        ],
        out_specs=pl.BlockSpec((block_rows, cols), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        cost_estimate=rms_norm_cost(x, w),
        name="rms_norm",
    )(x, w.reshape(1, cols))


def _default_block_rows(rows: int, cols: int, dtype: Any) -> int:
    sublanes = native_sublanes(dtype)
    # VMEM holds a row padded to whole 128-lane tiles.
    row_bytes = round_up(cols, 128) * jnp.dtype(dtype).itemsize
    cap = max(sublanes, DEFAULT_BLOCK_BYTES // row_bytes // sublanes * sublanes)
    return rows if rows <= cap else cap


def rms_norm_blocked(x: jax.Array, w: jax.Array, *, eps: float,
                     block_rows: int | None = None) -> jax.Array:
    """``rms_norm`` with a chosen row block.

    ``block_rows`` must be a multiple of the sublane tiling (8 for float32, 16 for
    bfloat16) or equal rows; ``None`` picks whole rows up to 2 MiB of x per block.
    A block always spans all the columns (the reduction needs whole rows).

    >>> rms_norm_blocked(jnp.ones((40, 300)), jnp.ones(300), eps=1e-6, block_rows=16).shape
    (40, 300)
    """
    _check_operands(x, w)
    eps = _static_eps(eps)
    rows, cols = x.shape
    if block_rows is None:
        block_rows = _default_block_rows(rows, cols, x.dtype)
    else:
        check_block("block_rows", block_rows, "rows", rows, native_sublanes(x.dtype),
                     f"TPU sublane tiling of {jnp.dtype(x.dtype).name}, the second-minor "
                     "dimension of x's block")
    return _rms_norm(x, w, eps=eps, block_rows=block_rows)


@supports(blocks={"block_rows": "rows"})
def rms_norm(x: jax.Array, w: jax.Array, *, eps: float,
             block_rows: int | None = None) -> jax.Array:
    """``x / sqrt(mean(x**2, -1) + eps) * w``, computed in float32, in x's dtype.

    x ``(rows, cols)``, w ``(cols,)``, each float32 or bfloat16; any sizes.

    >>> rms_norm(jnp.array([[3.0, 4.0]]), jnp.array([1.0, 2.0]), eps=0.0)
    Array([[0.84852815, 2.2627418 ]], dtype=float32)
    """
    return rms_norm_blocked(x, w, eps=eps, block_rows=block_rows)
