"""``--pallas-impl OP=MODULE:ATTR`` and ``--pallas-ops``: parse, then resolve to callables.

Parsing is pure string work done at configure time so that every mistake is
a usage error before collection. Resolution imports the user's module the
way ``python -m`` would (the current directory first on sys.path).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

import pytest


def _unknown_op(op_name: str, flag: str) -> pytest.UsageError:
    from ..ops import registry as _ops

    return pytest.UsageError(
        f"{flag}: unknown op {op_name!r}; the conformance ops are {', '.join(_ops.op_names())} "
        "(an op of your own joins them through the pytest_pallas_operations hook)."
    )


def parse_impl_flags(values: list[str]) -> tuple[tuple[str, str], ...]:
    """``["matmul=my.kernels:matmul"]`` -> ``(("matmul", "my.kernels:matmul"),)``, validated."""
    if not values:
        return ()  # the registry is imported only when a flag names an op
    from ..ops import registry as _ops

    parsed: dict[str, str] = {}
    for value in values:
        op_name, sep, target = value.partition("=")
        op_name, target = op_name.strip(), target.strip()
        module, colon, attribute = target.partition(":")
        if not sep or not op_name or not colon or not module or not attribute:
            raise pytest.UsageError(
                f"--pallas-impl {value!r} is malformed; write OP=MODULE:ATTR, "
                "e.g. --pallas-impl matmul=my_kernels:matmul."
            )
        if op_name not in _ops.OPERATIONS:
            raise _unknown_op(op_name, f"--pallas-impl {value!r}")
        if op_name in parsed:
            raise pytest.UsageError(
                f"--pallas-impl gives {op_name!r} twice ({parsed[op_name]} and {target}); "
                "give each op once."
            )
        parsed[op_name] = target
    return tuple(parsed.items())


def parse_ops_flag(value: str | None) -> tuple[str, ...]:
    """``"add,matmul"`` -> ``("add", "matmul")``, validated."""
    if value is None:
        return ()
    from ..ops import registry as _ops

    ops = tuple(op_name.strip() for op_name in value.split(",") if op_name.strip())
    if not ops:
        raise pytest.UsageError("--pallas-ops is empty; give e.g. --pallas-ops=add,matmul.")
    for op_name in ops:
        if op_name not in _ops.OPERATIONS:
            raise _unknown_op(op_name, f"--pallas-ops={value}")
    return ops


def check_ops_have_implementations(ops: tuple[str, ...], impls: tuple[tuple[str, str], ...],
                                   ops_value: str | None) -> None:
    """With ``--pallas-impl``, only its ops run: ``--pallas-ops`` naming another is a conflict.

    ``--pallas-ops`` may pick some of the ``--pallas-impl`` ops (to run one of a set).
    """
    impl_ops = [op_name for op_name, _ in impls]
    missing = [op_name for op_name in ops if op_name not in impl_ops]
    if impl_ops and missing:
        impl_flags = " ".join(f"--pallas-impl {op_name}={target}" for op_name, target in impls)
        raise pytest.UsageError(
            f"--pallas-ops={ops_value} conflicts with {impl_flags}: with --pallas-impl only "
            f"its ops run ({', '.join(impl_ops)}), so {', '.join(missing)} would not; "
            f"drop {', '.join(missing)} from --pallas-ops, or give "
            f"--pallas-impl {missing[0]}=MODULE:ATTR.")


def resolve_all(impls: tuple[tuple[str, str], ...]) -> dict[str, Callable]:
    """Every ``--pallas-impl`` target imported, by op; the first mistake is a UsageError."""
    return {op_name: resolve(target, flag=f"--pallas-impl {op_name}={target}")
            for op_name, target in impls}


def resolve(target: str, *, flag: str) -> Callable:
    """Import ``MODULE:ATTR`` and return the callable, or raise a one-line UsageError."""
    module_name, _, attribute = target.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        # As `python -m` does: the user's kernels usually live beside their tests.
        sys.path.insert(0, cwd)
    from ..ops.domains import SupportsError

    try:
        module = importlib.import_module(module_name)
    except SupportsError as error:
        raise pytest.UsageError(f"{flag}: {error}")
    except Exception as error:  # any error while importing user code is a usage problem
        import traceback

        last = traceback.format_exception_only(type(error), error)[-1].strip()
        raise pytest.UsageError(f"{flag}: cannot import module {module_name!r}: {last}")
    obj = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise pytest.UsageError(
                f"{flag}: module {module_name!r} has no attribute {attribute!r}."
            )
    if not callable(obj):
        raise pytest.UsageError(
            f"{flag}: {target} is a {type(obj).__name__}, not a callable; point it at the "
            "function that computes the op."
        )
    return obj
