"""The door of the packaged suite: which ops it runs, and each op's record bound to the
implementation it checks (``--pallas-impl``'s callable, else the op's reference kernel).

The op names of the flags become ``Operation`` records here, once, at configure time; from here
the records travel with their implementations to the verdicts and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def selected_ops(user_ops: tuple[str, ...], impl_ops: tuple[str, ...]) -> tuple[str, ...]:
    """The ops the packaged suite runs: those of --pallas-impl (and --pallas-ops), else every
    op with a reference kernel (or those --pallas-ops names)."""
    from ..ops import registry as _ops

    names = _ops.op_names()
    if impl_ops:
        ops = impl_ops if not user_ops else tuple(name for name in impl_ops if name in user_ops)
    else:
        ops = user_ops or tuple(name for name in names
                                if _ops.OPERATIONS[name].reference is not None)
    return tuple(name for name in names if name in ops)


def bind_implementations(user_targets: dict[str, str], user_callables: dict[str, Callable],
                         selected: tuple[str, ...]) -> dict[str, Any]:
    """Every selected op's record bound to its implementation (a
    ``suite.implementation.Implementation``): the user's callable, or the op's reference kernel.

    References are imported on first use, so that a run that checks one user op never
    imports the other kernels.
    """
    from ..ops import registry as _ops
    from ..ops.domains import SupportsError
    from ..suite.implementation import bind_function, reference_implementation

    bound: dict[str, Any] = {}
    for op_name in selected:
        operation = _ops.OPERATIONS[op_name]
        if op_name in user_targets:
            target = user_targets[op_name]
            try:
                bound[op_name] = bind_function(operation, user_callables[op_name], target)
            except SupportsError as error:
                raise pytest.UsageError(f"--pallas-impl {op_name}={target}: {error}")
        elif operation.reference is None:
            raise pytest.UsageError(
                f"op {op_name!r} has no reference kernel to check; give --pallas-impl "
                f"{op_name}=MODULE:ATTR."
            )
        else:
            bound[op_name] = reference_implementation(operation)
    return bound
