"""Block-size and operand helpers shared by the reference kernels, on the one tiling rule of
``pytest_pallas.tiling`` (the rule the static check and the strategies apply).

The kernels choose their default blocks in whole native tiles
(``native_sublanes``: 16 rows of bfloat16, which XLA's layouts pack into
8 sublanes) and ask the same of a block size the caller gives: legal blocks
of 8 bfloat16 rows exist (Mosaic lowers them), but a reference kernel
documents the efficient choice.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytest_pallas.tiling import LANES, native_sublanes, round_up, spread

__all__ = ["LANES", "check_block", "native_sublanes", "output_struct", "pad_to",
           "resolve_block", "resolve_matmul_blocks", "resolve_row_col_blocks", "round_up",
           "spread"]


def check_block(name: str, block: Any, dim_name: str, dim: int, multiple: int, why: str, *,
                clip: bool = False) -> int:
    """Validate a caller's block size: a positive int, a multiple of ``multiple`` (``why``) or
    the full dimension. With ``clip``, a block at least as large as ``dim`` becomes ``dim``."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block <= 0:
        raise ValueError(f"{name} must be a positive int, got {block!r}")
    block = int(block)
    if clip and block >= dim:
        return dim
    if block % multiple and block != dim:
        whole = "cover" if clip else "equal"
        raise ValueError(
            f"{name}={block} must be a multiple of {multiple} ({why}) "
            f"or {whole} the full dimension {dim_name}={dim}"
        )
    return block


def resolve_block(name: str, block: Any, dim_name: str, dim: int, multiple: int, why: str, *,
                  cap: int) -> int:
    """A caller's block for a dimension, validated (:func:`check_block`), or, given None, the
    default: the whole dimension up to ``cap``, else blocks of whole ``multiple``s
    (:func:`spread`)."""
    if block is None:
        return spread(dim, multiple, cap)
    return check_block(name, block, dim_name, dim, multiple, why)


def resolve_matmul_blocks(m: int, k: int, n: int, dtype: Any, block_m: Any, block_k: Any,
                          block_n: Any, *, caps: tuple[int, int, int], lhs: str = "x's",
                          rhs: str = "y's", k_note: str = "") -> tuple[int, int, int]:
    """The ``(block_m, block_k, block_n)`` of an ``(m, k) @ (k, n)`` kernel, each resolved by
    :func:`resolve_block` (``caps``: the largest defaults).

    block_m is the second-minor dimension of the lhs block (whole sublane tiles
    of ``dtype``), block_k its minor one and block_n the minor one of the rhs and
    output blocks (whole 128-lane tiles). ``lhs`` and ``rhs`` name those blocks'
    owners in the errors; ``k_note`` adds to block_k's reason.
    """
    cap_m, cap_k, cap_n = caps
    block_m = resolve_block("block_m", block_m, "m", m, native_sublanes(dtype),
                            f"TPU sublane tiling of {jnp.dtype(dtype).name}, the second-minor "
                            f"dimension of {lhs} block", cap=cap_m)
    block_k = resolve_block("block_k", block_k, "k", k, LANES,
                            f"TPU lane tiling, the minor dimension of {lhs} block{k_note}",
                            cap=cap_k)
    block_n = resolve_block("block_n", block_n, "n", n, LANES,
                            f"TPU lane tiling, the minor dimension of {rhs} and the output's block",
                            cap=cap_n)
    return block_m, block_k, block_n


def resolve_row_col_blocks(rows: int, cols: int, dtype: Any, block_rows: Any, block_cols: Any,
                           *, caps: tuple[int, int], names: tuple[str, str] = ("rows", "cols")
                           ) -> tuple[int, int]:
    """The ``(block_rows, block_cols)`` of a kernel tiling a ``(rows, cols)`` array (``names``:
    the dimensions' names in the errors).

    ``None`` spreads the dimension over the fewest blocks of whole tiles (sublane
    tiles of ``dtype`` for the rows, 128 lanes for the columns) up to ``caps``;
    a given block is validated by :func:`check_block` and clipped to its
    dimension (a block at least as large covers it in one).
    """
    (cap_rows, cap_cols), (rows_name, cols_name) = caps, names
    sublanes = native_sublanes(dtype)
    if block_rows is None:
        block_rows = spread(rows, sublanes, cap_rows)
    else:
        block_rows = check_block("block_rows", block_rows, rows_name, rows, sublanes,
                                 f"TPU sublane tiling of {jnp.dtype(dtype).name}, the "
                                 "second-minor dimension of the block", clip=True)
    if block_cols is None:
        block_cols = spread(cols, LANES, cap_cols)
    else:
        block_cols = check_block("block_cols", block_cols, cols_name, cols, LANES,
                                 "TPU lane tiling, the minor dimension of the block", clip=True)
    return block_rows, block_cols


def pad_to(array: Any, shape: tuple[int, ...]) -> Any:
    """``array`` zero-padded at the end of each axis to ``shape`` (whole blocks)."""
    if array.shape == shape:
        return array
    return jnp.pad(array, [(0, target - size) for size, target in zip(array.shape, shape)])


def output_struct(shape: tuple[int, ...], dtype: Any, *operands: Any) -> Any:
    """The ``out_shape`` of a kernel whose output varies over mesh axes as its operands do.

    Inside ``jax.shard_map(check_vma=True)`` a kernel must say how its output
    varies across the mesh axes: as its operands do, together. Outside
    shard_map this is the empty set and is ignored.
    """
    varying = frozenset().union(*(jax.typeof(x).manual_axis_type.varying for x in operands))
    return jax.ShapeDtypeStruct(
        shape, dtype, manual_axis_type=jax.sharding.ManualAxisType(varying=varying)
    )
