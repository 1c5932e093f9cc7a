"""A BlockSpec's index map evaluated at many grid points at once, in NumPy.

The static rules and the grid coverage ask where every block of a kernel lands, at every
point of its grid, while the kernel is being traced. JAX's own evaluation of the index
map's jaxpr dispatches each primitive eagerly (and compiles each for every new number of
points): milliseconds per operand, seconds per run of the suite. Index maps are small
integer programs (``lambda i, j: (i, j // 2)``), which NumPy evaluates over all points in
microseconds with the same integer semantics. An index map using anything else (a scalar
prefetch read, a float, a shape) is left to JAX: ``evaluate`` raises ``NotEvaluated``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class NotEvaluated(Exception):
    """The index map uses something this evaluator does not model; JAX evaluates it."""


def _div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.any(y == 0):
        raise NotEvaluated("division by zero")  # JAX's result for it is its own
    # lax.div on integers rounds towards zero (C's), not down (Python's //).
    quotient = np.abs(x) // np.abs(y)
    return np.where((x < 0) != (y < 0), -quotient, quotient).astype(np.result_type(x, y))


def _rem(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.any(y == 0):
        raise NotEvaluated("remainder by zero")
    return np.fmod(x, y)  # the sign of the dividend, as lax.rem


def _select_n(which: np.ndarray, *cases: np.ndarray) -> np.ndarray:
    return np.choose(np.asarray(which, dtype=np.int64), np.broadcast_arrays(*cases))


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
    "min": np.minimum, "div": _div, "rem": _rem,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "shift_left": np.left_shift, "shift_right_arithmetic": np.right_shift,
}
_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "not": np.invert,
    "copy": np.copy, "copy_p": np.copy,
}
# Primitives that call a jaxpr of their own, held in this parameter.
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr"}


def evaluate(jaxpr: Any, consts: Sequence[Any], args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs of ``jaxpr`` on ``args`` (each an integer array of one value per grid
    point); raises ``NotEvaluated`` for anything but scalar integer and boolean arithmetic."""
    env: dict[Any, np.ndarray] = {}

    def read(atom: Any) -> np.ndarray:
        if type(atom).__name__ == "Literal":
            return np.asarray(atom.val, dtype=_dtype(atom.aval))
        return env[atom]

    for var, value in zip(jaxpr.constvars, consts):
        _dtype(var.aval)
        env[var] = np.asarray(value)
    for var, value in zip(jaxpr.invars, args):
        _dtype(var.aval)
        env[var] = np.asarray(value)
    with np.errstate(over="ignore"):  # integer wrap-around, as in JAX
        for eqn in jaxpr.eqns:
            for var in eqn.outvars:
                _dtype(var.aval)
            outputs = _apply(eqn, [read(atom) for atom in eqn.invars])
            for var, value in zip(eqn.outvars, outputs):
                env[var] = np.asarray(value).astype(_dtype(var.aval), copy=False)
    return [read(atom) for atom in jaxpr.outvars]


def _apply(eqn: Any, values: list[np.ndarray]) -> list[np.ndarray]:
    name = eqn.primitive.name
    if name in _BINARY:
        return [_BINARY[name](*values)]
    if name in _UNARY:
        return [_UNARY[name](*values)]
    if name == "convert_element_type":
        return [values[0].astype(_dtype(eqn.outvars[0].aval))]
    if name == "select_n":
        return [_select_n(*values)]
    if name == "clamp":
        low, x, high = values
        return [np.minimum(np.maximum(x, low), high)]
    if name == "integer_pow":
        return [values[0] ** eqn.params["y"]]
    if name in _CALLS:
        closed = eqn.params[_CALLS[name]]
        inner = getattr(closed, "jaxpr", closed)
        return evaluate(inner, getattr(closed, "consts", ()), values)
    raise NotEvaluated(f"primitive {name}")


def _dtype(aval: Any) -> np.dtype:
    """The dtype of a scalar integer or boolean value; anything else is JAX's to evaluate."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape != () or dtype is None:
        raise NotEvaluated(f"a value of shape {shape}")
    dtype = np.dtype(dtype)
    if dtype.kind not in "iub":
        raise NotEvaluated(f"a value of dtype {dtype}")
    return dtype
