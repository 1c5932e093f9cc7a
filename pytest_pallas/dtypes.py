"""Dtypes by name: ``as_dtype("bfloat16")`` and the machine epsilon of the floating ones.

The bottom of the package: the comparator, the strategies, the tiling rules
and the error models all name dtypes as strings, and none of them may import
another to do so.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "int32": np.dtype(np.int32),
    "int8": np.dtype(np.int8),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}

# Machine epsilon (spacing at 1.0) of the floating dtypes the comparator knows.
EPSILON = {
    "float64": 2.0**-52,
    "float32": 2.0**-23,
    "float16": 2.0**-10,
    "bfloat16": 2.0**-7,
    "float8_e4m3fn": 2.0**-3,
    "float8_e4m3b11fnuz": 2.0**-3,
    "float8_e4m3fnuz": 2.0**-3,
    "float8_e5m2": 2.0**-2,
    "float8_e5m2fnuz": 2.0**-2,
}


def _ml_dtypes() -> dict:
    return {name: np.dtype(getattr(ml_dtypes, name)) for name in EPSILON
            if hasattr(ml_dtypes, name)}


ML_DTYPES = _ml_dtypes()


def as_dtype(name: str | Any) -> np.dtype:
    """``"bfloat16"`` -> the NumPy dtype (ml_dtypes for bfloat16 and float8); NumPy's own
    names (``"float64"``, a test's reference inputs) are NumPy's dtypes."""
    if isinstance(name, str):
        if name in _DTYPES:
            return _DTYPES[name]
        try:
            return np.dtype(name)
        except TypeError:
            raise ValueError(f"unknown dtype {name!r}; known: {', '.join(_DTYPES)}") from None
    return np.dtype(name)


def epsilon(dtype: Any) -> float:
    """Machine epsilon of a floating dtype, by name (bfloat16 and float8 included)."""
    name = np.dtype(dtype).name
    if name not in EPSILON:
        raise ValueError(f"no epsilon known for dtype {name}; pass rtol= and atol= explicitly")
    return EPSILON[name]


# The precisions a backend's float32 dot can run at under JAX's default precision: a TPU
# rounds the operands to bfloat16 (one MXU pass), a GPU's tensor cores to TensorFloat-32
# (10 explicit mantissa bits, NVIDIA's A100/H100 architecture documents), the CPU keeps float32.
MATMUL_PRECISIONS = ("float32", "tensorfloat32", "bfloat16")
_TENSORFLOAT32_EPSILON = 2.0 ** -10


def matmul_epsilon(precision: str) -> float:
    """The epsilon of a dot's operands at a backend's matmul precision (``MATMUL_PRECISIONS``).

        >>> matmul_epsilon("tensorfloat32") == 2 ** -10
        True
    """
    if precision == "tensorfloat32":
        return _TENSORFLOAT32_EPSILON
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul precision {precision!r} must be one of "
                         f"{', '.join(MATMUL_PRECISIONS)}")
    return epsilon(precision)


def dot_rounding(precision: str, operands: str) -> str:
    """The precision a dot of ``operands`` (a dtype's name) rounds its products in on a
    backend whose float32 dot runs at ``precision`` (``MATMUL_PRECISIONS``): the one table
    every error model reads (the comparator's accumulation term, the attention ops').

    bfloat16 (or float16) operands multiply exactly into float32 sums; only float32 operands
    lose more, to bfloat16 on a TPU and to TensorFloat-32 on a GPU.

        >>> dot_rounding("bfloat16", "float32"), dot_rounding("bfloat16", "bfloat16")
        ('bfloat16', 'float32')
    """
    return precision if operands == "float32" and precision in MATMUL_PRECISIONS else "float32"
