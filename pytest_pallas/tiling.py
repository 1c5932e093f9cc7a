"""The TPU's block-tiling rule, defined once: strategies, the static check and the kernels.

Mosaic's lowering (``_check_block_mappings`` in ``jax/_src/pallas/mosaic/lowering.py``)
accepts a block of rank >= 2 whose last dimension is a multiple of 128 or the
array's, and whose second-minor dimension is a multiple of 8 or the array's
(the TPU compiler then asks 32 rows of 8-bit and 64 of 4-bit types). A
rank-1 block is the full dimension, a multiple of 1024 (8 x 128), or a power
of two of at least 128 x (32 / bitwidth).

The *native* tile of a dtype packs narrow values into 32-bit sublanes (16
rows of bfloat16, 32 of int8): what XLA's layouts use, so block sizes that
are multiples of it need no relayout. It is a performance choice (the
reference kernels' default blocks), and legal only with ``packed=True``.

    >>> is_legal_block((8, 128), (64, 512), "bfloat16")
    True
    >>> is_legal_block((8, 128), (64, 512), "bfloat16", packed=True)
    False
    >>> native_sublanes("bfloat16"), required_sublanes("bfloat16")
    (16, 8)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .dtypes import as_dtype

LANES = 128
SUBLANES = 8


def bits_of(dtype: Any) -> int | None:
    """Bits per element as Mosaic stores it (booleans as int32); None for extended dtypes."""
    if isinstance(dtype, str):
        try:
            dtype = as_dtype(dtype)
        except ValueError:
            pass
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    if dtype == np.bool_:
        return 32  # Mosaic stores booleans as int32 in memory
    bits = getattr(dtype, "itemsize", 0) * 8
    if dtype.name in ("int4", "uint4", "float4_e2m1fn"):
        bits = 4
    return bits or None


def native_sublanes(dtype: Any, sublanes: int = SUBLANES) -> int:
    """Rows of the dtype's native (packed) tile: 8 for 32-bit, 16 for 16-bit, 32 for 8-bit."""
    bits = bits_of(dtype) or 32
    return sublanes * (32 // bits if bits < 32 else 1)


def required_sublanes(dtype: Any, *, packed: bool = False, sublanes: int = SUBLANES) -> int:
    """The multiple a block's second-minor dimension must be: 8, or the native tile if packed.

    8- and 4-bit blocks always need their native tile (32 or 64 rows): the TPU
    compiler rejects fewer (Mosaic error E2002), though the lowering's own check
    accepts 8. 16-bit blocks need it only when ``packed``.
    """
    narrow = (bits_of(dtype) or 32) < 16
    return native_sublanes(dtype, sublanes) if packed or narrow else sublanes


def minor_ok(size: int, full: int, lanes: int = LANES) -> bool:
    return size == full or size % lanes == 0


def second_minor_ok(size: int, full: int, rows: int) -> bool:
    return size == full or size % rows == 0


def rank1_ok(size: int, full: int, bits: int, *, sublanes: int = SUBLANES,
             lanes: int = LANES) -> bool:
    min_tiling = lanes * (32 // bits if bits < 32 else 1)
    return (size == full or size % (sublanes * lanes) == 0
            or (size >= min_tiling and size & (size - 1) == 0))


def is_legal_block(block_shape: Sequence[int | None], array_shape: Sequence[int], dtype: Any,
                   *, packed: bool = False, sublanes: int = SUBLANES,
                   lanes: int = LANES) -> bool:
    """Whether Mosaic lowers a VMEM block of ``block_shape`` (``None`` counts as 1)."""
    block = [1 if b is None else int(b) for b in block_shape]
    shape = [int(a) for a in array_shape]
    if not block or len(block) != len(shape):
        return False
    if len(block) == 1:
        return rank1_ok(block[0], shape[0], bits_of(dtype) or 32, sublanes=sublanes,
                        lanes=lanes)
    rows = required_sublanes(dtype, packed=packed, sublanes=sublanes)
    return minor_ok(block[-1], shape[-1], lanes) and second_minor_ok(block[-2], shape[-2], rows)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def spread(dim: int, tile: int, cap: int) -> int:
    """The block for a dimension of size ``dim``: the whole dimension up to ``cap``, else the
    fewest blocks of at most ``cap``, each a multiple of ``tile``, spread evenly.

    A block equal to the full dimension is exempt from the tiling rule, and
    spreading keeps the padding under one tile per block (600 rows become two
    304-row blocks, not two 512-row ones).

    >>> spread(600, 8, 512)
    304
    """
    if dim <= cap:
        return dim
    num_blocks = -(-dim // cap)
    return round_up(-(-dim // num_blocks), tile)
