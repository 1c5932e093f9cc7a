"""Pallas TPU kernels of the version 0.2 ops, each with one seeded bug.

Every function has the contract signature of its op (docs/contract.md section 2,
"Operations added in version 0.2") and is a plausible kernel that runs and
returns the right shape and dtype; its docstring says what is wrong and which
real mistake it models. ``tests/reference_kernels/test_<module>.py`` shows that
each one fails against the float64 oracle with the op's derived error
allowance, on inputs where the reference kernel passes: the allowance is tight
enough to catch it.

Blocks are TPU-legal (a minor dimension a multiple of 128 or the full
dimension, the second-minor a multiple of the sublane tiling or the full
dimension), so each bug is one of the algorithm.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_LANES = 128


def _pad_axis(array: jax.Array, axis: int, size: int) -> jax.Array:
    if array.shape[axis] == size:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, size - array.shape[axis])
    return jnp.pad(array, widths)


# --- flash_attention ------------------------------------------------------------------------


def _attention_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, causal, sm_scale,
                      block_kv, kv_len, num_kv, acc_dtype, diagonal, block_local):
    kv = pl.program_id(2)

    @pl.when(kv == 0)
    def _initialise():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    logits = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32) * sm_scale
    local_column = lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    column = kv * block_kv + local_column
    visible = column < kv_len
    if causal:
        row = lax.broadcasted_iota(jnp.int32, logits.shape, 0)
        visible &= (local_column if block_local else column) <= row + diagonal
    logits = jnp.where(visible, logits, -jnp.inf)
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, logits.max(axis=1, keepdims=True))
    correction = jnp.exp(m_prev - m_new)
    p = jnp.exp(logits - m_new)
    l_ref[...] = correction * l_ref[...] + p.sum(axis=1, keepdims=True)
    update = jnp.dot(p, v_ref[...].astype(jnp.float32), preferred_element_type=jnp.float32)
    acc_ref[...] = (correction * acc_ref[...].astype(jnp.float32) + update).astype(acc_dtype)
    m_ref[...] = m_new

    @pl.when(kv == num_kv - 1)
    def _write_back():
        o_ref[...] = (acc_ref[...].astype(jnp.float32) / l_ref[...]).astype(o_ref.dtype)


def _attention_variant(q, k, v, *, causal, sm_scale, acc_dtype=jnp.float32, diagonal=0,
                       block_local=False):
    """Flash attention with the whole of s in one q block and 128-key kv blocks."""
    b, h, s, d = q.shape
    g, t = k.shape[1], k.shape[2]
    block_kv = t if t <= _LANES else _LANES
    t_pad = -(-t // block_kv) * block_kv
    k, v = _pad_axis(k, 2, t_pad), _pad_axis(v, 2, t_pad)
    ratio = h // g
    kernel = functools.partial(
        _attention_kernel, causal=causal, sm_scale=sm_scale, block_kv=block_kv, kv_len=t,
        num_kv=t_pad // block_kv, acc_dtype=acc_dtype, diagonal=diagonal,
        block_local=block_local)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(b, h, t_pad // block_kv),
        in_specs=[pl.BlockSpec((None, None, s, d), lambda i, j, kv: (i, j, 0, 0)),
                  pl.BlockSpec((None, None, block_kv, d), lambda i, j, kv: (i, j // ratio, kv, 0)),
                  pl.BlockSpec((None, None, block_kv, d), lambda i, j, kv: (i, j // ratio, kv, 0))],
        out_specs=pl.BlockSpec((None, None, s, d), lambda i, j, kv: (i, j, 0, 0)),
        scratch_shapes=[pltpu.VMEM((s, 1), jnp.float32), pltpu.VMEM((s, 1), jnp.float32),
                        pltpu.VMEM((s, d), acc_dtype)],
    )(q, k, v)


def flash_attention_bfloat16_accumulator(q, k, v, *, causal, sm_scale):
    """Flash attention whose unnormalised output ``acc`` lives in a bfloat16 VMEM scratch.

    Bug: ``acc`` is rounded to bfloat16 (8 bits of mantissa) after every kv block.

    Models: halving the scratch's VMEM "since the inputs are bfloat16 anyway".
    """
    return _attention_variant(q, k, v, causal=causal, sm_scale=sm_scale, acc_dtype=jnp.bfloat16)


def flash_attention_unscaled(q, k, v, *, causal, sm_scale):
    """Flash attention that never applies ``sm_scale``.

    Bug: the logits are ``q @ k.T``, not ``sm_scale * q @ k.T``; right only for ``sm_scale=1``.

    Models: a kernel written against the unscaled ``attention`` op and reused.
    """
    del sm_scale
    return _attention_variant(q, k, v, causal=causal, sm_scale=1.0)


def flash_attention_mask_off_by_one(q, k, v, *, causal, sm_scale):
    """Causal attention whose mask lets query i see key i + 1.

    Bug: the mask keeps ``j <= i + 1`` (an off-by-one at the diagonal).

    Models: ``j < i + 1`` written as ``j <= i + 1``.
    """
    return _attention_variant(q, k, v, causal=causal, sm_scale=sm_scale, diagonal=1)


def flash_attention_mask_block_local(q, k, v, *, causal, sm_scale):
    """Causal attention whose mask compares a key's index within its kv block to the query's.

    Bug: the mask uses the block-local column ``iota`` without adding ``kv * block_kv``: right
    in the first kv block, wrong in every later one.

    Models: a mask written and tested with one kv block, then run with several.
    """
    return _attention_variant(q, k, v, causal=causal, sm_scale=sm_scale, block_local=True)


# --- rms_norm -----------------------------------------------------------------------------------


def _rms_norm_chunked_kernel(x_ref, w_ref, o_ref, *, eps, acc_dtype):
    cols = x_ref.shape[1]
    total = jnp.zeros((x_ref.shape[0], 1), acc_dtype)
    for start in range(0, cols, _LANES):
        chunk = x_ref[:, start:start + _LANES].astype(jnp.float32)
        total = (total.astype(jnp.float32) + jnp.sum(chunk * chunk, axis=1, keepdims=True)
                 ).astype(acc_dtype)
    x = x_ref[...].astype(jnp.float32)
    inverse = lax.rsqrt(total.astype(jnp.float32) / cols + eps)
    o_ref[...] = (x * inverse * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def rms_norm_bfloat16_accumulator(x, w, *, eps):
    """RMS norm whose sum of squares is accumulated 128 lanes at a time in bfloat16.

    Bug: the running sum of squares is rounded to bfloat16 after every 128-lane chunk.

    Models: a lane-chunked reduction whose carry takes the input dtype.
    """
    rows, cols = x.shape
    return pl.pallas_call(
        functools.partial(_rms_norm_chunked_kernel, eps=eps, acc_dtype=jnp.bfloat16),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(1,),
        in_specs=[pl.BlockSpec((rows, cols), lambda i: (0, 0)),
                  pl.BlockSpec((1, cols), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((rows, cols), lambda i: (0, 0)),
    )(x, w.reshape(1, cols))


# --- grouped_matmul -----------------------------------------------------------------------------


def _grouped_kernel(offsets, tiles, groups, first_visit, is_real, lhs_ref, rhs_ref, o_ref,
                    acc_ref, *, block_m, end_slack):
    visit = pl.program_id(1)

    @pl.when(first_visit[visit] == 1)
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(is_real[visit] == 1)
    def _accumulate():
        group = groups[visit]
        row = tiles[visit] * block_m + lax.broadcasted_iota(jnp.int32, (block_m, 1), 0)
        in_group = (row >= offsets[group]) & (row < offsets[group + 1] + end_slack)
        product = jnp.dot(lhs_ref[...], rhs_ref[...], preferred_element_type=jnp.float32)
        acc_ref[...] = (acc_ref[...].astype(jnp.float32)
                        + jnp.where(in_group, product, 0.0)).astype(acc_ref.dtype)

    o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _grouped_variant(lhs, rhs, group_sizes, *, acc_dtype=jnp.float32, end_slack=0):
    """Whole k and n per block, 8- or 16-row tiles, the reference kernel's visit schedule."""
    from pytest_pallas.reference_kernels.grouped_matmul import _schedule

    m, k = lhs.shape
    g, _, n = rhs.shape
    block_m = 8 * (4 // lhs.dtype.itemsize)
    m_pad = -(-m // block_m) * block_m
    lhs = _pad_axis(lhs, 0, m_pad)
    num_tiles = m_pad // block_m
    schedule = _schedule(group_sizes, block_m=block_m, num_tiles=num_tiles)
    out = pl.pallas_call(
        functools.partial(_grouped_kernel, block_m=block_m, end_slack=end_slack),
        out_shape=jax.ShapeDtypeStruct((m_pad, n), lhs.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5, grid=(1, num_tiles + g - 1),
            in_specs=[pl.BlockSpec((block_m, k), lambda j, v, o, t, gr, f, r: (t[v], 0)),
                      pl.BlockSpec((None, k, n), lambda j, v, o, t, gr, f, r: (gr[v], 0, 0))],
            out_specs=pl.BlockSpec((block_m, n), lambda j, v, o, t, gr, f, r: (t[v], 0)),
            scratch_shapes=[pltpu.VMEM((block_m, n), acc_dtype)]),
    )(*schedule, lhs, rhs)
    return out[:m]


def grouped_matmul_bfloat16_accumulator(lhs, rhs, group_sizes):
    """Grouped matmul whose per-tile accumulator is a bfloat16 scratch.

    Bug: every product is rounded to bfloat16 when added to the accumulator.

    Models: an accumulator declared in the input dtype.
    """
    return _grouped_variant(lhs, rhs, group_sizes, acc_dtype=jnp.bfloat16)


def grouped_matmul_group_end_off_by_one(lhs, rhs, group_sizes):
    """Grouped matmul whose row mask lets each group take one row past its end.

    Bug: the mask is ``offsets[i] <= row <= offsets[i + 1]``: the first row of the
    next group, when it shares the tile, also gets this group's product added.

    Models: an inclusive end where the offsets are exclusive.
    """
    return _grouped_variant(lhs, rhs, group_sizes, end_slack=1)


# --- quantized_matmul ---------------------------------------------------------------------------


def _quantized_kernel(x_ref, w_ref, scale_ref, o_ref, acc_ref, *, num_k, acc_dtype, unsigned):
    kk = pl.program_id(0)

    @pl.when(kk == 0)
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    w = w_ref[...]
    if unsigned:
        w = w.astype(jnp.uint8)
    product = jnp.dot(x_ref[...], w.astype(x_ref.dtype), preferred_element_type=jnp.float32)
    acc_ref[...] = (acc_ref[...].astype(jnp.float32) + product).astype(acc_dtype)

    @pl.when(kk == num_k - 1)
    def _write():
        o_ref[...] = (acc_ref[...].astype(jnp.float32) * scale_ref[...]).astype(o_ref.dtype)


def _quantized_variant(x, w, scale, *, acc_dtype=jnp.float32, unsigned=False):
    """Whole m and n per block, 128-deep k blocks."""
    m, k = x.shape
    n = w.shape[1]
    block_k = k if k <= _LANES else _LANES
    k_pad = -(-k // block_k) * block_k
    x, w = _pad_axis(x, 1, k_pad), _pad_axis(w, 0, k_pad)
    return pl.pallas_call(
        functools.partial(_quantized_kernel, num_k=k_pad // block_k, acc_dtype=acc_dtype,
                          unsigned=unsigned),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(k_pad // block_k,),
        in_specs=[pl.BlockSpec((m, block_k), lambda kk: (0, kk)),
                  pl.BlockSpec((block_k, n), lambda kk: (kk, 0)),
                  pl.BlockSpec((1, n), lambda kk: (0, 0))],
        out_specs=pl.BlockSpec((m, n), lambda kk: (0, 0)),
        scratch_shapes=[pltpu.VMEM((m, n), acc_dtype)],
    )(x, w, scale.reshape(1, n))


def quantized_matmul_bfloat16_accumulator(x, w, scale):
    """Weight-only int8 matmul accumulating the k blocks in a bfloat16 scratch.

    Bug: the running ``x @ w`` is rounded to bfloat16 after every 128-deep k block.

    Models: an accumulator declared in the dtype of the dequantised weights.
    """
    return _quantized_variant(x, w, scale, acc_dtype=jnp.bfloat16)


def quantized_matmul_int8_read_as_uint8(x, w, scale):
    """Weight-only int8 matmul that reads the weights as unsigned.

    Bug: w goes through uint8 before the float conversion, so every negative weight
    becomes itself + 256. Right for weights in [0, 127] only.

    Models: a dequantisation written for uint8 (asymmetric) quantisation, reused.
    """
    return _quantized_variant(x, w, scale, unsigned=True)


# --- paged_attention ----------------------------------------------------------------------------


def _paged_kernel(lengths_smem, pages_smem, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems, *,
                  page_size, per_sequence, fetch_partial_page, use_table):
    sequence, head = pl.program_id(0), pl.program_id(1)
    length = lengths_smem[sequence]
    num_pages = jnp.minimum((length + page_size - 1) // page_size, per_sequence)
    num_fetched = num_pages if fetch_partial_page else length // page_size

    def copies(page, slot):
        logical = sequence * per_sequence + page
        physical = pages_smem[logical] if use_table else logical
        return (pltpu.make_async_copy(k_hbm.at[head, physical], k_buf.at[slot], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm.at[head, physical], v_buf.at[slot], sems.at[1, slot]))

    @pl.when(num_fetched > 0)
    def _first():
        for copy in copies(0, 0):
            copy.start()

    q = q_ref[...]

    def fold(page, carry):
        m_prev, l_prev, acc_prev = carry
        slot = page % 2

        @pl.when(page + 1 < num_fetched)
        def _prefetch():
            for copy in copies(page + 1, 1 - slot):
                copy.start()

        @pl.when(page < num_fetched)
        def _wait():
            for copy in copies(page, slot):
                copy.wait()

        logits = lax.dot_general(q, k_buf[slot], (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)
        position = page * page_size + lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        logits = jnp.where(position < length, logits, -jnp.inf)
        m_new = jnp.maximum(m_prev, logits.max(axis=1, keepdims=True))
        correction = jnp.exp(m_prev - m_new)
        p = jnp.exp(logits - m_new)
        acc = correction * acc_prev + jnp.dot(p, v_buf[slot].astype(jnp.float32),
                                              preferred_element_type=jnp.float32)
        return m_new, correction * l_prev + p.sum(axis=1, keepdims=True), acc

    heads, d = q.shape
    init = (jnp.full((heads, 1), -jnp.inf, jnp.float32), jnp.zeros((heads, 1), jnp.float32),
            jnp.zeros((heads, d), jnp.float32))
    _, l_final, acc_final = lax.fori_loop(0, num_pages, fold, init)
    o_ref[...] = (acc_final / l_final).astype(o_ref.dtype)


def _paged_variant(q, k_pages, v_pages, lengths, page_indices, *, fetch_partial_page=True,
                   use_table=True):
    b, h, d = q.shape
    g, _, page_size, _ = k_pages.shape
    per_sequence = page_indices.shape[1]
    q4 = q.reshape(b, g, h // g, d)
    block = pl.BlockSpec((None, None, h // g, d), lambda i, j, *_: (i, j, 0, 0))
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        functools.partial(_paged_kernel, page_size=page_size, per_sequence=per_sequence,
                          fetch_partial_page=fetch_partial_page, use_table=use_table),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(b, g), in_specs=[block, hbm, hbm], out_specs=block,
            scratch_shapes=[pltpu.VMEM((2, page_size, d), k_pages.dtype),
                            pltpu.VMEM((2, page_size, d), v_pages.dtype),
                            pltpu.SemaphoreType.DMA((2, 2))]),
    )(lengths.astype(jnp.int32), page_indices.astype(jnp.int32).reshape(-1), q4, k_pages, v_pages)
    return out.reshape(b, h, d)


def paged_attention_stale_last_page(q, k_pages, v_pages, lengths, page_indices):
    """Paged attention that never fetches a sequence's last, partly filled page.

    Bug: pages are fetched for ``length // page_size`` (the full pages), but folded for
    ``ceil(length / page_size)``; the partial last page is read from a buffer still holding
    the page fetched two steps before (a stale page), or never written.

    Models: a floor where a ceiling belongs, hidden when lengths are page multiples.
    """
    return _paged_variant(q, k_pages, v_pages, lengths, page_indices, fetch_partial_page=False)


def paged_attention_ignores_page_table(q, k_pages, v_pages, lengths, page_indices):
    """Paged attention that reads sequence i's page j from physical page
    ``i * pages_per_sequence + j``.

    Bug: the page table is never consulted; right only when pages are laid out in order.

    Models: a kernel tested on a freshly filled cache, whose pages happen to be in order.
    """
    return _paged_variant(q, k_pages, v_pages, lengths, page_indices, use_table=False)


# --- reduce_scatter -------------------------------------------------------------------------------


def _ring_reduce_kernel(peers_smem, x_hbm, o_ref, own, stage, received, local_sem, send_sem,
                        recv_sems, *, axis_name, n, block_shift):
    rows = own.shape[0]
    right, left = peers_smem[0], peers_smem[1]
    me = lax.rem(right + n - 1, n)

    def load(block):
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(block * rows, rows)], own, local_sem)
        copy.start()
        copy.wait()
        return own[...].astype(stage.dtype)

    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis_name: left})
    pl.semaphore_wait(barrier, 1)
    stage[...] = load(lax.rem(me + n - 1 + block_shift, n))
    for step in range(n - 1):
        send = pltpu.make_async_remote_copy(stage, received.at[step], send_sem, recv_sems.at[step],
                                            device_id={axis_name: right})
        send.start()
        send.wait_send()
        send.wait_recv()
        total = received[step] + load(lax.rem(me + 2 * n - 2 - step + block_shift, n))
        if step < n - 2:
            stage[...] = total
        else:
            o_ref[...] = total.astype(o_ref.dtype)


def _ring_reduce_variant(x, *, axis_name, wire_dtype=None, block_shift=0):
    from pytest_pallas.reference_kernels.collectives import _peer_indices, _varying_out_shape

    n = lax.axis_size(axis_name)
    if n == 1:
        return x
    block = (x.shape[0] // n, *x.shape[1:])
    wire = wire_dtype or (jnp.float32 if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype)
    return pl.pallas_call(
        functools.partial(_ring_reduce_kernel, axis_name=axis_name, n=n, block_shift=block_shift),
        out_shape=_varying_out_shape(x, axis_name, block),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            scratch_shapes=[pltpu.VMEM(block, x.dtype), pltpu.VMEM(block, wire),
                            pltpu.VMEM((n - 1, *block), wire), pltpu.SemaphoreType.DMA,
                            pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA((n - 1,))]),
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(_peer_indices(axis_name, n, 1), x)


def reduce_scatter_bfloat16_partial_sums(x, *, axis_name):
    """Ring reduce-scatter sending its partial sums as bfloat16.

    Bug: every hop rounds the running sum to bfloat16, whatever x's dtype.

    Models: halving the ICI bytes of a float32 reduction "since gradients are noisy anyway".
    """
    return _ring_reduce_variant(x, axis_name=axis_name, wire_dtype=jnp.bfloat16)


def reduce_scatter_keeps_the_next_block(x, *, axis_name):
    """Ring reduce-scatter whose device i ends with block i + 1 of the sum.

    Bug: the ring's block index is off by one (``i - s`` where ``i - 1 - s`` belongs); the
    sums are right, on the wrong devices.

    Models: an off-by-one in ring bookkeeping, invisible on a test that checks only the
    total over devices.
    """
    return _ring_reduce_variant(x, axis_name=axis_name, block_shift=1)


# --- all_gather -----------------------------------------------------------------------------------


def _gather_one_semaphore_kernel(peers_smem, x_hbm, o_hbm, local_sem, send_sem, recv_sem, *,
                                 axis_name, n):
    right, left = peers_smem[0], peers_smem[1]
    me = lax.rem(right + n - 1, n)
    local = pltpu.make_async_copy(x_hbm, o_hbm.at[me], local_sem)
    local.start()
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis_name: left})
    pl.semaphore_wait(barrier, 1)
    local.wait()
    for step in range(n - 1):
        slot = lax.rem(me + n - step, n)
        forward = pltpu.make_async_remote_copy(o_hbm.at[slot], o_hbm.at[slot], send_sem, recv_sem,
                                               device_id={axis_name: right})
        forward.start()
        forward.wait_send()
        forward.wait_recv()


def all_gather_one_receive_semaphore(x, *, axis_name):
    """Ring all-gather whose n - 1 steps share one receive semaphore.

    Bug: the left neighbour does not wait for us, so step k + 1's block can arrive (and
    signal the shared semaphore) while step k's is still in flight; the wait of step k then
    counts the wrong block as arrived and forwards a slot not yet written.

    Models: JAX's own ``jax.experimental.pallas.ops.tpu.all_gather`` (one receive semaphore
    across ring steps).
    """
    from pytest_pallas.reference_kernels.collectives import _peer_indices, _varying_out_shape

    n = lax.axis_size(axis_name)
    if n == 1:
        return x
    slots = pl.pallas_call(
        functools.partial(_gather_one_semaphore_kernel, axis_name=axis_name, n=n),
        out_shape=_varying_out_shape(x, axis_name, (n, *x.shape)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA] * 3),
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(_peer_indices(axis_name, n, 1), x)
    return slots.reshape(-1, *x.shape[1:])
