"""The registry of the run's ops: the built-in ``Operation``s and those a conftest adds.

The plugin validates ``--pallas-impl`` and ``--pallas-ops`` against it at
start-up; importing it is cheap (no JAX). A user's op joins through the
``pytest_pallas_operations`` hook (see ``hookspecs``), registered at
configure time and dropped when the run ends.
"""

from __future__ import annotations

from .operation import Operation, OperationError
from .operations import BUILT_IN

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
