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

import numpy as np

from .builtins import BUILT_IN
from .error_models import COMPARATOR_MODELS
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


def op_error_model(op: Any, inputs: Sequence[Any], *, matmul_precision: str = "float32",
                   params: dict[str, Any] | None = None) -> Any:
    """The error model (``ops.error_models.ErrorModel``) ``assert_allclose(op=...)`` judges
    by: the one the conformance suite judges ``op`` (a name or an ``Operation``) by, on
    ``inputs`` (its arguments) and ``params`` (its keyword arguments, and the size of a
    dimension the inputs' shapes do not say, such as a collective's ``devices``); for an op
    no record describes, the comparator's own (``COMPARATOR_MODELS``).

    An op name no record or model has is a usage error (``ValueError`` naming the known
    ones). A reduction over a dimension the call does not give is sized by the caller's
    ``reduction_length``.
    """
    if isinstance(op, str) and op not in OPERATIONS and op in COMPARATOR_MODELS:
        return COMPARATOR_MODELS[op](inputs, matmul_precision=matmul_precision, params=params)
    if not isinstance(op, Operation):
        if op not in OPERATIONS:
            raise ValueError(f"op={op!r}: no such op; the known ones are "
                             f"{', '.join((*op_names(), *COMPARATOR_MODELS))} "
                             "(or pass atol= yourself)")
        op = OPERATIONS[op]
    params = dict(params or {})
    case = SimpleNamespace(args=tuple(inputs),
                           kwargs={k: v for k, v in params.items() if k not in op.dimensions},
                           dims=op.dimensions_of(inputs, params),
                           dtype=(np.dtype(getattr(inputs[0], "dtype", np.float32)).name
                                  if len(inputs) else "float32"))
    return op.error_model(case, matmul_precision)


def op_allowance(op: Any, inputs: Sequence[Any], *, matmul_precision: str = "float32",
                 params: dict[str, Any] | None = None) -> tuple[float, str]:
    """The extra atol of ``op`` on ``inputs``, and why (``op_error_model``'s): 0 for an op
    with no error model of its own."""
    model = op_error_model(op, inputs, matmul_precision=matmul_precision, params=params)
    return model.atol, model.why
