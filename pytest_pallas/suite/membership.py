"""Which tests are conformance tests: the packaged suite's directory, the attribute that binds
a ``conformance_tests`` class to its op and implementation, and the op a test checks.

Read by the plugin for every collected test, so it imports neither JAX nor the suite's
other modules.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

# The attribute of a ``conformance_tests`` class that holds its op and implementation.
CLASS_ATTRIBUTE = "__pallas_conformance__"


def _conformance_directory() -> str:
    # The packaged suite: site-packages/pytest_pallas/conformance, or the checkout's
    # conformance/ in an editable install (found without importing it).
    spec = importlib.util.find_spec("pytest_pallas.conformance")
    if spec is not None and spec.submodule_search_locations:
        return os.path.abspath(list(spec.submodule_search_locations)[0])
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(package, "conformance")


CONFORMANCE_DIRECTORY = _conformance_directory()


def class_binding(cls: type | None) -> Any:
    """The implementation a ``conformance_tests`` class checks, or None for another class."""
    return getattr(cls, CLASS_ATTRIBUTE, None) if cls is not None else None


def is_packaged_conformance_item(item: Any) -> bool:
    """A test of the packaged suite (``pytest --pallas-conformance``)."""
    return os.path.dirname(str(item.path)) == CONFORMANCE_DIRECTORY


def is_conformance_item(item: Any) -> bool:
    """A test of the packaged suite or of a ``conformance_tests`` class."""
    return (is_packaged_conformance_item(item)
            or class_binding(getattr(item, "cls", None)) is not None)


def conformance_op_name(item: Any) -> str | None:
    """The name of the op a conformance test checks (None for another test)."""
    binding = class_binding(getattr(item, "cls", None))
    if binding is not None:
        return binding.op_name
    callspec = getattr(item, "callspec", None)
    op = callspec.params.get("op") if callspec is not None else None
    return getattr(op, "name", op)  # a packaged test is parametrized by the op's record
