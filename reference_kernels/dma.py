"""Moving data by hand: DMAs, semaphores, scalar prefetch, aliasing and refs.

Contract op (docs/contract.md section 2):

* ``copy(x)``: ``x`` bit for bit, rank 2, float32, bfloat16 or int32, any sizes.

Variants, each a different way of moving data on a TPU:

* ``double_buffered_copy(x, *, block_rows)``: a hand-written two-slot pipeline
  that starts the next block's DMA before it waits for the current one.
* ``gather_rows(x, indices, *, block_cols)``: ``x[indices]``; the indices are
  prefetched into SMEM and the BlockSpec's ``index_map`` reads them.
* ``add_one_in_place(x, *, block_rows)``: ``x + 1`` written into ``x``'s own
  buffer (``input_output_aliases``), through the same double-buffered pipeline.
* ``add_refs_style(x, y, *, block_rows)``: ``x + y`` with the refs API
  (``jax.new_ref``/``jax.empty_ref``/``jax.freeze`` and a ``pl.kernel`` that
  takes refs and returns nothing).

Each kernel sits next to its NumPy oracle (``*_reference``) and its cost model
(``*_cost``). The copies are exact, so their oracles return the input in its
own dtype (NaN payloads and signed zeros included) rather than float64.

The TPU ideas shown here:

* An operand in ``pl.ANY`` memory space stays where XLA put it (HBM): Pallas
  copies nothing into VMEM, the kernel gets a reference to HBM, and moving data
  is the kernel's job. ``pltpu.make_async_copy(src, dst, sem).start()`` issues a
  DMA that runs alongside the TensorCore; ``.wait()`` blocks on the DMA
  semaphore until the bytes have arrived. Reading a buffer before the wait is a
  data race (TPU interpret mode's race detector reports it).
* VMEM is small (16 to 128 MiB, depending on the chip), so large arrays move
  in chunks through a bounded VMEM buffer that ``pl.run_scoped`` allocates for
  the duration of the kernel.
* Deferring waits is what makes a pipeline: while block ``i`` is being written
  out, block ``i + 1`` is already on its way in.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas import tpu

from ._tiling import LANES, check_block, native_sublanes, round_up

__all__ = [
    "COPY_CHUNK_BYTES",
    "add_one_in_place",
    "add_one_in_place_cost",
    "add_one_in_place_reference",
    "add_refs_style",
    "add_refs_style_cost",
    "add_refs_style_reference",
    "copy",
    "copy_cost",
    "copy_reference",
    "double_buffered_copy",
    "double_buffered_copy_cost",
    "double_buffered_copy_reference",
    "gather_rows",
    "gather_rows_cost",
    "gather_rows_reference",
]

# VMEM one staging buffer may take. 2 MiB leaves room for double buffering
# (twice that) inside the 16 MiB default scoped VMEM of every TPU generation,
# and is large enough that a DMA's fixed cost is small next to its transfer.
COPY_CHUNK_BYTES = 2 * 2**20

_SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.int32))


# --- shared helpers -------------------------------------------------------------


def _check_array(name: str, x: Any, *, rank: int = 2) -> None:
    if jnp.ndim(x) != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {jnp.shape(x)}")
    if jnp.dtype(x.dtype) not in _SUPPORTED_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or int32, got {x.dtype}")
    if min(x.shape) < 1:
        raise ValueError(f"{name} must have sizes >= 1, got shape {x.shape}")


def _row_block(name: str, block: int | None, rows: int, row_bytes: int, dtype: Any,
               budget: int) -> int:
    """A TPU-legal number of rows per block: given (validated) or fitted to ``budget`` bytes.

    ``row_bytes`` is one row's footprint in VMEM, lanes padded to 128. A block
    larger than the array is clipped to it (then it equals the full dimension).
    """
    sublanes = native_sublanes(dtype)
    if block is not None:
        check_block(name, block, "rows", rows, sublanes,
                     f"TPU sublane tiling of {jnp.dtype(dtype).name}")
        return min(block, rows)
    fitted = max(sublanes, budget // row_bytes // sublanes * sublanes)
    return min(rows, fitted)


def _rows_per_dma(block: int, rows: int, dtype: Any) -> int:
    """``block`` for an array of ``rows`` rows, kept TPU-legal.

    A block that equalled the full dimension of an unbatched array is no
    longer legal once ``jax.vmap`` folded the batch into rows; it becomes the
    largest multiple of the sublane tiling below it.
    """
    sublanes = native_sublanes(dtype)
    if block >= rows:
        return rows
    if block % sublanes == 0:
        return block
    return max(sublanes, block // sublanes * sublanes)


def _padded_row_bytes(cols: int, dtype: Any) -> int:
    return round_up(cols, LANES) * jnp.dtype(dtype).itemsize


def _nbytes(x: Any) -> int:
    return math.prod(x.shape) * jnp.dtype(x.dtype).itemsize


def _for_block(index: Any, block: int, num_full: int, remainder: int,
               fn: Callable[[Any, int], None]) -> None:
    """Call ``fn(start_row, num_rows)`` for block ``index`` with a static ``num_rows``.

    All blocks but a ragged last one have ``block`` rows. A DMA's shape is
    static, so a traced ``index`` picks between the two shapes with ``pl.when``
    instead of padding the array in HBM (which would cost a full extra pass).
    """
    if isinstance(index, int):
        fn(index * block, block if index < num_full else remainder)
        return
    if remainder == 0:
        fn(pl.multiple_of(index * block, block), block)
        return

    @pl.when(index < num_full)
    def _full():
        fn(pl.multiple_of(index * block, block), block)

    @pl.when(index == num_full)
    def _ragged():
        fn(num_full * block, remainder)


def _fold_batch_into_rows(kernel_call: Callable[[jax.Array], jax.Array]) -> Callable:
    """``kernel_call`` on rank-2 arrays, made ``jax.vmap``-able by folding batch axes into rows.

    A ``pallas_call`` whose operands stay in HBM (``pl.ANY``) has no BlockSpec
    for Pallas's own batching rule to extend. Copying rows does not care which
    batch element they belong to, so a batch of ``(r, c)`` arrays is copied as
    one ``(b * r, c)`` array (a free reshape: the batch is the major axis).
    """

    @jax.custom_batching.custom_vmap
    def call(x):
        return kernel_call(x)

    @call.def_vmap
    def _batched(axis_size, in_batched, x):
        del axis_size, in_batched
        return call(x.reshape(-1, x.shape[-1])).reshape(x.shape), True

    return call


# --- oracles ---------------------------------------------------------------------


def copy_reference(x: np.ndarray) -> np.ndarray:
    """``x`` unchanged, in its own dtype: a copy is compared bit for bit."""
    return np.array(x, copy=True)


def double_buffered_copy_reference(x: np.ndarray) -> np.ndarray:
    """Same as ``copy_reference``."""
    return copy_reference(x)


def gather_rows_reference(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``x[clip(indices, 0, rows - 1)]`` in ``x``'s dtype (a gather is exact)."""
    x = np.asarray(x)
    return x[np.clip(np.asarray(indices).astype(np.int64), 0, x.shape[0] - 1)]


def _wrapping_sum(*operands: np.ndarray) -> np.ndarray:
    operands = [np.asarray(operand) for operand in operands]
    if np.issubdtype(operands[0].dtype, np.integer):
        # int64 holds the exact sum; the cast back wraps modulo 2**32 as jnp does.
        return sum(operand.astype(np.int64) for operand in operands).astype(operands[0].dtype)
    return sum(operand.astype(np.float64) for operand in operands)


def add_one_in_place_reference(x: np.ndarray) -> np.ndarray:
    """``x + 1`` in float64 (integers: int32 with wrap-around, ``INT32_MAX + 1 == INT32_MIN``)."""
    x = np.asarray(x)
    return _wrapping_sum(x, np.ones_like(x))


def add_refs_style_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x + y`` in float64 (integers: int32 with wrap-around)."""
    return _wrapping_sum(x, y)


# --- cost models -----------------------------------------------------------------


def copy_cost(x: Any) -> pl.CostEstimate:
    """No arithmetic; every byte read from HBM once and written back once."""
    return pl.CostEstimate(flops=0, transcendentals=0, bytes_accessed=2 * _nbytes(x))


def double_buffered_copy_cost(x: Any) -> pl.CostEstimate:
    """Same traffic as ``copy``: double buffering hides DMA latency, it moves no fewer bytes."""
    return copy_cost(x)


def gather_rows_cost(x: Any, indices: Any) -> pl.CostEstimate:
    """Each gathered row read once and written once, plus the indices (4 bytes each)."""
    num = math.prod(indices.shape)
    row_bytes = x.shape[-1] * jnp.dtype(x.dtype).itemsize
    return pl.CostEstimate(flops=0, transcendentals=0,
                           bytes_accessed=2 * num * row_bytes + 4 * num)


def add_one_in_place_cost(x: Any) -> pl.CostEstimate:
    """One add per element; read and written once (in the same buffer)."""
    return pl.CostEstimate(flops=math.prod(x.shape), transcendentals=0,
                           bytes_accessed=2 * _nbytes(x))


def add_refs_style_cost(x: Any, y: Any) -> pl.CostEstimate:
    """One add per element; ``x`` and ``y`` read once, the sum written once."""
    return pl.CostEstimate(flops=math.prod(x.shape), transcendentals=0,
                           bytes_accessed=_nbytes(x) + _nbytes(y) + _nbytes(x))


# --- copy: HBM -> VMEM -> HBM in chunks ---------------------------------------------


def _chunked_copy_kernel(x_hbm, o_hbm, *, block: int, num_full: int, remainder: int):
    """Stage each chunk of rows through one VMEM buffer: DMA in, wait, DMA out, wait.

    Both refs are in HBM. The staging buffer and its DMA semaphore live only
    while ``run_scoped``'s body runs. Each wait comes right after its start,
    so the copy is correct but not overlapped; ``double_buffered_copy`` shows
    how to overlap.
    """

    def body(stage, sem, *tail):
        def copy_rows(start, size):
            rows = pl.ds(start, size)
            # The tail chunk has a buffer of its own size: a slice of `stage` whose
            # row count is not a multiple of 8 is a VMEM slice the TPU compiler
            # rejects ("Slice sizes along tiled dimensions must be aligned to tiles").
            staged = stage if size == block else tail[0]
            inbound = pltpu.make_async_copy(x_hbm.at[rows], staged, sem)
            inbound.start()
            # The staging buffer is only valid once the semaphore says so.
            inbound.wait()
            outbound = pltpu.make_async_copy(staged, o_hbm.at[rows], sem)
            outbound.start()
            # The next chunk would overwrite the buffer this DMA is reading.
            outbound.wait()

        if num_full:
            @pl.loop(0, num_full)
            def _chunk(i):
                _for_block(i, block, num_full, 0, copy_rows)

        if remainder:
            copy_rows(num_full * block, remainder)

    tail = (pltpu.VMEM((remainder, x_hbm.shape[1]), x_hbm.dtype),) if remainder else ()
    pl.run_scoped(body, pltpu.VMEM((block, x_hbm.shape[1]), x_hbm.dtype), pltpu.SemaphoreType.DMA,
                  *tail)


@functools.cache
def _chunked_copy_call(block: int) -> Callable[[jax.Array], jax.Array]:
    def kernel_call(x):
        rows_per_dma = _rows_per_dma(block, x.shape[0], x.dtype)
        num_full, remainder = divmod(x.shape[0], rows_per_dma)
        return pl.pallas_call(
            functools.partial(_chunked_copy_kernel, block=rows_per_dma, num_full=num_full,
                              remainder=remainder),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            # pl.ANY: no BlockSpec pipeline, the kernel moves the data itself.
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            cost_estimate=copy_cost(x),
            name="copy",
        )(x)

    return jax.jit(_fold_batch_into_rows(kernel_call))


def copy(x: jax.Array) -> jax.Array:
    """``x`` bit for bit, copied HBM -> VMEM -> HBM by DMAs in chunks of at most 2 MiB.

    Rank 2, float32, bfloat16 or int32, any sizes >= 1; a ragged last chunk is
    a smaller DMA, not padding. Under ``jax.vmap`` the batch is folded into rows.

    >>> copy(jnp.arange(6, dtype=jnp.int32).reshape(2, 3))
    Array([[0, 1, 2],
           [3, 4, 5]], dtype=int32)
    """
    _check_array("x", x)
    rows, cols = x.shape
    block = _row_block("block_rows", None, rows, _padded_row_bytes(cols, x.dtype), x.dtype,
                       COPY_CHUNK_BYTES)
    return _chunked_copy_call(block)(x)


# --- double-buffered pipeline: copy, and add one in place ------------------------------


def _double_buffered_kernel(x_hbm, o_hbm, *, block: int, num_full: int, remainder: int,
                            update: Callable[[jax.Array], jax.Array] | None):
    """A two-slot pipeline: block ``i`` goes out of slot ``i % 2`` while ``i + 1`` comes into
    the other.

    Each slot has its own DMA semaphore; a slot's inbound and outbound DMAs
    never overlap, so they share it. The loop body, for block ``i``:

    1. wait until slot ``1 - i % 2`` has been written out (block ``i - 1``),
       then start block ``i + 1``'s DMA into it (the prefetch);
    2. wait for block ``i``'s inbound DMA (started one iteration earlier);
    3. apply ``update`` to the slot, if any, while the prefetch is in flight;
    4. start block ``i``'s outbound DMA, and do not wait for it: the next
       iteration (or the drain after the loop) does.
    """
    num_blocks = num_full + (remainder > 0)

    def body(slots, sems):
        def inbound(slot):
            return lambda start, size: pltpu.make_async_copy(
                x_hbm.at[pl.ds(start, size)], slots.at[slot, pl.ds(0, size)], sems.at[slot])

        def outbound(slot):
            return lambda start, size: pltpu.make_async_copy(
                slots.at[slot, pl.ds(0, size)], o_hbm.at[pl.ds(start, size)], sems.at[slot])

        def on_block(index, make_copy, action):
            _for_block(index, block, num_full, remainder,
                       lambda start, size: getattr(make_copy(start, size), action)())

        on_block(0, inbound(0), "start")

        @pl.loop(0, num_blocks)
        def _block(i):
            slot = i % 2
            other = 1 - slot

            @pl.when(i + 1 < num_blocks)
            def _prefetch():
                @pl.when(i >= 1)
                def _slot_free():
                    on_block(i - 1, outbound(other), "wait")

                on_block(i + 1, inbound(other), "start")

            on_block(i, inbound(slot), "wait")
            if update is not None:
                # The whole slot, aligned to the tiling even for a ragged last
                # block: the rows past its end are never written out.
                slots[slot] = update(slots[slot])
            on_block(i, outbound(slot), "start")

        # Drain: the last two outbound DMAs were never waited for in the loop.
        if num_blocks >= 2:
            on_block(num_blocks - 2, outbound((num_blocks - 2) % 2), "wait")
        on_block(num_blocks - 1, outbound((num_blocks - 1) % 2), "wait")

    pl.run_scoped(
        body,
        pltpu.VMEM((2, block, x_hbm.shape[1]), x_hbm.dtype),
        pltpu.SemaphoreType.DMA((2,)),
    )


def _add_one(block: jax.Array) -> jax.Array:
    return block + jnp.asarray(1, block.dtype)


@functools.cache
def _double_buffered_call(block: int, in_place: bool) -> Callable[[jax.Array], jax.Array]:
    name = "add_one_in_place" if in_place else "double_buffered_copy"
    cost = add_one_in_place_cost if in_place else double_buffered_copy_cost

    def kernel_call(x):
        rows_per_dma = _rows_per_dma(block, x.shape[0], x.dtype)
        num_full, remainder = divmod(x.shape[0], rows_per_dma)
        return pl.pallas_call(
            functools.partial(_double_buffered_kernel, block=rows_per_dma,
                              num_full=num_full, remainder=remainder,
                              update=_add_one if in_place else None),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            # Output 0 is input 0's HBM buffer. Safe because block i is read
            # (inbound DMA waited for) before block i is written, and no block
            # is read after another block's write could reach it.
            input_output_aliases={0: 0} if in_place else {},
            cost_estimate=cost(x),
            name=name,
        )(x)

    return jax.jit(_fold_batch_into_rows(kernel_call))


def double_buffered_copy(x: jax.Array, *, block_rows: int | None = None) -> jax.Array:
    """``x`` bit for bit through a hand-written double-buffered DMA pipeline.

    ``block_rows`` rows per DMA: a multiple of 8 (float32, int32) or 16
    (bfloat16), or the full number of rows; ``None`` fits one slot in 1 MiB.
    Sizes need not divide the block (the last DMA is smaller).

    >>> double_buffered_copy(jnp.ones((20, 3)), block_rows=8).shape
    (20, 3)
    """
    _check_array("x", x)
    rows, cols = x.shape
    block = _row_block("block_rows", block_rows, rows, _padded_row_bytes(cols, x.dtype), x.dtype,
                       COPY_CHUNK_BYTES // 2)
    return _double_buffered_call(block, False)(x)


def add_one_in_place(x: jax.Array, *, block_rows: int | None = None) -> jax.Array:
    """``x + 1`` (int32 wraps), written over ``x``'s own HBM buffer.

    ``input_output_aliases={0: 0}`` makes the output reuse input 0's buffer:
    no second array is allocated. The caller's array is consumed only when it
    is donated (``jax.jit(..., donate_argnums=0)``); otherwise XLA first copies
    it so that the caller's ``x`` survives. The update runs in the
    double-buffered pipeline of ``double_buffered_copy``; ``block_rows`` has
    the same rules.

    The buffers stay in HBM (``pl.ANY``) so that a ragged edge is a smaller
    DMA: with a BlockSpec grid whose blocks do not divide the array, JAX
    0.10's TPU interpreter returns the aliased output padded to whole blocks.

    >>> add_one_in_place(jnp.zeros((2, 2), jnp.int32))
    Array([[1, 1],
           [1, 1]], dtype=int32)
    """
    _check_array("x", x)
    rows, cols = x.shape
    block = _row_block("block_rows", block_rows, rows, _padded_row_bytes(cols, x.dtype), x.dtype,
                       COPY_CHUNK_BYTES // 2)
    return _double_buffered_call(block, True)(x)


# --- gather with scalar prefetch ----------------------------------------------------


def _gather_kernel(indices_smem, row_ref, o_ref):
    """Grid step ``(i, j)``: the pipeline already fetched row ``indices[i]``, block column ``j``.

    ``indices_smem`` is unused here: the ``index_map`` read it to choose the
    block, before the step ran (that is what scalar prefetch is for).
    """
    del indices_smem
    o_ref[...] = row_ref[...]


@functools.partial(jax.jit, static_argnames=("block_cols",))
def _gather_rows(x, indices, *, block_cols: int):
    rows, cols = x.shape
    num = indices.shape[0]
    # Out-of-range indices would make the DMA read outside x; clip like jnp.take(mode="clip").
    indices = jnp.clip(indices.astype(jnp.int32), 0, rows - 1)
    # One row per block is (1, cols): the second-minor block dim 1 is TPU-legal
    # only when it equals the array's, so the row axis becomes a squeezed
    # leading axis of a (rows, 1, cols) view.
    x3 = x.reshape(rows, 1, cols)
    block = (pl.squeezed, 1, block_cols)
    out = pl.pallas_call(
        _gather_kernel,
        out_shape=jax.ShapeDtypeStruct((num, 1, cols), x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            # The first operand (indices) is copied to SMEM before the grid
            # runs, and every index_map gets it as a trailing argument.
            num_scalar_prefetch=1,
            grid=(num, pl.cdiv(cols, block_cols)),
            in_specs=[pl.BlockSpec(block, lambda i, j, idx: (idx[i], 0, j))],
            out_specs=pl.BlockSpec(block, lambda i, j, idx: (i, 0, j)),
        ),
        # Every output block is written by exactly one step.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        cost_estimate=gather_rows_cost(x, indices),
        name="gather_rows",
    )(indices, x3)
    return out.reshape(num, cols)


def gather_rows(x: jax.Array, indices: jax.Array, *, block_cols: int | None = None) -> jax.Array:
    """``x[indices]`` (rows), with the indices in SMEM choosing each step's block.

    ``indices`` is a 1-D integer array (kept in SMEM, so at most a few
    thousand entries); out-of-range indices are clipped. ``block_cols`` is a
    multiple of 128 or the full number of columns (default: all of them up to
    16384). Repeated consecutive indices cost one DMA: Pallas skips the fetch
    when a block index does not change between steps.

    >>> gather_rows(jnp.arange(6.0).reshape(3, 2), jnp.array([2, 0]))
    Array([[4., 5.],
           [0., 1.]], dtype=float32)
    """
    _check_array("x", x)
    if jnp.ndim(indices) != 1 or not jnp.issubdtype(jnp.result_type(indices), jnp.integer):
        raise ValueError(
            f"indices must be a 1-D integer array, got shape {jnp.shape(indices)} "
            f"and dtype {jnp.result_type(indices)}"
        )
    indices = jnp.asarray(indices)
    cols = x.shape[1]
    if indices.shape[0] == 0:
        return jnp.zeros((0, cols), x.dtype)
    if block_cols is None:
        block_cols = min(cols, 16384)
    else:
        check_block("block_cols", block_cols, "cols", cols, LANES,
                     "TPU lane tiling, the minor dimension of the row block")
        block_cols = min(block_cols, cols)
    return _gather_rows(x, indices, block_cols=block_cols)


# --- the refs style ---------------------------------------------------------------------


def _add_refs(x_ref, y_ref, o_ref, *, block_rows: int):
    """``o_ref[...] = x_ref[...] + y_ref[...]``, the refs in HBM, pipelined through VMEM.

    The kernel returns nothing: its result is what it wrote into ``o_ref``.
    ``emit_pipeline`` is the BlockSpec pipeline of a ``pallas_call`` grid as a
    call inside the kernel; it double-buffers the blocks in VMEM.
    """
    rows, cols = x_ref.shape
    num_cores = pltpu.get_tpu_info().num_cores

    def add_block(x_block, y_block, o_block):
        o_block[...] = x_block[...] + y_block[...]

    spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    pltpu.emit_pipeline(
        add_block,
        grid=(rows // block_rows,),
        in_specs=[spec, spec],
        out_specs=[spec],
        # On a megacore chip the two TensorCores split the blocks; naming the
        # core axis with one core would fail in plain interpret mode.
        core_axis_name="core" if num_cores > 1 else None,
        dimension_semantics=(pltpu.PARALLEL,),
    )(x_ref, y_ref, o_ref)


@functools.partial(jax.jit, static_argnames=("block_rows",))
def _add_refs_style(x, y, *, block_rows: int):
    rows = x.shape[0]
    padded = round_up(rows, block_rows)
    if padded != rows:
        # emit_pipeline has no ragged edge blocks: pad to whole blocks.
        x = jnp.pad(x, ((0, padded - rows), (0, 0)))
        y = jnp.pad(y, ((0, padded - rows), (0, 0)))
    # Mutable buffers: the kernel reads x_ref and y_ref and writes o_ref in
    # place. jax.empty_ref allocates without initialising (it exists only
    # under jit) and jax.freeze turns the ref back into an immutable array.
    x_ref, y_ref = jax.new_ref(x), jax.new_ref(y)
    o_ref = jax.empty_ref(jax.ShapeDtypeStruct(x.shape, x.dtype))
    num_cores = pltpu.get_tpu_info().num_cores
    kernel = pl.kernel(
        functools.partial(_add_refs, block_rows=block_rows),
        # No outputs: every ref passed in is aliased in and out of the kernel.
        out_type=(),
        mesh=tpu.tensorcore_mesh("core", num_cores),
        cost_estimate=add_refs_style_cost(x, y),
        name="add_refs_style",
    )
    kernel(x_ref, y_ref, o_ref)
    return jax.freeze(o_ref)[:rows]


def add_refs_style(x: jax.Array, y: jax.Array, *, block_rows: int | None = None) -> jax.Array:
    """``x + y`` (int32 wraps) written in the refs style: ``pl.kernel`` on refs, no return value.

    A kernel that takes refs copies nothing in and out: called in a loop on
    the same refs it pays no launch-to-launch copies, the style for collectives
    and in-place updates. ``block_rows``: multiple of the sublane tiling or all
    rows (default: blocks of at most 2 MiB; ragged sizes are padded).

    Needs ``pltpu.get_tpu_info()`` (on the CPU, the chip pytest-pallas stands
    in for) and TPU interpret mode: JAX 0.10's plain interpreter
    (``interpret=True``) drops the kernel's writes to refs it was passed.
    """
    _check_array("x", x)
    if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(
            f"x and y must have the same shape and dtype, got {x.shape} {x.dtype} "
            f"and {y.shape} {y.dtype}"
        )
    rows, cols = x.shape
    block = _row_block("block_rows", block_rows, rows, _padded_row_bytes(cols, x.dtype), x.dtype,
                       COPY_CHUNK_BYTES)
    return _add_refs_style(x, y, block_rows=block)
