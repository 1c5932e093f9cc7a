"""Pallas TPU kernels with one seeded bug each, for proving the conformance suite's power.

Every function here has the signature of a contract op (docs/contract.md section 2)
and is a plausible kernel that somebody could write and believe correct: it
runs, returns the right shape and dtype, and is right on many inputs. Its
docstring says what is wrong and which real mistake it models.
``tests/test_suite_power.py`` runs the conformance suite on each one and
asserts that the suite fails it, on the property that should catch the bug.

Blocks are TPU-legal (the minor dimension a multiple of 128 or the full
dimension, the second-minor a multiple of 8 or the full dimension), so each
bug is a bug of the algorithm, not of the tiling.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_LANES = 128


# --- helpers --------------------------------------------------------------------------


def _as_2d(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) <= 1:
        return 1, math.prod(shape)
    return math.prod(shape[:-1]), shape[-1]


def _whole_block_call(kernel, out_shape: jax.ShapeDtypeStruct, *args, scratch_shapes=()):
    """``kernel`` on whole arrays: a one-step grid whose blocks are the full arrays.

    A full-dimension block is always TPU-legal, and Pallas's own batching rule
    turns a ``jax.vmap`` of the call into an extra (parallel) grid axis.
    """

    def full(shape):
        zeros = (0,) * len(shape)
        return pl.BlockSpec(shape, lambda i: zeros)

    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(1,),
        in_specs=[full(a.shape) for a in args],
        out_specs=full(out_shape.shape),
        scratch_shapes=list(scratch_shapes),
    )(*args)


def _pad_to(array: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    if array.shape == shape:
        return array
    return jnp.pad(array, [(0, target - size) for size, target in zip(array.shape, shape)])


def _fold_batch_into_rows(kernel_call):
    """Make a rank-2 HBM kernel ``jax.vmap``-able: a batch of (r, c) arrays is one (b*r, c)
    array."""

    @jax.custom_batching.custom_vmap
    def call(x):
        return kernel_call(x)

    @call.def_vmap
    def _batched(axis_size, in_batched, x):
        del axis_size, in_batched
        return call(x.reshape(-1, x.shape[-1])).reshape(x.shape), True

    return call


# --- add --------------------------------------------------------------------------------


def _add_full_vregs_kernel(x_ref, y_ref, o_ref):
    lanes = x_ref.shape[-1]
    main = lanes // _LANES * _LANES
    if main:
        o_ref[:, :main] = x_ref[:, :main] + y_ref[:, :main]
    # BUG: no epilogue for the last ``lanes % 128`` lanes of each row.


def add_tail_not_written(x, y):
    """``x + y`` over whole 128-lane vregs only: the ragged tail of every row is never written.

    Bug: the body adds ``[:, :cols // 128 * 128]`` and has no epilogue for the
    remaining ``cols % 128`` lanes, so those output elements keep whatever the
    output buffer held (a row shorter than 128 lanes is not written at all).

    Models: vectorising a loop over full vregs and forgetting the remainder
    loop, the classic "works for multiples of the tile size" kernel.
    """
    shape = x.shape
    x2, y2 = x.reshape(_as_2d(shape)), y.reshape(_as_2d(shape))
    out = _whole_block_call(_add_full_vregs_kernel, jax.ShapeDtypeStruct(x2.shape, x2.dtype),
                            x2, y2)
    return out.reshape(shape)


_ADD_BLOCK_ROWS = 8


def _add_whole_row_blocks_kernel(x_ref, y_ref, o_ref, *, rows: int, block: int):
    i = pl.program_id(0)

    # BUG: meant to keep the last block from running past the end of x, this skips a
    # ragged last block altogether (it should compute it: Pallas drops the writes past
    # the end).
    @pl.when((i + 1) * block <= rows)
    def _compute():
        o_ref[...] = x_ref[...] + y_ref[...]


def add_ragged_row_block_not_written(x, y):
    """``x + y`` in blocks of 8 rows over a ``cdiv(rows, 8)`` grid; a ragged last row block
    is never written.

    Bug: the body is guarded by ``(i + 1) * 8 <= rows``, so when rows is more than
    8 and not a multiple of 8, the last ``rows % 8`` rows of the output keep
    whatever the output buffer held. A single block (rows <= 8, the whole
    dimension) and whole multiples of 8 rows (24, 40) are right.

    Models: a bounds check written for the lane-dense case that also skips the
    partial edge block along the sublane (row) axis.
    """
    shape = x.shape
    x2, y2 = x.reshape(_as_2d(shape)), y.reshape(_as_2d(shape))
    rows, cols = x2.shape
    block = _ADD_BLOCK_ROWS if rows > _ADD_BLOCK_ROWS else rows
    spec = pl.BlockSpec((block, cols), lambda i: (i, 0))
    out = pl.pallas_call(
        functools.partial(_add_whole_row_blocks_kernel, rows=rows, block=block),
        out_shape=jax.ShapeDtypeStruct(x2.shape, x2.dtype),
        grid=(pl.cdiv(rows, block),),
        in_specs=[spec, spec],
        out_specs=spec,
    )(x2, y2)
    return out.reshape(shape)


def _add_via_float32_kernel(x_ref, y_ref, o_ref):
    # BUG: every dtype goes through float32, int32 included.
    total = x_ref[...].astype(jnp.float32) + y_ref[...].astype(jnp.float32)
    o_ref[...] = total.astype(o_ref.dtype)


def add_int32_via_float32(x, y):
    """``x + y`` computed in float32 for every dtype: int32 loses its low bits and its wrap-around.

    Bug: the operands are cast to float32 (24-bit mantissa), added, and cast
    back. Exact for float32 and bfloat16 and for small integers; wrong for
    int32 beyond 2**24, and an int32 overflow saturates instead of wrapping.

    Models: "the VPU computes in float32 anyway" (true of bfloat16 on v5e),
    extended without thought to integer inputs.
    """
    shape = x.shape
    x2, y2 = x.reshape(_as_2d(shape)), y.reshape(_as_2d(shape))
    out = _whole_block_call(_add_via_float32_kernel, jax.ShapeDtypeStruct(x2.shape, x2.dtype),
                            x2, y2)
    return out.reshape(shape)


# --- sum over the leading axis --------------------------------------------------------


def _sum_no_init_kernel(x_ref, o_ref, acc_ref):
    k = pl.program_id(0)
    # BUG: no `@pl.when(k == 0): acc_ref[...] = 0` - the scratch starts as garbage.
    acc_ref[...] += x_ref[...].astype(jnp.float32)

    @pl.when(k == pl.num_programs(0) - 1)
    def _write_back():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def sum_uninitialized_accumulator(x):
    """``x.sum(axis=0)`` with a float32 VMEM accumulator that is never zeroed.

    Bug: scratch memory persists across grid steps but starts uninitialised;
    the kernel adds into it from the first step on. On a TPU the result is
    garbage plus the sum; in TPU interpret mode it is NaN.

    Models: forgetting the ``pl.when(program_id == 0)`` initialisation of a
    reduction's scratch accumulator.
    """
    n, r, c = x.shape
    return pl.pallas_call(
        _sum_no_init_kernel,
        out_shape=jax.ShapeDtypeStruct((r, c), x.dtype),
        grid=(n,),
        in_specs=[pl.BlockSpec((None, r, c), lambda k: (k, 0, 0))],
        out_specs=pl.BlockSpec((r, c), lambda k: (0, 0)),
        scratch_shapes=[pltpu.VMEM((r, c), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(x)


def _sum_flag_kernel(x_ref, o_ref, acc_ref, started_ref):
    @pl.when(started_ref[0] == 0)
    def _initialise():
        acc_ref[...] = jnp.zeros_like(acc_ref)
        started_ref[0] = jnp.uint32(1)

    acc_ref[...] += x_ref[...].astype(jnp.float32)

    @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
    def _finish():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def sum_started_flag_assumed_zero(x):
    """``x.sum(axis=0)`` that zeroes its accumulator while an SMEM flag still reads 0.

    Bug: the flag is scratch memory, which starts uninitialised, not zeroed; on a TPU the
    accumulator keeps whatever the last kernel left in it unless the flag happens to be 0.
    JAX's plain interpreter fills an unsigned buffer with its minimum, 0, so the kernel is
    right there and in the TPU interpreter with zeroed memory: only the TPU interpreter's
    NaN-filled run (the flag at its maximum) shows the bug.

    Models: a "first step done" flag kept in scratch instead of ``pl.program_id(0) == 0``.
    """
    n, r, c = x.shape
    return pl.pallas_call(
        _sum_flag_kernel,
        out_shape=jax.ShapeDtypeStruct((r, c), x.dtype),
        grid=(n,),
        in_specs=[pl.BlockSpec((None, r, c), lambda k: (k, 0, 0))],
        out_specs=pl.BlockSpec((r, c), lambda k: (0, 0)),
        scratch_shapes=[pltpu.VMEM((r, c), jnp.float32), pltpu.SMEM((1,), jnp.uint32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(x)


_SUM_BLOCK_N = 2


def _sum_unmasked_kernel(x_ref, o_ref, acc_ref):
    k = pl.program_id(0)

    @pl.when(k == 0)
    def _initialise():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # BUG: adds every slice of the block, also those of a ragged last block
    # that lie past the end of x (the reference adds only min(block_n, n - k*block_n)).
    for t in range(_SUM_BLOCK_N):
        acc_ref[...] += x_ref[t].astype(jnp.float32)

    @pl.when(k == pl.num_programs(0) - 1)
    def _write_back():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def sum_unmasked_ragged_block(x):
    """``x.sum(axis=0)`` in blocks of 2 slices; a ragged last block adds the garbage past the end.

    Bug: the grid is ``pl.cdiv(n, 2)`` (right), but the body adds both slices
    of every block, so for odd ``n`` the last block adds a slice that does
    not exist (unspecified memory on a TPU, NaN in interpret mode).

    Models: a partial edge block along a *reduction* axis. Harmless for
    elementwise ops (out-of-range writes are dropped), wrong for a sum.
    """
    n, r, c = x.shape
    return pl.pallas_call(
        _sum_unmasked_kernel,
        out_shape=jax.ShapeDtypeStruct((r, c), x.dtype),
        grid=(pl.cdiv(n, _SUM_BLOCK_N),),
        in_specs=[pl.BlockSpec((_SUM_BLOCK_N, r, c), lambda k: (k, 0, 0))],
        out_specs=pl.BlockSpec((r, c), lambda k: (0, 0)),
        scratch_shapes=[pltpu.VMEM((r, c), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(x)


# --- matmul, matmul_activation, batched_matmul -------------------------------------------


def _matmul_call(kernel, x, y, *, block_k: int, num_k_blocks: int, scratch: bool = True):
    """``(m, k) @ (k, n)`` on a ``(1, 1, num_k_blocks)`` grid, m and n whole."""
    (m, _), n = x.shape, y.shape[1]
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(1, 1, num_k_blocks),
        in_specs=[pl.BlockSpec((m, block_k), lambda i, j, k: (i, k)),
                  pl.BlockSpec((block_k, n), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((m, n), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((m, n), jnp.float32)] if scratch else [],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def _matmul_no_init_kernel(x_ref, y_ref, o_ref, acc_ref):
    k = pl.program_id(2)
    # BUG: the accumulator is never zeroed at k == 0.
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _write_back():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_uninitialized_accumulator(x, y):
    """``x @ y`` accumulating k blocks into a float32 scratch that is never zeroed.

    Bug: no ``pl.when(k == 0)`` initialisation; the first block is added to
    whatever VMEM held (NaN in TPU interpret mode, garbage on a TPU).

    Models: the most common Pallas matmul mistake, and the one a test with a
    zero-initialised simulator never sees.
    """
    k = x.shape[1]
    block_k = _LANES if k % _LANES == 0 else k
    return _matmul_call(_matmul_no_init_kernel, x, y, block_k=block_k,
                        num_k_blocks=k // block_k)


def _matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _initialise():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _write_back():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_dropped_last_k_block(x, y):
    """``x @ y`` in k blocks of 256 with ``k // 256`` grid steps: a ragged last k block is dropped.

    Bug: the number of k steps is ``k // block_k`` (floor) instead of
    ``pl.cdiv(k, block_k)``, and k is not padded, so the last ``k % 256``
    columns of x (rows of y) never enter the sum when k > 256.

    Models: sizing a reduction grid with floor division, right only when the
    block divides the dimension.
    """
    k = x.shape[1]
    block_k = min(k, 256)
    return _matmul_call(_matmul_kernel, x, y, block_k=block_k, num_k_blocks=k // block_k)


def matmul_last_k_step_dropped(x, y):
    """``x @ y`` in k blocks of 128 when 128 divides k (else one whole block), with
    ``max(1, (k - 1) // 128)`` steps: the last k step is dropped whenever there are two or more.

    Bug: an off-by-one "ceiling division" (``(k - 1) // block_k`` instead of
    ``(k + block_k - 1) // block_k``), hidden by ``max(1, ...)``: right for a k that
    is one block (k <= 128, or any k 128 does not divide), wrong for k = 256, 384,
    640, ... (the last 128 columns of x never enter the sum).

    Models: a kernel that tiles a dimension only when the tile divides it, whose
    multi-step path only an input of several whole tiles reaches.
    """
    k = x.shape[1]
    block_k = _LANES if k % _LANES == 0 else k
    return _matmul_call(_matmul_kernel, x, y, block_k=block_k,
                        num_k_blocks=max(1, (k - 1) // block_k))


def _matmul_activation_per_block_kernel(x_ref, y_ref, o_ref, acc_ref, *, activation):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _initialise():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    partial = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    # BUG: the activation is applied to each k block's partial product.
    acc_ref[...] += partial if activation is None else activation(partial)

    @pl.when(k == pl.num_programs(2) - 1)
    def _write_back():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_activation_per_k_block(x, y, *, activation):
    """``activation(x @ y)`` with the activation fused into every k step instead of the last.

    Bug: ``acc += activation(x_blk @ y_blk)``: the sum of activations of the
    partial products, not the activation of the sum. Right when k fits one
    block (<= 128 here) or the activation is None.

    Models: fusing an epilogue into the reduction loop, where it looks
    harmless because the single-block test case passes.
    """
    (m, k), n = x.shape, y.shape[1]
    if k <= _LANES:
        block_k, k_pad = k, k
    else:
        block_k, k_pad = _LANES, -(-k // _LANES) * _LANES
    x, y = _pad_to(x, (m, k_pad)), _pad_to(y, (k_pad, n))
    kernel = functools.partial(_matmul_activation_per_block_kernel, activation=activation)
    return _matmul_call(kernel, x, y, block_k=block_k, num_k_blocks=k_pad // block_k)


def _batched_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...],
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)


def batched_matmul_rhs_batch_ignored(x, y):
    """``(b, m, k) @ (b, k, n)`` whose y index map ignores the batch: every batch uses ``y[0]``.

    Bug: y's ``index_map`` returns ``(0, 0, 0)`` instead of ``(b, 0, 0)``.
    Right when b == 1.

    Models: an index map copied from an operand that is shared across the
    batch (as k and v are across heads in multi-query attention).
    """
    b, m, k = x.shape
    n = y.shape[2]
    return pl.pallas_call(
        _batched_kernel,
        out_shape=jax.ShapeDtypeStruct((b, m, n), x.dtype),
        grid=(b,),
        in_specs=[pl.BlockSpec((None, m, k), lambda i: (i, 0, 0)),
                  pl.BlockSpec((None, k, n), lambda i: (0, 0, 0))],  # BUG: not (i, 0, 0)
        out_specs=pl.BlockSpec((None, m, n), lambda i: (i, 0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x, y)


# --- softmax --------------------------------------------------------------------------------


def _softmax_no_max_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x)  # BUG: no `x - x.max(axis=-1)` first
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def softmax_no_max_subtraction(x):
    """Row softmax as ``exp(x) / sum(exp(x))``, without subtracting the row maximum.

    Bug: mathematically equal, but ``exp`` overflows to inf for entries above
    ~88 (float32) and underflows to 0 for rows whose entries are all below
    ~-103, giving NaN (inf/inf or 0/0).

    Models: the textbook formula typed in as is.
    """
    return _whole_block_call(_softmax_no_max_kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _softmax_online_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    rows, cols = x.shape
    m = jnp.full((rows, 1), -jnp.inf, jnp.float32)
    l = jnp.zeros((rows, 1), jnp.float32)  # noqa: E741 -- l: the running sum of the online softmax
    for start in range(0, cols, _LANES):  # one 128-lane chunk at a time
        chunk = x[:, start:start + _LANES]
        m_new = jnp.maximum(m, chunk.max(axis=-1, keepdims=True))
        # BUG: l is not rescaled by exp(m - m_new) when the running max grows.
        l = l + jnp.exp(chunk - m_new).sum(axis=-1, keepdims=True)  # noqa: E741 -- as above
        m = m_new
    o_ref[...] = (jnp.exp(x - m) / l).astype(o_ref.dtype)


def softmax_online_missing_rescale(x):
    """Row softmax with an online (chunked) max and sum, missing the rescale of the running sum.

    Bug: the denominator is accumulated over 128-lane chunks as
    ``l += sum(exp(chunk - m_new))`` without ``l *= exp(m_old - m_new)``, so
    chunks seen before the row maximum count too much. Right when rows fit
    one chunk, or the maximum is in the first chunk.

    Models: the online-softmax recurrence of flash attention with one of its
    two corrections forgotten.
    """
    return _whole_block_call(_softmax_online_kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


# --- attention, mha, mqa --------------------------------------------------------------------


def _flash_no_rescale_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
                             block_kv: int, kv_len: int):
    kv = pl.program_id(1)

    @pl.when(kv == 0)
    def _initialise():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    logits = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    if kv_len % block_kv:
        column = kv * block_kv + lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        logits = jnp.where(column < kv_len, logits, -jnp.inf)
    m_new = jnp.maximum(m_ref[...], logits.max(axis=1, keepdims=True))
    p = jnp.exp(logits - m_new)
    # BUG: l and acc are not multiplied by exp(m_prev - m_new) before adding this block.
    l_ref[...] = l_ref[...] + p.sum(axis=1, keepdims=True)
    acc_ref[...] = acc_ref[...] + jnp.dot(p, v_ref[...].astype(jnp.float32),
                                          preferred_element_type=jnp.float32)
    m_ref[...] = m_new

    @pl.when(kv == pl.num_programs(1) - 1)
    def _write_back():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def attention_missing_rescale(q, k, v):
    """Flash attention over kv blocks of 128 whose online softmax never rescales ``l`` and ``acc``.

    Bug: when a kv block raises the running row maximum, the denominator and
    the output accumulated so far must be multiplied by
    ``exp(m_prev - m_new)``; this kernel skips that, so earlier blocks are
    over-weighted. Right whenever t fits one block (t <= 128).

    Models: the missing online-softmax rescale, the bug every flash
    attention implementer writes once.
    """
    (s, d), t = q.shape, k.shape[0]
    block_kv = min(t, _LANES)
    t_pad = -(-t // block_kv) * block_kv
    k, v = _pad_to(k, (t_pad, d)), _pad_to(v, (t_pad, d))
    kernel = functools.partial(_flash_no_rescale_kernel, block_kv=block_kv, kv_len=t)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((s, d), q.dtype),
        grid=(1, t_pad // block_kv),
        in_specs=[pl.BlockSpec((s, d), lambda i, j: (i, 0)),
                  pl.BlockSpec((block_kv, d), lambda i, j: (j, 0)),
                  pl.BlockSpec((block_kv, d), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((s, d), lambda i, j: (i, 0)),
        scratch_shapes=[pltpu.VMEM((s, 1), jnp.float32), pltpu.VMEM((s, 1), jnp.float32),
                        pltpu.VMEM((s, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(q, k, v)


def _attention_no_max_kernel(q_ref, k_ref, v_ref, o_ref):
    logits = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    p = jnp.exp(logits)  # BUG: no `logits - logits.max(axis=1)` first
    out = jnp.dot(p, v_ref[...].astype(jnp.float32), preferred_element_type=jnp.float32)
    o_ref[...] = (out / p.sum(axis=1, keepdims=True)).astype(o_ref.dtype)


def attention_no_max_subtraction(q, k, v):
    """``softmax(q @ k.T) @ v`` with the softmax computed as ``exp(logits) / sum(exp(logits))``.

    Bug: no subtraction of the row maximum; ``exp`` overflows (NaN output)
    as soon as a logit exceeds ~88, and a row whose logits are all below
    ~-103 underflows to 0/0.

    Models: the textbook formula; invisible on small random inputs.
    """
    s, d = q.shape
    return _whole_block_call(_attention_no_max_kernel, jax.ShapeDtypeStruct((s, d), q.dtype),
                             q, k, v)


def _attention_block_kernel(q_ref, k_ref, v_ref, o_ref):
    logits = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    p = jnp.exp(logits - logits.max(axis=1, keepdims=True))
    out = jnp.dot(p, v_ref[...].astype(jnp.float32), preferred_element_type=jnp.float32)
    o_ref[...] = (out / p.sum(axis=1, keepdims=True)).astype(o_ref.dtype)


def mha_batch_head_swapped(q, k, v):
    """Multi-head attention on a ``(b, h)`` grid whose index maps return ``(h, b, ...)``.

    Bug: every index map swaps the batch and head grid indices, so grid point
    ``(i, j)`` computes (and writes) attention of batch j, head i. Right when
    b == h == 1; out of bounds when b != h, a permutation of the heads when
    b == h > 1.

    Models: mixing up the order of the leading axes of a (b, h, s, d) layout
    in the index maps.
    """
    b, h, s, d = q.shape
    t = k.shape[2]

    def swapped(i, j):
        return (j, i, 0, 0)  # BUG: should be (i, j, 0, 0)

    return pl.pallas_call(
        _attention_block_kernel,
        out_shape=jax.ShapeDtypeStruct((b, h, s, d), q.dtype),
        grid=(b, h),
        in_specs=[pl.BlockSpec((None, None, s, d), swapped),
                  pl.BlockSpec((None, None, t, d), swapped),
                  pl.BlockSpec((None, None, t, d), swapped)],
        out_specs=pl.BlockSpec((None, None, s, d), lambda i, j: (i, j, 0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(q, k, v)


def mqa_kv_indexed_by_head(q, k, v):
    """Multi-query attention whose shared k and v are fetched by the head index, not the batch.

    Bug: k's and v's ``index_map`` is ``lambda b, h: (h, 0, 0)``: head j of
    every batch entry attends to batch j's keys and values. Right when
    b == h == 1; wrong batch (or out of bounds) otherwise.

    Models: picking the wrong grid index when an operand lacks the head axis.
    """
    b, h, s, d = q.shape
    t = k.shape[1]
    return pl.pallas_call(
        _attention_block_kernel,
        out_shape=jax.ShapeDtypeStruct((b, h, s, d), q.dtype),
        grid=(b, h),
        in_specs=[pl.BlockSpec((None, None, s, d), lambda i, j: (i, j, 0, 0)),
                  pl.BlockSpec((None, t, d), lambda i, j: (j, 0, 0)),  # BUG: should be (i, 0, 0)
                  pl.BlockSpec((None, t, d), lambda i, j: (j, 0, 0))],
        out_specs=pl.BlockSpec((None, None, s, d), lambda i, j: (i, j, 0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(q, k, v)


# --- copy (DMA) ---------------------------------------------------------------------------


def _copy_read_before_wait_kernel(x_hbm, o_ref, stage, sem):
    inbound = pltpu.make_async_copy(x_hbm, stage, sem)
    inbound.start()
    o_ref[...] = stage[...]  # BUG: reads the staging buffer before the DMA has landed
    inbound.wait()


def _copy_read_before_wait_call(x):
    return pl.pallas_call(
        _copy_read_before_wait_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
    )(x)


def copy_read_before_wait(x):
    """``x`` copied HBM -> VMEM by a DMA whose destination is read before ``.wait()``.

    Bug: ``copy.start(); out[...] = stage[...]; copy.wait()``: the load races
    the DMA. On a TPU the output holds whatever part of the block had arrived;
    in TPU interpret mode (DMAs complete at the wait) it holds the staging
    buffer's uninitialised contents.

    Models: moving a ``.wait()`` down to "overlap" it with compute that in
    fact consumes the DMA's result.
    """
    return _fold_batch_into_rows(_copy_read_before_wait_call)(x)


_COPY_CHUNK_ROWS = 16


def _copy_floor_chunks_kernel(x_hbm, o_hbm, stage, sem, *, block: int, num_chunks: int):
    @pl.loop(0, num_chunks)
    def _chunk(i):
        rows = pl.ds(pl.multiple_of(i * block, block), block)
        inbound = pltpu.make_async_copy(x_hbm.at[rows], stage, sem)
        inbound.start()
        inbound.wait()
        outbound = pltpu.make_async_copy(stage, o_hbm.at[rows], sem)
        outbound.start()
        outbound.wait()
    # BUG: no copy of the last rows % block rows.


def _copy_floor_chunks_call(x):
    rows, cols = x.shape
    block = min(_COPY_CHUNK_ROWS, rows)
    kernel = functools.partial(_copy_floor_chunks_kernel, block=block,
                               num_chunks=rows // block)  # BUG: floor, and no remainder chunk
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM((block, cols), x.dtype), pltpu.SemaphoreType.DMA],
    )(x)


def copy_tail_rows_not_written(x):
    """``x`` copied in DMA chunks of 16 rows, ``rows // 16`` of them: the ragged tail is never
    copied.

    Bug: the chunk loop runs ``rows // 16`` times and there is no smaller
    last DMA, so the last ``rows % 16`` rows of the output (in HBM) are never
    written when rows > 16.

    Models: a hand-written DMA loop sized with floor division.
    """
    return _fold_batch_into_rows(_copy_floor_chunks_call)(x)


# --- ppermute -----------------------------------------------------------------------------


def _peers(axis_name, num_devices: int, shift: int) -> jax.Array:
    """``[(me + shift) mod n, (me - shift) mod n]`` for 0 <= shift < n (lax.rem keeps the sign)."""
    me = lax.axis_index(axis_name)
    return jnp.stack([lax.rem(me + shift, num_devices),
                      lax.rem(me + num_devices - shift, num_devices)]).astype(jnp.int32)


def _ppermute_kernel(peers_smem, x_hbm, o_hbm, send_sem, recv_sem, *, axis_name,
                     wait_recv: bool):
    dst = peers_smem[0]
    src = peers_smem[1]
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis_name: src})
    pl.semaphore_wait(barrier, 1)
    send = pltpu.make_async_remote_copy(x_hbm, o_hbm, send_sem, recv_sem,
                                        device_id={axis_name: dst})
    send.start()
    send.wait_send()
    if wait_recv:
        send.wait_recv()


def _ppermute_call(x, peers, *, axis_name, wait_recv: bool, collective_id: int):
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        functools.partial(_ppermute_kernel, axis_name=axis_name, wait_recv=wait_recv),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, in_specs=[hbm], out_specs=hbm,
            scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA]),
        compiler_params=pltpu.CompilerParams(collective_id=collective_id),
    )(peers, x)


def ppermute_wrong_direction(x, *, axis_name, shift):
    """A remote-DMA ppermute that sends to device ``i - shift`` instead of ``i + shift``.

    Bug: the destination and source peers are swapped (consistently, so the
    handshake still works): device i ends up with the block of device
    ``i + shift``. Indistinguishable from the right answer on 2 devices,
    where +1 and -1 are the same permutation.

    Models: getting the sign convention of ``lax.ppermute``'s pairs wrong.
    """
    n = lax.axis_size(axis_name)
    shift = shift % n
    return _ppermute_call(x, _peers(axis_name, n, n - shift), axis_name=axis_name,  # BUG: -shift
                          wait_recv=True, collective_id=shift)


def ppermute_no_recv_wait(x, *, axis_name, shift):
    """A remote-DMA ppermute whose receiver never waits for the incoming block.

    Bug: the kernel waits on the send semaphore only (``wait_send``) and
    returns before the block sent to it has landed (no ``wait_recv``): its
    output is whatever the buffer held, or a partly written block.

    Models: believing one wait per DMA is enough, when a remote copy has a
    sending side and a receiving side.
    """
    n = lax.axis_size(axis_name)
    shift = shift % n
    return _ppermute_call(x, _peers(axis_name, n, shift), axis_name=axis_name,
                          wait_recv=False, collective_id=shift)


# --- a shipped kernel used outside its domain ----------------------------------------------


def matmul_jax_kernel_undeclared_domain(x, y):
    """JAX's own ``jax.experimental.pallas.ops.tpu.matmul`` with (8, 128) blocks, no ``@supports``.

    Bug: that kernel sizes its grid as ``(m // 8, n // 128, k // 128)``: it
    is right only when the blocks divide the dimensions, and silently drops
    the remainder (or computes nothing) otherwise. Used here on the whole
    contract domain without declaring ``@supports(multiple_of={"m": 8,
    "k": 128, "n": 128})`` (``seeded_bugs.correct.matmul_jax`` declares it).

    Models: adopting a kernel from a library without reading its
    preconditions.
    """
    from jax.experimental.pallas.ops.tpu import matmul as jax_matmul

    return jax_matmul.matmul(x, y, block_shape=(8, 128), block_k=128)
