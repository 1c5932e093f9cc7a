"""The operand checks the reference kernels run at their entry, worded once.

Each kernel keeps its own ``_check_operands``, which states what it requires
(the expected shapes, the dimensions that must match, the dtypes) as a few
calls to these helpers; the helpers raise the one-line ``ValueError`` a user
sees, so that the same requirement reads the same in every kernel. (JAX's
megablox keeps its operand checks in one module the same way.)

Operands are arrays or anything with ``.shape`` and ``.dtype``; the checks run
in the order a kernel calls them, so a shape error is reported before a dtype
error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

__all__ = [
    "FLOAT_DTYPES",
    "require_dtype",
    "require_float_dtypes",
    "require_head_groups",
    "require_integer_dtypes",
    "require_matching",
    "require_one_float_dtype",
    "require_ranks",
]

# The dtypes of the kernels' data operands: the two the contract draws for them.
FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def _shapes(operands: Sequence[Any], join: str) -> str:
    return join.join(str(jnp.shape(operand)) for operand in operands)


def _prefix(op_name: str) -> str:
    return f"{op_name}: " if op_name else ""


def _names(names: Sequence[str]) -> str:
    """``x``, ``x and y``, ``q, k and v``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def require_ranks(expects: str, operands: Sequence[Any], ranks: Sequence[int], *,
                  join: str = ", ") -> None:
    """Each operand has its rank in ``ranks``, else ``ValueError("{expects}, got shapes ...")``.

    ``expects`` says what the kernel takes, e.g. ``"rms_norm expects x (rows, cols)
    and w (cols,)"``; the shapes are listed after it, joined by ``join``.
    """
    if any(jnp.ndim(operand) != rank for operand, rank in zip(operands, ranks)):
        raise ValueError(f"{expects}, got shapes {_shapes(operands, join)}")


def require_matching(expects: str, operands: Sequence[Any], agree: bool, *,
                     dims: str | None = None) -> None:
    """The operands' shapes agree (``agree``, the kernel's own test), else a ``ValueError``:
    ``"{expects} with matching {dims}, got shapes ..."``, or without ``dims``, the message
    of :func:`require_ranks`. Call it after ``require_ranks``, which makes the test safe."""
    if not agree:
        matching = f" with matching {dims}" if dims else ""
        raise ValueError(f"{expects}{matching}, got shapes {_shapes(operands, ', ')}")


def require_head_groups(op_name: str, h: int, g: int, *, hint: str = "") -> None:
    """The ``h`` query heads fall in ``g`` equal groups, one per kv head, else a ``ValueError``."""
    if h % g:
        raise ValueError(f"{op_name}: the number of query heads h={h} must be a multiple of the "
                         f"number of kv heads g={g}{hint}")


def require_one_float_dtype(op_name: str, /, **operands: Any) -> None:
    """The operands (by name) are all float32 or all bfloat16, else a ``ValueError`` naming
    them, after ``"{op_name}: "`` when ``op_name`` is given."""
    names, dtypes = list(operands), [operand.dtype for operand in operands.values()]
    if any(dtype != dtypes[0] for dtype in dtypes[1:]) or jnp.dtype(dtypes[0]) not in FLOAT_DTYPES:
        each = "both" if len(names) == 2 else "all"
        got = " and " if len(names) == 2 else ", "
        raise ValueError(f"{_prefix(op_name)}{_names(names)} must {each} be float32 or {each} "
                         f"bfloat16, got {got.join(map(str, dtypes))}")


def require_float_dtypes(op_name: str, /, **operands: Any) -> None:
    """Each operand (by name) is float32 or bfloat16, not necessarily the same one."""
    dtypes = [operand.dtype for operand in operands.values()]
    if any(jnp.dtype(dtype) not in FLOAT_DTYPES for dtype in dtypes):
        raise ValueError(f"{_prefix(op_name)}{_names(list(operands))} must be float32 or bfloat16, "
                         f"got {' and '.join(map(str, dtypes))}")


def require_dtype(op_name: str, name: str, operand: Any, dtype: Any) -> None:
    """``operand`` has exactly ``dtype``, else
    ``ValueError("{op_name}: {name} must be {dtype}")``."""
    if jnp.dtype(operand.dtype) != jnp.dtype(dtype):
        raise ValueError(f"{_prefix(op_name)}{name} must be {jnp.dtype(dtype).name}, "
                         f"got {operand.dtype}")


def require_integer_dtypes(op_name: str, /, **operands: Any) -> None:
    """Each operand (by name) holds integers: sizes, lengths or indices, which the contract
    gives as int32 (the error asks for that; any integer dtype passes)."""
    for name, operand in operands.items():
        if not jnp.issubdtype(operand.dtype, jnp.integer):
            raise ValueError(f"{_prefix(op_name)}{name} must be int32, got {operand.dtype}")
