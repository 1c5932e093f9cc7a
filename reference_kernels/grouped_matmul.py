"""Grouped matrix multiplication (mixture of experts) with scalar-prefetched group offsets.

Contract op (docs/contract.md section 2, version 0.2):

* ``grouped_matmul(lhs, rhs, group_sizes)``: the rows of lhs ``(m, k)`` fall in
  consecutive groups of ``group_sizes`` ``(g,)`` int32 rows (summing to m, zeros
  allowed); group i's rows are multiplied by ``rhs[i]`` (``rhs`` is ``(g, k, n)``),
  giving ``(m, n)``, accumulated in float32, in lhs's dtype.

Tunable variant: ``grouped_matmul_blocked(..., block_m=, block_k=, block_n=)``.
Beside the kernel: its float64 oracle ``grouped_matmul_reference``, its cost model
``grouped_matmul_cost`` and an input builder ``grouped_matmul_inputs`` that draws
group sizes with empty groups and with one group holding every row.

The TPU ideas (those of JAX's megablox ``gmm``):

* **The group sizes are data, the grid is static.** Which rhs block a row tile
  needs depends on the values of ``group_sizes``, unknown when the kernel is
  compiled. So the wrapper turns them (in plain jnp, on device) into a
  schedule of *visits*: one per (row tile, group) pair that shares a row, in
  row order. A tile inside one group is visited once; a tile a group boundary
  cuts through is visited once per group it holds; an empty group holds no rows
  and gets no visit. There are at most ``m_tiles + g - 1`` visits, a static
  bound, and that is the grid's middle axis; visits past the real number repeat
  the last one and do nothing.
* **Scalar prefetch drives the index maps.** The schedule (visit -> row tile,
  visit -> group) and the group offsets are passed through
  ``pltpu.PrefetchScalarGridSpec``: they are copied to SMEM before the grid
  runs, and the index maps read them, so visit v's lhs block is row tile
  ``tiles[v]`` and its rhs block is ``rhs[groups[v]]``. The pipeline prefetches
  the next visit's blocks as usual: the data-dependent choice costs no stall.
* **Ragged groups need masking.** A tile cut by a group boundary is multiplied by
  the rhs of each group it holds, and each product is right only for that
  group's rows: the other rows of the product are zeroed (``jnp.where`` on the
  group's row range from the offsets in SMEM) before being added to the float32
  accumulator. The accumulator belongs to the row tile, not the visit: it is
  zeroed at the tile's first visit, and because a tile's visits are consecutive
  grid steps, its output block stays resident in VMEM across them.

The error allowance is the comparator's default for the output dtype with
reduction length k, as for ``matmul``: each output row is one k-term float32
dot product with one group's rhs (the masked products add exact zeros). A
bfloat16 accumulator fails it from k = 512 on, and a group boundary off by one
row gives that row another group's product, an error of the order of the output.
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
    "grouped_matmul",
    "grouped_matmul_blocked",
    "grouped_matmul_cost",
    "grouped_matmul_inputs",
    "grouped_matmul_reference",
]

# Row tiles are smaller than matmul's: a tile cut by a group boundary is
# multiplied once per group it holds, so up to g - 1 extra tiles of work, and
# 128 rows keep that waste small while still filling the MXU. 512-wide k and n
# blocks keep a step's VMEM (double-buffered blocks and the float32
# accumulator) at a few MiB.
DEFAULT_BLOCK_M = 128
DEFAULT_BLOCK_K = 512
DEFAULT_BLOCK_N = 512


# --- operands -----------------------------------------------------------------------------------


def _check_operands(lhs: Any, rhs: Any, group_sizes: Any) -> None:
    if jnp.ndim(lhs) != 2 or jnp.ndim(rhs) != 3 or jnp.ndim(group_sizes) != 1:
        raise ValueError(
            "grouped_matmul expects lhs (m, k), rhs (g, k, n) and group_sizes (g,), got shapes "
            f"{jnp.shape(lhs)}, {jnp.shape(rhs)}, {jnp.shape(group_sizes)}"
        )
    if lhs.shape[1] != rhs.shape[1] or rhs.shape[0] != group_sizes.shape[0]:
        raise ValueError(
            "grouped_matmul expects lhs (m, k), rhs (g, k, n) and group_sizes (g,) with "
            f"matching k and g, got shapes {lhs.shape}, {rhs.shape}, {group_sizes.shape}"
        )
    if lhs.dtype != rhs.dtype or jnp.dtype(lhs.dtype) not in _SUPPORTED_DTYPES:
        raise ValueError(
            "grouped_matmul: lhs and rhs must both be float32 or both bfloat16, got "
            f"{lhs.dtype} and {rhs.dtype}"
        )
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"grouped_matmul: group_sizes must be int32, got {group_sizes.dtype}")


# --- the oracle, the cost model and the inputs ---------------------------------------------------


def grouped_matmul_reference(lhs: np.ndarray, rhs: np.ndarray,
                             group_sizes: np.ndarray) -> np.ndarray:
    """Group i's consecutive rows of lhs times ``rhs[i]``, in float64 NumPy.

    Rows past ``sum(group_sizes)`` (none, when the sizes sum to m) are zero.

    >>> grouped_matmul_reference(np.ones((3, 1)), np.array([[[2.0]], [[5.0]]]), np.array([1, 2]))
    array([[2.],
           [5.],
           [5.]])
    """
    lhs, rhs = np.asarray(lhs).astype(np.float64), np.asarray(rhs).astype(np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for group, size in enumerate(np.asarray(group_sizes).tolist()):
        out[start:start + size] = lhs[start:start + size] @ rhs[group]
        start += size
    return out


def grouped_matmul_cost(lhs: Any, rhs: Any, group_sizes: Any) -> pl.CostEstimate:
    """Flops and HBM bytes: each row of lhs times its group's (k, n) rhs; every operand read once.

    The sizes are data, so every group's rhs is counted as read (an empty
    group's is not, by the kernel).
    """
    m, k = lhs.shape
    g, _, n = rhs.shape
    itemsize = jnp.dtype(lhs.dtype).itemsize
    return pl.CostEstimate(
        flops=2 * m * k * n,
        transcendentals=0,
        bytes_accessed=itemsize * (m * k + g * k * n + m * n) + 4 * g,
    )


def _group_sizes(m: int, g: int, rng: np.random.Generator) -> np.ndarray:
    """Sizes summing to m: one group holding every row, or ragged sizes with empty groups."""
    if g == 1 or rng.random() < 0.5:
        sizes = np.zeros(g, np.int64)
        sizes[rng.integers(g)] = m
        return sizes.astype(np.int32)
    # About half the groups empty (at least one); the rest cut m at random rows.
    empty = rng.random(g) < 0.5
    empty[rng.integers(g)] = True
    filled = np.flatnonzero(~empty)
    if filled.size == 0:
        filled = np.array([rng.integers(g)])
    cuts = np.sort(rng.integers(0, m + 1, size=filled.size - 1))
    sizes = np.zeros(g, np.int64)
    sizes[filled] = np.diff(np.concatenate([[0], cuts, [m]]))
    return sizes.astype(np.int32)


def grouped_matmul_inputs(dims: dict[str, int], dtype: str,
                          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lhs, rhs, group_sizes)`` for dimensions ``m, k, n, g`` in ``dtype``.

    Half the draws put every row in one group (the others empty), half cut the
    rows at random among about half of the groups (the rest empty), so a tile
    may hold several groups and a group may start mid-tile. Values are
    standard normal; group_sizes is int32 and sums to m.
    """
    m, k, n, g = (int(dims[name]) for name in ("m", "k", "n", "g"))
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    lhs = rng.standard_normal((m, k)).astype(np_dtype)
    rhs = rng.standard_normal((g, k, n)).astype(np_dtype)
    return lhs, rhs, _group_sizes(m, g, rng)


# --- the schedule ---------------------------------------------------------------------------------


def _schedule(group_sizes: jax.Array, *, block_m: int, num_tiles: int):
    """The visits, as int32 arrays for SMEM: group offsets, and per visit its tile, group,
    whether it is the tile's first visit and whether it is real (not padding).

    Computed with jnp on device: the sizes are data. Visits are in group order,
    which is row order, so a tile's visits are consecutive.
    """
    g = group_sizes.shape[0]
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    starts = ends - sizes
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])
    first_tile = starts // block_m
    visits_per_group = jnp.where(sizes > 0, (ends - 1) // block_m - first_tile + 1, 0)
    visit_ends = jnp.cumsum(visits_per_group)
    num_real = visit_ends[-1]
    num_visits = num_tiles + g - 1
    visit = jnp.arange(num_visits, dtype=jnp.int32)
    # Padding visits repeat the last real one: same blocks, so no new copies.
    real = jnp.minimum(visit, jnp.maximum(num_real - 1, 0))
    group = jnp.searchsorted(visit_ends, real, side="right").astype(jnp.int32)
    group = jnp.minimum(group, g - 1)
    tile = first_tile[group] + real - (visit_ends[group] - visits_per_group[group])
    tile = jnp.clip(tile, 0, num_tiles - 1).astype(jnp.int32)
    previous_tile = jnp.concatenate([jnp.full((1,), -1, jnp.int32), tile[:-1]])
    is_real = visit < num_real
    first_visit = (tile != previous_tile) & is_real
    return (offsets, tile, group, first_visit.astype(jnp.int32), is_real.astype(jnp.int32))


# --- the kernel ----------------------------------------------------------------------------------


def _grouped_matmul_kernel(offsets, tiles, groups, first_visit, is_real, lhs_ref, rhs_ref, o_ref,
                           acc_ref, *, block_m: int, num_k_blocks: int):
    visit, k_block = pl.program_id(1), pl.program_id(2)

    @pl.when((k_block == 0) & (first_visit[visit] == 1))
    def _zero_the_tile():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(is_real[visit] == 1)
    def _accumulate():
        group = groups[visit]
        row = tiles[visit] * block_m + jax.lax.broadcasted_iota(jnp.int32, (block_m, 1), 0)
        in_group = (row >= offsets[group]) & (row < offsets[group + 1])
        product = jnp.dot(lhs_ref[...], rhs_ref[...], preferred_element_type=jnp.float32)
        # Masking the product, not lhs: rows of other groups must add exactly 0
        # even where this group's rhs holds an inf (0 * inf would be NaN).
        acc_ref[...] += jnp.where(in_group, product, 0.0)

    @pl.when(k_block == num_k_blocks - 1)
    def _write():
        # Every visit of the tile writes; the last one's value is what reaches HBM.
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_m", "block_k", "block_n"))
def _grouped_matmul(lhs, rhs, group_sizes, *, block_m: int, block_k: int, block_n: int):
    m, k = lhs.shape
    g, _, n = rhs.shape
    m_pad, k_pad, n_pad = round_up(m, block_m), round_up(k, block_k), round_up(n, block_n)
    lhs = pad_to(lhs, (m_pad, k_pad))
    rhs = pad_to(rhs, (g, k_pad, n_pad))
    num_tiles, num_k = m_pad // block_m, k_pad // block_k
    schedule = _schedule(group_sizes, block_m=block_m, num_tiles=num_tiles)
    grid = (n_pad // block_n, num_tiles + g - 1, num_k)

    def lhs_index(j, visit, kk, offsets, tiles, groups, first, real):
        return tiles[visit], kk

    def rhs_index(j, visit, kk, offsets, tiles, groups, first, real):
        return groups[visit], kk, j

    def out_index(j, visit, kk, offsets, tiles, groups, first, real):
        return tiles[visit], j

    out = pl.pallas_call(
        functools.partial(_grouped_matmul_kernel, block_m=block_m, num_k_blocks=num_k),
        out_shape=output_struct((m_pad, n_pad), lhs.dtype, lhs, rhs, group_sizes),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(schedule),
            grid=grid,
            in_specs=[pl.BlockSpec((block_m, block_k), lhs_index),
                      pl.BlockSpec((None, block_k, block_n), rhs_index)],
            out_specs=pl.BlockSpec((block_m, block_n), out_index),
            scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],
        ),
        # Column blocks are independent; consecutive visits share an output
        # block and k is the reduction, so both are "arbitrary".
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        cost_estimate=grouped_matmul_cost(lhs, rhs, group_sizes),
        name="grouped_matmul",
    )(*schedule, lhs, rhs)
    return out[:m, :n]


def grouped_matmul_blocked(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                           block_m: int | None = None, block_k: int | None = None,
                           block_n: int | None = None) -> jax.Array:
    """``grouped_matmul`` with chosen blocks.

    ``block_m`` must be a multiple of the sublane tiling (8 for float32, 16 for
    bfloat16) or equal m; ``block_k`` and ``block_n`` multiples of 128 or equal
    k and n. ``None`` picks a default (at most 128, 512 and 512).

    >>> lhs = jnp.ones((40, 8)); rhs = jnp.ones((3, 8, 16))
    >>> grouped_matmul_blocked(lhs, rhs, jnp.array([8, 0, 32], jnp.int32), block_m=16).shape
    (40, 16)
    """
    _check_operands(lhs, rhs, group_sizes)
    m, k = lhs.shape
    n = rhs.shape[2]
    sublanes = native_sublanes(lhs.dtype)
    name = jnp.dtype(lhs.dtype).name
    block_m = resolve_block("block_m", block_m, "m", m, sublanes,
                            f"TPU sublane tiling of {name}, the second-minor dimension of "
                            "lhs's block",
                            cap=DEFAULT_BLOCK_M)
    block_k = resolve_block("block_k", block_k, "k", k, LANES,
                            "TPU lane tiling, the minor dimension of lhs's block",
                            cap=DEFAULT_BLOCK_K)
    block_n = resolve_block("block_n", block_n, "n", n, LANES,
                            "TPU lane tiling, the minor dimension of rhs's and the output's block",
                            cap=DEFAULT_BLOCK_N)
    return _grouped_matmul(lhs, rhs, jnp.asarray(group_sizes, jnp.int32), block_m=block_m,
                           block_k=block_k, block_n=block_n)


@supports(blocks={"block_m": "m", "block_k": "k", "block_n": "n"})
def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                   block_m: int | None = None, block_k: int | None = None,
                   block_n: int | None = None) -> jax.Array:
    """Rows of lhs ``(m, k)`` in consecutive groups of ``group_sizes`` times ``rhs[group]``.

    rhs is ``(g, k, n)``, group_sizes ``(g,)`` int32 summing to m (zeros
    allowed); lhs and rhs both float32 or both bfloat16. Accumulated in
    float32; the output ``(m, n)`` has lhs's dtype. Rows past the sum of the
    sizes (a precondition violated) are zero when they share a row tile with
    the last group, else unspecified.

    >>> grouped_matmul(jnp.ones((3, 1)), jnp.array([[[2.0]], [[5.0]]]),
    ...                jnp.array([1, 2], jnp.int32))[:, 0]
    Array([2., 5., 5.], dtype=float32)
    """
    return grouped_matmul_blocked(lhs, rhs, group_sizes, block_m=block_m, block_k=block_k,
                                  block_n=block_n)
