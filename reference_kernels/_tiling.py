"""Block-size helpers shared by the reference kernels, on the one tiling rule of
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

__all__ = ["LANES", "check_block", "native_sublanes", "round_up", "spread"]


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
