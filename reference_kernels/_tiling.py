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

from pytest_pallas.tiling import LANES, native_sublanes, round_up, spread

__all__ = ["LANES", "check_block", "native_sublanes", "output_struct", "pad_to",
           "resolve_block", "round_up", "spread"]


def check_block(name: str, block: Any, dim_name: str, dim: int, multiple: int, why: str, *,
                clip: bool = False) -> int:
    """Validate a caller's block size: a positive int, a multiple of ``multiple`` (``why``) or
    the full dimension. With ``clip``, a block at least as large as ``dim`` becomes ``dim``."""
    import numpy as np

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


def pad_to(array: Any, shape: tuple[int, ...]) -> Any:
    """``array`` zero-padded at the end of each axis to ``shape`` (whole blocks)."""
    import jax.numpy as jnp

    if array.shape == shape:
        return array
    return jnp.pad(array, [(0, target - size) for size, target in zip(array.shape, shape)])


def output_struct(shape: tuple[int, ...], dtype: Any, *operands: Any) -> Any:
    """The ``out_shape`` of a kernel whose output varies over mesh axes as its operands do.

    Inside ``jax.shard_map(check_vma=True)`` a kernel must say how its output
    varies across the mesh axes: as its operands do, together. Outside
    shard_map this is the empty set and is ignored.
    """
    import jax

    varying = frozenset().union(*(jax.typeof(x).manual_axis_type.varying for x in operands))
    return jax.ShapeDtypeStruct(
        shape, dtype, manual_axis_type=jax.sharding.ManualAxisType(varying=varying)
    )
