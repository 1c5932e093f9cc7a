"""Elementwise addition on the TPU: whole arrays in VMEM, then pipelined blocks.

Contract op (docs/contract.md section 2):

* ``add(x, y)``: ``x + y`` for same-shape, same-dtype arrays of rank 1 to 3 and
  any sizes, float32, bfloat16 or int32 (int32 wraps around as ``jnp`` does).

Variants, one TPU idea each:

* ``add_whole_array``: no grid. ``pallas_call`` copies both operands from HBM
  into VMEM, runs the body once and copies the result back. Any shape is legal
  (the block is the whole array), but nothing overlaps the copies and the
  arrays must fit in VMEM (16 MiB of scoped VMEM by default on v4/v5e).
* ``add_1d_grid``: the arrays flattened into a lane-dense ``(rows, 128)`` view
  and a 1-D grid over blocks of rows. Pallas double-buffers the blocks: it
  copies block ``i + 1`` into VMEM while the VPU adds block ``i``. Every vreg
  is full whatever the original shape (a ``(1000, 3)`` array would otherwise
  use 3 of 128 lanes).
* ``add_2d_grid``: the arrays viewed as 2-D ``(leading dims, last dim)`` and a
  2-D grid of ``(block_rows, block_cols)`` blocks: no reshuffling of the data,
  tunable blocks in both directions.

Every grid axis of an elementwise op is ``"parallel"``: no step depends on
another, so a megacore chip (v4, v5p) splits the grid between its two
TensorCores. Sizes need not be multiples of the block: the last block along an
axis may stick out of the array; the TPU reads unspecified values there and
drops the writes that fall outside, which is harmless for an elementwise op.

Under ``jax.vmap`` each mapped axis becomes a leading "parallel" grid axis
(``jax.custom_batching.custom_vmap``), which is what Mosaic makes of Pallas's
own batching rule; that rule, left alone, trips jax 0.10's TPU interpreter.

Each kernel sits next to its oracle (``add_reference``) and cost model (``add_cost``).
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

from ._tiling import LANES, check_block, native_sublanes, round_up, spread

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_BLOCK_COLS",
    "DEFAULT_BLOCK_ROWS",
    "add",
    "add_1d_grid",
    "add_2d_grid",
    "add_cost",
    "add_reference",
    "add_whole_array",
]

# One block per operand per grid step, at most this many bytes (256 Ki float32
# values). An elementwise add is bound by HBM bandwidth; a 1 MiB step moves 3 MiB
# (x, y, out), long enough to hide the ~0.35 us fixed cost of a grid step, and
# the double-buffered blocks of the three operands take 6 MiB of VMEM, inside
# the 16 MiB default scoped VMEM of every TPU generation. An array that fits in
# one such block runs without a grid (see ``add``); in interpret mode on the CPU,
# where every grid step costs milliseconds, test-sized arrays run in one step.
DEFAULT_BLOCK_BYTES = 1 << 20

# ``add_2d_grid``'s largest default block: 256 x 1024 float32 is the same 1 MiB,
# with wide rows because a block row is one contiguous run of HBM per DMA.
DEFAULT_BLOCK_ROWS = 256
DEFAULT_BLOCK_COLS = 1024


# --- shared helpers -------------------------------------------------------------


def _check_operands(x: Any, y: Any) -> None:
    if jnp.shape(x) != jnp.shape(y) or jnp.result_type(x) != jnp.result_type(y):
        raise ValueError(
            "x and y must have the same shape and dtype, got "
            f"{jnp.shape(x)} {jnp.result_type(x)} and {jnp.shape(y)} {jnp.result_type(y)}"
        )
    dtype = jnp.dtype(jnp.result_type(x))
    numeric = jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
    if not numeric or dtype.itemsize not in (1, 2, 4):
        raise ValueError(
            f"unsupported dtype {dtype}: TPU vector units handle 8-, 16- and 32-bit "
            "numbers (the contract draws float32, bfloat16 and int32)"
        )


def _as_2d(shape: tuple[int, ...]) -> tuple[int, int]:
    # Collapsing the leading dimensions of a row-major array is free (no copy).
    if len(shape) <= 1:
        return 1, math.prod(shape)
    return math.prod(shape[:-1]), shape[-1]


def _vmem_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    """Bytes an array occupies in VMEM, whose last two dimensions are stored in
    (sublane, 128) tiles."""
    rows, cols = _as_2d(shape) if len(shape) <= 2 else (shape[-2], shape[-1])
    leading = math.prod(shape[:-2]) if len(shape) > 2 else 1
    padded = leading * round_up(rows, native_sublanes(dtype)) * round_up(cols, LANES)
    return padded * jnp.dtype(dtype).itemsize


# --- oracle and cost model ----------------------------------------------------------


def add_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x + y`` in NumPy: float64 for floating inputs, the exact wrapped result for integers.

    >>> add_reference(np.int32([2**31 - 1]), np.int32([1]))
    array([-2147483648], dtype=int32)
    >>> add_reference(np.float32([0.5]), np.float32([0.25]))
    array([0.75])
    """
    x, y = np.asarray(x), np.asarray(y)
    if np.issubdtype(x.dtype, np.integer):
        # NumPy array arithmetic wraps modulo 2**bits, as XLA's does.
        return np.add(x, y, dtype=x.dtype)
    return x.astype(np.float64) + y.astype(np.float64)


def add_cost(x: Any, y: Any) -> pl.CostEstimate:
    """One op per element; HBM traffic is reading ``x`` and ``y`` and writing the sum once.

    Takes anything with ``.shape`` and ``.dtype`` (arrays, ``jax.ShapeDtypeStruct``).
    """
    del y  # same shape and dtype as x
    size = math.prod(x.shape)
    return pl.CostEstimate(
        flops=int(size),
        transcendentals=0,
        bytes_accessed=int(3 * size * jnp.dtype(x.dtype).itemsize),
    )


# --- kernels ------------------------------------------------------------------------


def _add_kernel(x_ref, y_ref, o_ref):
    # Loading a VMEM ref fills vregs, the VPU adds, the store goes back to VMEM;
    # pallas_call's pipeline moves the blocks between HBM and VMEM.
    o_ref[...] = x_ref[...] + y_ref[...]


def _batch_index(batch_shape: tuple[int, ...], grid_indices: tuple[Any, ...]) -> tuple[Any, ...]:
    # A batch axis of size 1 belongs to an operand that was not vmapped: every
    # step reads it in place instead of from a broadcast copy.
    return tuple(index if size != 1 else 0 for size, index in zip(batch_shape, grid_indices))


def _add_pallas_call(x, y, *, example_rank: int, block: tuple[int, ...] | None, name: str):
    """The kernel on operands ``(*batch, *example)``, each batch axis full or 1.

    ``block=None`` puts the whole example in VMEM; otherwise the example is
    tiled by ``block``. Batch axes (one per ``jax.vmap``) lead the grid.
    """
    nb = x.ndim - example_rank
    x_batch, y_batch, example = x.shape[:nb], y.shape[:nb], x.shape[nb:]
    batch = tuple(max(a, b) for a, b in zip(x_batch, y_batch))
    out_shape = jax.ShapeDtypeStruct((*batch, *example), x.dtype)
    cost = pl.CostEstimate(
        flops=int(math.prod(out_shape.shape)), transcendentals=0,
        bytes_accessed=int((x.size + y.size + math.prod(out_shape.shape)) * x.dtype.itemsize),
    )
    if block is None and not batch:
        # No grid: the whole arrays are copied into VMEM, the body runs once.
        whole = pl.BlockSpec(memory_space=pltpu.VMEM)
        return pl.pallas_call(_add_kernel, out_shape=out_shape, in_specs=[whole, whole],
                              out_specs=whole, cost_estimate=cost, name=name)(x, y)
    block_grid = () if block is None else tuple(pl.cdiv(d, b) for d, b in zip(example, block))
    block = example if block is None else block

    def index_map(batch_shape):
        def index(*g):
            return (*_batch_index(batch_shape, g[:nb]), *(g[nb:] or (0,) * example_rank))
        return index

    squeezed = (None,) * nb  # one batch element per grid step, squeezed away in the kernel
    grid = (*batch, *block_grid)
    return pl.pallas_call(
        _add_kernel,
        out_shape=out_shape,
        grid=grid,
        in_specs=[pl.BlockSpec((*squeezed, *block), index_map(x_batch)),
                  pl.BlockSpec((*squeezed, *block), index_map(y_batch))],
        out_specs=pl.BlockSpec((*squeezed, *block), index_map(batch)),
        # No grid step reads another's output: megacore chips may split every axis.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",) * len(grid)),
        cost_estimate=cost,
        name=name,
    )(x, y)


@functools.cache
def _add_kernel_call(example_rank: int, block: tuple[int, ...] | None, name: str):
    """The kernel as a function that ``jax.vmap`` turns into leading "parallel" grid axes.

    Pallas's own batching rule also prepends a grid axis, but leaves
    ``dimension_semantics`` one entry short, which jax 0.10's TPU interpreter
    rejects (Mosaic pads it with "parallel"); and it squeezes a rank-1
    operand's batch axis into the tiled second-minor position. This rule does
    what the compiler does, with the batch axes ahead of the tiled ones.
    """
    call = functools.partial(_add_pallas_call, example_rank=example_rank, block=block, name=name)

    @jax.custom_batching.custom_vmap
    def kernel_call(x, y):
        return call(x, y)

    @kernel_call.def_vmap
    def _batched(axis_size, in_batched, x, y):
        del axis_size
        x_batched, y_batched = in_batched
        return kernel_call(x if x_batched else x[None], y if y_batched else y[None]), True

    return kernel_call


@jax.jit
def _add_whole_array(x, y):
    shape = x.shape
    if len(shape) < 2:
        # A rank-1 array is stored as one (1, n) row: a vmapped batch axis then
        # lands on an untiled leading dimension.
        x, y = x.reshape(_as_2d(shape)), y.reshape(_as_2d(shape))
    out = _add_kernel_call(x.ndim, None, "add_whole_array")(x, y)
    return out.reshape(shape)


def add_whole_array(x: jax.Array, y: jax.Array) -> jax.Array:
    """``x + y`` in one kernel invocation on whole arrays in VMEM (no grid).

    ``BlockSpec(memory_space=VMEM)`` with no block shape asks for the whole
    array: legal for any shape, but the copy in, the add and the copy out run
    one after the other, and everything must fit in VMEM. Good for small
    arrays. Under ``jax.vmap`` the batch becomes a grid, one element per step.
    """
    _check_operands(x, y)
    if math.prod(jnp.shape(x)) == 0:
        return jnp.add(x, y)  # nothing to move: no kernel to launch
    return _add_whole_array(x, y)


@functools.partial(jax.jit, static_argnames=("block_rows",))
def _add_1d_grid(x, y, *, block_rows: int):
    shape, size = x.shape, x.size
    rows = -(-size // LANES)
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    if size % LANES:
        # Only a size that is not a multiple of 128 needs a copy to fill the last
        # lane row; a ragged number of rows is left to the partial last block.
        flat_x = jnp.pad(flat_x, (0, rows * LANES - size))
        flat_y = jnp.pad(flat_y, (0, rows * LANES - size))
    x2, y2 = flat_x.reshape(rows, LANES), flat_y.reshape(rows, LANES)
    out = _add_kernel_call(2, (block_rows, LANES), "add_1d_grid")(x2, y2)
    return out.reshape(-1)[:size].reshape(shape)


def add_1d_grid(x: jax.Array, y: jax.Array, *, block_size: int | None = None) -> jax.Array:
    """``x + y`` over a lane-dense ``(rows, 128)`` view with a 1-D grid of row blocks.

    ``block_size`` is the number of elements per block: a multiple of 1024 for
    32-bit dtypes, 2048 for 16-bit ones (whole ``(sublanes, 128)`` tiles, the
    block being ``(block_size // 128, 128)``), or at least the array's size (one
    block). ``None`` picks at most ``DEFAULT_BLOCK_BYTES`` per block, spread
    evenly over the fewest blocks.
    """
    _check_operands(x, y)
    dtype = jnp.result_type(x)
    size = math.prod(jnp.shape(x))
    if size == 0:
        return jnp.add(x, y)  # nothing to move: no kernel to launch
    rows = -(-size // LANES)
    tile = native_sublanes(dtype) * LANES
    if block_size is None:
        cap = max(tile, DEFAULT_BLOCK_BYTES // jnp.dtype(dtype).itemsize) // LANES
        block_rows = spread(rows, native_sublanes(dtype), cap)
    else:
        block = check_block(
            "block_size", block_size, "size", size, tile,
            f"whole ({native_sublanes(dtype)}, {LANES}) TPU tiles of {jnp.dtype(dtype).name}: "
            f"the block is (block_size // {LANES}, {LANES})",
        clip=True,
        )
        block_rows = rows if block >= size else min(rows, block // LANES)
    return _add_1d_grid(x, y, block_rows=block_rows)


@functools.partial(jax.jit, static_argnames=("block_rows", "block_cols"))
def _add_2d_grid(x, y, *, block_rows: int, block_cols: int):
    shape = x.shape
    rows, cols = _as_2d(shape)
    out = _add_kernel_call(2, (block_rows, block_cols), "add_2d_grid")(
        x.reshape(rows, cols), y.reshape(rows, cols))
    return out.reshape(shape)


def add_2d_grid(
    x: jax.Array, y: jax.Array, *, block_rows: int | None = None, block_cols: int | None = None
) -> jax.Array:
    """``x + y`` over the 2-D view ``(product of leading dims, last dim)`` with a 2-D grid.

    ``block_rows`` must be a multiple of the sublane tiling (8 for 32-bit, 16
    for 16-bit dtypes) and ``block_cols`` of 128, or each at least its full
    dimension. ``None`` picks at most ``DEFAULT_BLOCK_ROWS`` x
    ``DEFAULT_BLOCK_COLS``, spread evenly over the fewest blocks. A last
    dimension that is not a multiple of 128 leaves lanes of every vreg idle:
    ``add_1d_grid`` avoids that.
    """
    _check_operands(x, y)
    dtype = jnp.result_type(x)
    rows, cols = _as_2d(jnp.shape(x))
    if rows * cols == 0:
        return jnp.add(x, y)  # nothing to move: no kernel to launch
    sublanes, name = native_sublanes(dtype), jnp.dtype(dtype).name
    if block_rows is None:
        block_rows = spread(rows, sublanes, DEFAULT_BLOCK_ROWS)
    else:
        block_rows = check_block(
            "block_rows", block_rows, "rows", rows, sublanes,
            f"TPU sublane tiling of {name}, the second-minor dimension of the block",
        clip=True,
        )
    if block_cols is None:
        block_cols = spread(cols, LANES, DEFAULT_BLOCK_COLS)
    else:
        block_cols = check_block(
            "block_cols", block_cols, "cols", cols, LANES,
            "TPU lane tiling, the minor dimension of the block",
        clip=True,
        )
    return _add_2d_grid(x, y, block_rows=block_rows, block_cols=block_cols)


def add(x: jax.Array, y: jax.Array) -> jax.Array:
    """``x + y`` for same-shape, same-dtype arrays (float32, bfloat16, int32 wrapping around).

    An array that fits in one default block (``DEFAULT_BLOCK_BYTES`` as laid
    out in VMEM) runs whole, with no grid and no reshaping; a larger one runs
    pipelined over the lane-dense ``(rows, 128)`` view (``add_1d_grid``).
    """
    _check_operands(x, y)
    if _vmem_bytes(jnp.shape(x) or (1,), jnp.result_type(x)) <= DEFAULT_BLOCK_BYTES:
        return add_whole_array(x, y)
    return add_1d_grid(x, y)
