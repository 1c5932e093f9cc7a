"""The registry of the run's ops: the built-in ``Operation``s and those a conftest adds.

The plugin validates ``--pallas-impl`` and ``--pallas-ops`` against it at
start-up; importing it is cheap (no JAX). A user's op joins through the
``pytest_pallas_operations`` hook (see ``hookspecs``), registered at
configure time and dropped when the run ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from .builtins import BUILT_IN
from .operation import Operation, OperationError

OPERATIONS: dict[str, Operation] = {op.name: op for op in BUILT_IN}

# The built-in names, in the contract's order; ``op_names()`` adds the registered ones.
OP_NAMES: tuple[str, ...] = tuple(OPERATIONS)


def op_names() -> tuple[str, ...]:
    """Every op the run knows: the built-ins, then the ones registered from conftests."""
    return tuple(OPERATIONS)


def get_operation(name: str) -> Operation:
    try:
        return OPERATIONS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; the conformance ops are {', '.join(OPERATIONS)}")


def register(operation: Operation) -> None:
    """Add a user's op to the registry; a second op of the same name is an error."""
    if not isinstance(operation, Operation):
        raise OperationError(
            f"pytest_pallas_operations returned {operation!r}, a {type(operation).__name__}; "
            "return pytest_pallas.Operation records.")
    existing = OPERATIONS.get(operation.name)
    if existing is not None and existing is not operation:
        raise OperationError(
            f"two ops are named {operation.name!r}"
            f"{' (a built-in op)' if operation.name in OP_NAMES else ''}; give yours another "
            "name.")
    OPERATIONS[operation.name] = operation


def unregister_all() -> None:
    """Back to the built-ins (the end of a run; in-process pytest runs share this module)."""
    for name in list(OPERATIONS):
        if name not in OP_NAMES:
            del OPERATIONS[name]


def op_allowance(op: Any, inputs: Sequence[Any], *, matmul_precision: str = "float32",
                 params: dict[str, Any] | None = None) -> tuple[float, str]:
    """The extra atol of ``op`` (a name or an ``Operation``) on ``inputs``, from its record.

    0 for an op with no error model of its own. An op name no record has is a
    usage error (``ValueError`` naming the known ones).
    """
    import numpy as np

    if not isinstance(op, Operation):
        if op not in OPERATIONS:
            raise ValueError(f"op={op!r}: no such op; the known ones are "
                             f"{', '.join(op_names())} (or pass atol= yourself)")
        op = OPERATIONS[op]
    case = SimpleNamespace(args=tuple(inputs), kwargs=dict(params or {}),
                           dtype=(np.dtype(getattr(inputs[0], "dtype", np.float32)).name
                                  if len(inputs) else "float32"))
    return op.extra_allowance(case, matmul_precision)
