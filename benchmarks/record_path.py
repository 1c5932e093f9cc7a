"""Follows one op through the conformance suite at run time and prints its path.

The op enters at a door, ``conformance_tests(op, fn)`` in a test module (or, with
``--packaged``, ``--pallas-conformance --pallas-ops=OP``), and the script records every call
into the package that receives it: the ``Operation`` record, the op's name, or an object
that holds either as an attribute (an implementation, a case, the harness). It prints the
modules of one example's path in the order the op reaches them, then per example: the
modules, the moves between modules, the moves back into a module the op had already left,
and how often the op was looked up by its name in the registry and a report row registered.

    python benchmarks/record_path.py [--op add] [--examples 2] [--packaged]

Nothing is timed; the counts are the same on any machine for the same code and seed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import textwrap

import pytest

import pytest_pallas

PACKAGE = os.path.dirname(os.path.abspath(pytest_pallas.__file__))
# The installed subpackages that live at the repository's top level in an editable install.
ROOTS = (PACKAGE, *(os.path.dirname(os.path.abspath(__import__(name, fromlist=["_"]).__file__))
                    for name in ("pytest_pallas.conformance", "pytest_pallas.reference_kernels")))


def _module(filename: str) -> str | None:
    for root in ROOTS:
        if filename.startswith(root + os.sep):
            prefix = "" if root == PACKAGE else os.path.basename(root) + "/"
            return prefix + os.path.relpath(filename, root)
    return None


class Follower:
    """A pytest plugin that follows the op through every call of the run."""

    def __init__(self, operation) -> None:
        self.operation = operation
        self.stays: list[tuple[int, str]] = []  # (example, module) of each call receiving
        # the op, consecutive calls in one module collapsed; example 0 is before the first
        self.lookups = 0  # registry lookups of an op by name
        self.registrations = 0  # report rows registered
        self.examples = 0

    def _carries(self, value) -> bool:
        if value is self.operation or (isinstance(value, str) and value == self.operation.name):
            return True
        fields = getattr(value, "__dict__", None)
        if not isinstance(fields, dict):
            return False
        return any(field is self.operation
                   or (isinstance(field, str) and field == self.operation.name)
                   for field in list(fields.values()))

    def profile(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        module = _module(code.co_filename)
        if module is None:
            return
        name = code.co_name
        if name == "get_operation":
            self.lookups += 1
        elif name == "register" and module.endswith("report.py"):
            self.registrations += 1
        elif name == "draw" and module.endswith("harness.py"):
            self.examples += 1
            self.stays.append((self.examples, module))
            return
        count = code.co_argcount + code.co_kwonlyargcount
        arguments = [frame.f_locals.get(variable) for variable in code.co_varnames[:count]]
        if any(self._carries(value) for value in arguments):
            if not self.stays or self.stays[-1][1] != module:
                self.stays.append((self.examples, module))

    def _profiled(self):
        """The body of a hook wrapper: the profile follows the record while the hook runs."""
        sys.setprofile(self.profile)
        try:
            return (yield)
        finally:
            sys.setprofile(None)

    @pytest.hookimpl(wrapper=True)
    def pytest_collection(self, session):
        return (yield from self._profiled())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):  # the fixtures: the harness is made here
        return (yield from self._profiled())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        return (yield from self._profiled())


def _moves(path: list[str]) -> tuple[int, int]:
    """Moves between modules along ``path``, and those back into a module already left."""
    left: set[str] = set()
    back = 0
    for before, after in zip(path, path[1:]):
        left.add(before)
        back += after in left
    return len(path) - 1, back


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="add", help="a built-in op with a reference kernel")
    parser.add_argument("--examples", type=int, default=2,
                        help="drawn examples of the value property (after its sweep)")
    parser.add_argument("--packaged", action="store_true",
                        help="the packaged suite's door (--pallas-conformance) instead")
    options = parser.parse_args()
    operation = getattr(pytest_pallas.operations, options.op)
    follower = Follower(operation)
    common = ["-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-k", "test_value",
              "--pallas-seed=0", "-W", "ignore"]
    with tempfile.TemporaryDirectory() as directory:
        if options.packaged:
            arguments = ["--pallas-conformance", f"--pallas-ops={options.op}",
                         f"--pallas-examples={options.examples}"]
        else:
            module = pathlib.Path(directory) / "test_record_path.py"
            module.write_text(textwrap.dedent(f"""
                from pytest_pallas import conformance_tests, operations

                Test = conformance_tests(operations.{options.op},
                                         operations.{options.op}.load_reference(),
                                         examples={options.examples})
                """))
            arguments = [str(module)]
        code = pytest.main(arguments + common, plugins=[follower])
    door = "--pallas-conformance" if options.packaged else "conformance_tests(op, fn)"
    first = [module for example, module in follower.stays if example == 1]
    print(f"\n{options.op}, from {door}: the first example's path")
    print("  " + " -> ".join(first))
    examples = max(follower.examples, 1)
    paths = [[module for example, module in follower.stays if example == index]
             for index in range(1, examples + 1)]
    moves = [_moves(path) for path in paths]
    print(f"per example ({follower.examples} examples): "
          f"modules {max(len(set(path)) for path in paths)}, "
          f"moves {max(m for m, _ in moves)}, "
          f"moves back into a module already left {max(b for _, b in moves)} (the most of any "
          f"example)")
    print(f"in all: registry lookups by name {follower.lookups}, "
          f"report rows registered {follower.registrations}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
