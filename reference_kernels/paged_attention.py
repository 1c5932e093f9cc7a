"""Paged attention for decoding: page tables in SMEM driving double-buffered page DMAs.

Contract op (docs/contract.md section 2, version 0.2):

* ``paged_attention(q, k_pages, v_pages, lengths, page_indices)``: one query
  token per sequence, q ``(b, h, d)``, attends (no scaling) over the first
  ``lengths[i]`` tokens of sequence i. The keys and values of a sequence sit in
  fixed-size pages of ``k_pages`` and ``v_pages`` ``(g, pages, page_size, d)``
  (g kv heads, h a multiple of g); ``page_indices[i, j]`` (int32,
  ``(b, pages_per_sequence)``) is the physical page holding tokens
  ``j * page_size ...`` of sequence i. The output ``(b, h, d)`` has q's dtype.

Beside the kernel: its float64 oracle ``paged_attention_reference``, its cost
model ``paged_attention_cost`` and an input builder ``paged_attention_inputs``
(lengths 1, a page boundary and full capacity; pages shuffled). The error a correct
kernel may carry is attention's error model per sequence
(``pytest_pallas.ops.error_models.paged_attention_model``), which the conformance
suite and ``assert_allclose(out, expected, op="paged_attention", inputs=(q, k_pages,
v_pages, lengths, page_indices))`` both judge by.

The TPU ideas (those of JAX's ``paged_attention``, without its multi-page
blocks):

* **The page table lives in SMEM.** ``lengths`` and ``page_indices`` are
  scalar-prefetched (``pltpu.PrefetchScalarGridSpec``): copied to SMEM, the
  scalar core's memory, before the grid runs, where the kernel reads them as
  scalars to compute DMA addresses. ``page_indices`` is flattened to 1-D first,
  since SMEM pads a 2-D array's rows.
* **Pages are fetched by hand.** Which HBM page holds a token is data, not a
  function of the grid position, so no BlockSpec can describe it: ``k_pages``
  and ``v_pages`` stay in HBM (``pl.ANY``) and the kernel copies each page with
  ``pltpu.make_async_copy(k_pages.at[head, page], buffer, semaphore)``.
* **Double buffering.** Two VMEM buffers per operand: while the MXU works on
  page j in one, page j + 1 is already being copied into the other, and the
  kernel waits on a page's own semaphore only right before using it. A
  sequence of length L touches only ``ceil(L / page_size)`` pages: the rest of
  its table is never read.
* **Grouped heads.** A grid step is one (sequence, kv head): its ``h // g``
  query heads share each page copied, so a page crosses HBM once per kv head.
* Within a step, the pages fold into an online softmax (running max, sum and
  output as loop carries, as in ``flash_attention``); positions past the
  length in the last page are masked to ``-inf``.

The error allowance is ``flash_attention``'s with ``sm_scale=1``, over each
sequence's visible keys, on top of the comparator's default with reduction
length ``pages_per_sequence * page_size``. A stale page (one not re-fetched)
changes whole logits and fails it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ._tiling import output_struct
from .attention import online_softmax_step
from .operand_checks import (
    require_head_groups,
    require_integer_dtypes,
    require_matching,
    require_one_float_dtype,
    require_ranks,
)

__all__ = [
    "paged_attention",
    "paged_attention_cost",
    "paged_attention_inputs",
    "paged_attention_reference",
]


def _check_operands(q: Any, k_pages: Any, v_pages: Any, lengths: Any, page_indices: Any) -> None:
    expects = ("paged_attention expects q (b, h, d), k_pages and v_pages "
               "(g, pages, page_size, d), lengths (b,) and page_indices (b, pages_per_sequence)")
    operands = (q, k_pages, v_pages, lengths, page_indices)
    require_ranks(expects, operands, (3, 4, 4, 1, 2))
    (b, h, d), (g, _, _, dk) = q.shape, k_pages.shape
    require_matching(expects, operands, dims="b, g and d",
                     agree=k_pages.shape == v_pages.shape and dk == d and lengths.shape[0] == b
                     and page_indices.shape[0] == b)
    require_head_groups("paged_attention", h, g)
    require_one_float_dtype("paged_attention", q=q, k_pages=k_pages, v_pages=v_pages)
    require_integer_dtypes("paged_attention", lengths=lengths, page_indices=page_indices)


# --- the oracle, the cost model and the inputs ---------------------------------------------------


def _sequences(q, k_pages, v_pages, lengths, page_indices):
    """Per sequence i: q_i (h, d) and its visible keys and values (h, L_i, d), in float64."""
    q = np.asarray(q).astype(np.float64)
    k_pages = np.asarray(k_pages).astype(np.float64)
    v_pages = np.asarray(v_pages).astype(np.float64)
    h, g = q.shape[1], k_pages.shape[0]
    for i, length in enumerate(np.asarray(lengths).tolist()):
        pages = np.asarray(page_indices)[i]
        # (g, pages_per_sequence, page_size, d) -> (g, capacity, d) -> the first `length`.
        k = k_pages[:, pages].reshape(g, -1, k_pages.shape[-1])[:, :length]
        v = v_pages[:, pages].reshape(g, -1, v_pages.shape[-1])[:, :length]
        yield q[i], np.repeat(k, h // g, axis=0), np.repeat(v, h // g, axis=0)


def paged_attention_reference(q: np.ndarray, k_pages: np.ndarray, v_pages: np.ndarray,
                              lengths: np.ndarray, page_indices: np.ndarray) -> np.ndarray:
    """Each sequence's query over its first ``lengths[i]`` tokens, gathered through its page
    table, in float64 NumPy; no scaling. Query head j reads kv head ``j // (h // g)``.

    >>> pages = np.arange(4.0).reshape(1, 2, 2, 1)  # 2 pages of 2 tokens; page 1 holds 2, 3
    >>> paged_attention_reference(np.zeros((1, 1, 1)), pages, pages, np.array([1]),
    ...                           np.array([[1, 0]]))
    array([[[2.]]])
    """
    out = []
    for qi, k, v in _sequences(q, k_pages, v_pages, lengths, page_indices):
        logits = np.einsum("hd,htd->ht", qi, k)
        weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        out.append(np.einsum("ht,htd->hd", weights, v))
    return np.stack(out)


def paged_attention_cost(q: Any, k_pages: Any, v_pages: Any, lengths: Any,
                         page_indices: Any) -> pl.CostEstimate:
    """Flops and HBM bytes at full capacity (the lengths are data): every sequence's pages
    read once per kv head, the tables, q and the output once."""
    b, h, d = q.shape
    g = k_pages.shape[0]
    capacity = page_indices.shape[1] * k_pages.shape[2]
    itemsize = jnp.dtype(q.dtype).itemsize
    return pl.CostEstimate(
        flops=b * h * capacity * (4 * d + 4),
        transcendentals=b * h * capacity,
        bytes_accessed=itemsize * (2 * b * h * d + 2 * b * g * capacity * d)
        + 4 * (b + b * page_indices.shape[1]),
    )


def paged_attention_inputs(dims: dict[str, int], dtype: str, rng: np.random.Generator
                           ) -> tuple[np.ndarray, ...]:
    """``(q, k_pages, v_pages, lengths, page_indices)`` for dimensions
    ``b, h, g, d, pages, page_size, pages_per_sequence``; floats in ``dtype``.

    The lengths cover 1, one page exactly (a page boundary), one token into the
    next page and the full capacity (``pages_per_sequence * page_size``), in a
    random order over the batch (random lengths beyond four sequences). The
    page indices are a random permutation of the pages when there are enough
    for every slot of every table, so no sequence's pages are in order; else
    drawn at random, shared between sequences.
    """
    b, h, g, d, pages, page_size, per_sequence = (
        int(dims[name]) for name in ("b", "h", "g", "d", "pages", "page_size",
                                     "pages_per_sequence"))
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    capacity = per_sequence * page_size
    special = [1, page_size, page_size + 1, capacity]
    lengths = [special[i] if i < len(special) else int(rng.integers(1, capacity + 1))
               for i in range(b)]
    lengths = np.minimum(rng.permutation(lengths), capacity).astype(np.int32)
    if pages >= b * per_sequence:
        page_indices = rng.permutation(pages)[:b * per_sequence].reshape(b, per_sequence)
    else:
        page_indices = rng.integers(0, pages, size=(b, per_sequence))
    q = rng.standard_normal((b, h, d)).astype(np_dtype)
    k_pages = rng.standard_normal((g, pages, page_size, d)).astype(np_dtype)
    v_pages = rng.standard_normal((g, pages, page_size, d)).astype(np_dtype)
    return q, k_pages, v_pages, lengths, page_indices.astype(np.int32)


# --- the kernel ----------------------------------------------------------------------------------


def _paged_attention_kernel(lengths_smem, pages_smem, q_ref, k_hbm, v_hbm, o_ref, k_buffers,
                            v_buffers, semaphores, *, page_size: int, pages_per_sequence: int):
    sequence, head = pl.program_id(0), pl.program_id(1)
    length = lengths_smem[sequence]
    # Clamped to the table, so a length past the capacity cannot read past it.
    # lax.div and lax.rem, not // and %: equal on non-negative ints, without the sign
    # test of jnp's floor division.
    num_pages = jnp.minimum(lax.div(length + page_size - 1, page_size), pages_per_sequence)

    def page_copies(page, slot):
        physical = pages_smem[sequence * pages_per_sequence + page]
        return (
            pltpu.make_async_copy(k_hbm.at[head, physical], k_buffers.at[slot],
                                  semaphores.at[0, slot]),
            pltpu.make_async_copy(v_hbm.at[head, physical], v_buffers.at[slot],
                                  semaphores.at[1, slot]),
        )

    for copy in page_copies(0, 0):
        copy.start()

    q = q_ref[...]  # (h // g, d)

    def fold_page(page, carry):
        m_prev, l_prev, acc_prev = carry
        slot = lax.rem(page, 2)

        @pl.when(page + 1 < num_pages)
        def _prefetch_next():
            # The other buffer held page - 1, already folded: free to overwrite.
            for copy in page_copies(page + 1, 1 - slot):
                copy.start()

        for copy in page_copies(page, slot):
            copy.wait()
        logits = lax.dot_general(q, k_buffers[slot], (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)
        position = page * page_size + lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        logits = jnp.where(position < length, logits, -jnp.inf)
        return online_softmax_step(m_prev, l_prev, acc_prev, logits, v_buffers[slot])

    heads = q.shape[0]
    initial = (jnp.full((heads, 1), -jnp.inf, jnp.float32), jnp.zeros((heads, 1), jnp.float32),
               jnp.zeros((heads, q.shape[1]), jnp.float32))
    _, l_final, acc_final = lax.fori_loop(0, num_pages, fold_page, initial)
    o_ref[...] = (acc_final / l_final).astype(o_ref.dtype)


@jax.jit
def _paged_attention(q, k_pages, v_pages, lengths, page_indices):
    b, h, d = q.shape
    g, _, page_size, _ = k_pages.shape
    pages_per_sequence = page_indices.shape[1]
    heads_per_group = h // g
    q_grouped = q.reshape(b, g, heads_per_group, d)
    block = pl.BlockSpec((None, None, heads_per_group, d), lambda i, j, *_: (i, j, 0, 0))
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        functools.partial(_paged_attention_kernel, page_size=page_size,
                          pages_per_sequence=pages_per_sequence),
        out_shape=output_struct(q_grouped.shape, q.dtype, q, k_pages, v_pages),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(b, g),
            in_specs=[block, hbm, hbm],
            out_specs=block,
            scratch_shapes=[
                pltpu.VMEM((2, page_size, d), k_pages.dtype),  # k: page j and page j + 1
                pltpu.VMEM((2, page_size, d), v_pages.dtype),  # v: likewise
                pltpu.SemaphoreType.DMA((2, 2)),  # (k or v, buffer)
            ],
        ),
        # Each step's DMAs start and end within the step: steps are independent.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        cost_estimate=paged_attention_cost(q, k_pages, v_pages, lengths, page_indices),
        name="paged_attention",
    )(lengths.astype(jnp.int32), page_indices.astype(jnp.int32).reshape(-1), q_grouped, k_pages,
      v_pages)
    return out.reshape(b, h, d)


def paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, lengths: jax.Array,
                    page_indices: jax.Array) -> jax.Array:
    """Decode attention of q ``(b, h, d)`` over each sequence's first ``lengths[i]`` tokens,
    held in pages ``page_indices[i]`` of k_pages and v_pages ``(g, pages, page_size, d)``.

    No scaling; h a multiple of g; q and the pages all float32 or all bfloat16;
    lengths from 1 to ``pages_per_sequence * page_size`` (a length of 0 has no
    softmax: its output is NaN). Any sizes. Needs TPU interpret mode on the CPU
    (manual DMAs).

    >>> pages = jnp.arange(4.0).reshape(1, 2, 2, 1)
    >>> paged_attention(jnp.zeros((1, 1, 1)), pages, pages, jnp.array([1]),
    ...                 jnp.array([[1, 0]]))[0, 0, 0]  # doctest: +SKIP
    Array(2., dtype=float32)
    """
    _check_operands(q, k_pages, v_pages, lengths, page_indices)
    return _paged_attention(q, k_pages, v_pages, lengths, page_indices)
