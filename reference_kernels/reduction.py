"""Reduction over the leading axis on the TPU: the revisit rule and a float32 accumulator.

Contract op (docs/contract.md section 2):

* ``sum_leading_axis(x)``: ``x.sum(axis=0)``, ``(n, r, c)`` in, ``(r, c)`` out,
  same dtype; float32 or bfloat16, bfloat16 accumulated in float32.

Variants:

* ``sum_leading_axis_whole_slab``: the textbook kernel. A 1-D grid over ``n``;
  step ``k`` gets the whole ``(r, c)`` slab ``x[k]`` in VMEM and adds it into a
  float32 accumulator.
* ``sum_leading_axis_tiled``: the same reduction with ``r`` and ``c`` tiled as
  well, on a grid ``(r blocks, c blocks, n blocks)``, so slabs of any size
  stream through VMEM, and several slices of ``n`` per step (``block_n``).

The TPU ideas shown here:

* The output block of step ``(i, j, k)`` depends only on ``(i, j)``: while ``k``
  runs, the block stays in VMEM and is written back to HBM once, when ``(i, j)``
  changes. Pallas never reads an output block back from HBM, so a reduction
  must sit on the minormost (last) grid axes: had ``k`` come first, block
  ``(i, j)`` would be revisited after being written out, losing the partial sum.
* Scratch memory (``pltpu.VMEM`` in ``scratch_shapes``) persists across grid
  steps but starts as garbage (NaN in TPU interpret mode), so the accumulator is
  zeroed under ``pl.when(pl.program_id(last) == 0)`` and stored, cast to the
  output dtype, under ``pl.when(... == last step)``. It is float32 whatever the
  input: summing many bfloat16 values in bfloat16 would lose about 3 digits.
* ``dimension_semantics=("parallel", "parallel", "arbitrary")``: the ``(i, j)``
  blocks are independent (a megacore chip splits them over its two
  TensorCores), the reduction axis carries state from step to step.

Sizes need not be multiples of the blocks: a partial ``(r, c)`` block at the
edge reads unspecified values and its out-of-range writes are dropped, which is
harmless because every output element depends only on its own position; a
partial block of ``n`` would add garbage into real sums, so the kernel only
adds the slices that exist.

Under ``jax.vmap`` each mapped axis becomes a leading "parallel" grid axis
(``jax.custom_batching.custom_vmap``), which is what Mosaic makes of Pallas's
own batching rule; that rule, left alone, trips jax 0.10's TPU interpreter.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas.ops.domains import supports

from ._tiling import LANES, check_block, native_sublanes, round_up, spread

__all__ = [
    "DEFAULT_BLOCK_COLS",
    "DEFAULT_BLOCK_ROWS",
    "DEFAULT_INPUT_BLOCK_BYTES",
    "sum_leading_axis",
    "sum_leading_axis_cost",
    "sum_leading_axis_reference",
    "sum_leading_axis_tiled",
    "sum_leading_axis_whole_slab",
]

# Largest default (r, c) tile: 256 x 512 float32 is a 512 KiB accumulator.
DEFAULT_BLOCK_ROWS = 256
DEFAULT_BLOCK_COLS = 512
# The default block_n stacks slices until the input block reaches this size (as
# laid out in VMEM): a summation is bound by HBM bandwidth, and a 2 MiB step
# hides the ~0.35 us fixed cost of a grid step even when (r, c) is small. Double
# buffered, plus the output block and the accumulator: about 5.5 MiB of VMEM,
# inside the 16 MiB default. In interpret mode on the CPU, where each grid step
# costs milliseconds, it also keeps test-sized inputs to one or a few steps.
DEFAULT_INPUT_BLOCK_BYTES = 2 << 20

_SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


# --- shared helpers -------------------------------------------------------------


def _check_operand(x: Any) -> None:
    if jnp.ndim(x) != 3:
        raise ValueError(f"expected x of shape (n, r, c), got shape {jnp.shape(x)}")
    if jnp.dtype(jnp.result_type(x)) not in _SUPPORTED_DTYPES:
        raise ValueError(f"x must be float32 or bfloat16, got {jnp.result_type(x)}")


# --- oracle and cost model ----------------------------------------------------------


def sum_leading_axis_reference(x: np.ndarray) -> np.ndarray:
    """``x.sum(axis=0)`` in float64 NumPy (bfloat16 inputs come as ``ml_dtypes.bfloat16``).

    >>> sum_leading_axis_reference(np.ones((3, 1, 2), np.float32))
    array([[3., 3.]])
    """
    return np.asarray(x).astype(np.float64).sum(axis=0)


def sum_leading_axis_cost(x: Any) -> pl.CostEstimate:
    """One add per input element; HBM traffic is reading ``x`` once and writing ``(r, c)`` once.

    Takes anything with ``.shape`` and ``.dtype``; leading batch axes (from
    ``jax.vmap``) multiply the cost.
    """
    *batch, n, r, c = x.shape
    b = math.prod(batch)
    itemsize = jnp.dtype(x.dtype).itemsize
    return pl.CostEstimate(
        flops=int(b * n * r * c),
        transcendentals=0,
        bytes_accessed=int(b * (n + 1) * r * c * itemsize),
    )


# --- batching ---------------------------------------------------------------------------


def _batchable(call):
    """``call(x)`` on ``(*batch, n, r, c)`` as a function that ``jax.vmap`` turns into grid axes.

    Pallas's own batching rule also prepends a grid axis, but leaves
    ``dimension_semantics`` one entry short, which jax 0.10's TPU interpreter
    rejects (Mosaic pads it with "parallel"). Here each vmapped axis becomes a
    leading batch axis of the operand, which the kernel's grid covers with
    "parallel" steps, as the compiler would.
    """

    @jax.custom_batching.custom_vmap
    def kernel_call(x):
        return call(x)

    @kernel_call.def_vmap
    def _batched(axis_size, in_batched, x):
        del axis_size, in_batched  # the only operand is the batched one
        return kernel_call(x), True

    return kernel_call


# --- the textbook kernel: whole (r, c) slabs --------------------------------------------


def _whole_slab_kernel(x_ref, o_ref, acc_ref, *, k_axis: int):
    k = pl.program_id(k_axis)

    @pl.when(k == 0)
    def _initialise():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += x_ref[...].astype(jnp.float32)

    @pl.when(k == pl.num_programs(k_axis) - 1)
    def _write_back():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _whole_slab_call(x):
    *batch, n, r, c = x.shape
    nb = len(batch)
    squeezed = (None,) * nb  # batch axes (from jax.vmap): one element per grid step
    return pl.pallas_call(
        functools.partial(_whole_slab_kernel, k_axis=nb),
        out_shape=jax.ShapeDtypeStruct((*batch, r, c), x.dtype),
        grid=(*batch, n),
        # None (or pl.squeezed): a block of one slice along n, dropped from the kernel's view.
        in_specs=[pl.BlockSpec((*squeezed, None, r, c), lambda *g: (*g, 0, 0))],
        # The same output block at every step of n: it stays in VMEM until the end.
        out_specs=pl.BlockSpec((*squeezed, r, c), lambda *g: (*g[:nb], 0, 0)),
        scratch_shapes=[pltpu.VMEM((r, c), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",) * nb + ("arbitrary",)
        ),
        cost_estimate=sum_leading_axis_cost(x),
        name="sum_leading_axis_whole_slab",
    )(x)


_sum_whole_slab = jax.jit(_batchable(_whole_slab_call))


def sum_leading_axis_whole_slab(x: jax.Array) -> jax.Array:
    """``x.sum(axis=0)`` with one ``(r, c)`` slab per grid step.

    Any ``r`` and ``c`` are legal (the block spans both full dimensions), but a
    slab must fit in VMEM twice over (double buffering) plus the float32
    accumulator, the grid takes ``n`` steps, and its single axis is a
    reduction, which leaves nothing for a second TensorCore.
    ``sum_leading_axis_tiled`` lifts all three limits.
    """
    _check_operand(x)
    n, r, c = jnp.shape(x)
    if n == 0 or r * c == 0:
        return jnp.sum(x, axis=0, dtype=jnp.float32).astype(x.dtype)  # nothing to stream
    return _sum_whole_slab(x)


# --- the tiled kernel ----------------------------------------------------------------------


def _tiled_kernel(x_ref, o_ref, acc_ref, *, k_axis: int, n: int, block_n: int):
    k = pl.program_id(k_axis)

    @pl.when(k == 0)
    def _initialise():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def add_slice(t, carry):
        # Indexing the untiled leading dimension of a VMEM block is a cheap
        # address offset; each slice is one (block_rows, block_cols) tile set.
        acc_ref[...] += x_ref[t].astype(jnp.float32)
        return carry

    if n % block_n:
        # The last block of n sticks out of the array: add only the slices that exist.
        num_slices = jnp.minimum(block_n, n - k * block_n)
    else:
        num_slices = block_n
    jax.lax.fori_loop(0, num_slices, add_slice, None)

    @pl.when(k == pl.num_programs(k_axis) - 1)
    def _write_back():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _tiled_call(x, *, block_n: int, block_rows: int, block_cols: int):
    *batch, n, r, c = x.shape
    nb = len(batch)
    squeezed = (None,) * nb  # batch axes (from jax.vmap): one element per grid step
    grid = (*batch, pl.cdiv(r, block_rows), pl.cdiv(c, block_cols), pl.cdiv(n, block_n))
    return pl.pallas_call(
        functools.partial(_tiled_kernel, k_axis=nb + 2, n=n, block_n=block_n),
        out_shape=jax.ShapeDtypeStruct((*batch, r, c), x.dtype),
        grid=grid,
        in_specs=[pl.BlockSpec((*squeezed, block_n, block_rows, block_cols),
                               lambda *g: (*g[:nb], g[nb + 2], g[nb], g[nb + 1]))],
        out_specs=pl.BlockSpec((*squeezed, block_rows, block_cols),
                               lambda *g: (*g[:nb], g[nb], g[nb + 1])),
        scratch_shapes=[pltpu.VMEM((block_rows, block_cols), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",) * (nb + 2) + ("arbitrary",)
        ),
        cost_estimate=sum_leading_axis_cost(x),
        name="sum_leading_axis_tiled",
    )(x)


@functools.cache
def _tiled_kernel_call(block_n: int, block_rows: int, block_cols: int):
    return _batchable(functools.partial(
        _tiled_call, block_n=block_n, block_rows=block_rows, block_cols=block_cols))


@functools.partial(jax.jit, static_argnames=("block_n", "block_rows", "block_cols"))
def _sum_tiled(x, *, block_n: int, block_rows: int, block_cols: int):
    return _tiled_kernel_call(block_n, block_rows, block_cols)(x)


def sum_leading_axis_tiled(
    x: jax.Array,
    *,
    block_rows: int | None = None,
    block_cols: int | None = None,
    block_n: int | None = None,
) -> jax.Array:
    """``x.sum(axis=0)`` on a ``(r blocks, c blocks, n blocks)`` grid.

    ``block_rows`` must be a multiple of the sublane tiling (8 for float32, 16
    for bfloat16) and ``block_cols`` of 128, or each at least its full
    dimension; ``block_n`` (slices of ``n`` added per step) is any positive int,
    since the leading dimension of a block is not tiled. ``None`` picks at most
    ``DEFAULT_BLOCK_ROWS`` x ``DEFAULT_BLOCK_COLS`` (spread evenly over the
    fewest blocks) and as many slices as fit in ``DEFAULT_INPUT_BLOCK_BYTES``.
    None of the sizes need divide its dimension.
    """
    _check_operand(x)
    n, r, c = jnp.shape(x)
    dtype = jnp.result_type(x)
    if n == 0 or r * c == 0:
        return jnp.sum(x, axis=0, dtype=jnp.float32).astype(dtype)  # nothing to stream
    sublanes, name = native_sublanes(dtype), jnp.dtype(dtype).name
    if block_rows is None:
        block_rows = spread(r, sublanes, DEFAULT_BLOCK_ROWS)
    else:
        block_rows = check_block(
            "block_rows", block_rows, "r", r, sublanes,
            f"TPU sublane tiling of {name}, the second-minor dimension of the block",
        clip=True,
        )
    if block_cols is None:
        block_cols = spread(c, LANES, DEFAULT_BLOCK_COLS)
    else:
        block_cols = check_block(
            "block_cols", block_cols, "c", c, LANES,
            "TPU lane tiling, the minor dimension of the block",
        clip=True,
        )
    if block_n is None:
        slice_bytes = (round_up(block_rows, sublanes) * round_up(block_cols, LANES)
                       * jnp.dtype(dtype).itemsize)
        block_n = max(1, min(n, DEFAULT_INPUT_BLOCK_BYTES // slice_bytes))
        # As many steps, with the slices spread evenly: the last block wastes less.
        block_n = -(-n // -(-n // block_n))
    else:
        block_n = check_block("block_n", block_n, "n", n, 1, "", clip=True)
    return _sum_tiled(x, block_n=block_n, block_rows=block_rows, block_cols=block_cols)


@supports(blocks={"block_rows": "r", "block_cols": "c", "block_n": ("n", 1)})
def sum_leading_axis(x: jax.Array, *, block_rows: int | None = None,
                     block_cols: int | None = None, block_n: int | None = None) -> jax.Array:
    """``x.sum(axis=0)`` for ``(n, r, c)`` float32 or bfloat16, accumulated in float32.

    The tiled kernel with its default blocks: small inputs take one grid step,
    large ones stream through VMEM in blocks of about 2 MiB.
    """
    return sum_leading_axis_tiled(x, block_rows=block_rows, block_cols=block_cols,
                                  block_n=block_n)
