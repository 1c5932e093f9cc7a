"""One implementation of an op as the suite checks it: the op's record and the callable,
bound at the door (the plugin's start-up, ``conformance_tests``).

Light on purpose: pytest-xdist's controller binds the implementations of a run (a mistake
in ``--pallas-impl`` is a usage error before any worker starts) and runs no test, so this
imports neither JAX nor Hypothesis.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from ..ops.domains import Domain, declared_domain
from ..ops.operation import Operation


@dataclasses.dataclass(frozen=True, eq=False)
class Implementation:
    """One implementation of an op, as the suite checks it: the ``Operation`` record itself
    travels with it from the door (the plugin's start-up, ``conformance_tests``) down to the
    verdict and the report, so nothing below the door looks an op up by its name.

    ``given`` is the user's callable; None means the op's reference kernel, imported on first
    use, so that a run that checks one op never imports the other reference kernels.
    """

    operation: Operation
    label: str
    is_reference: bool = False
    given: Callable | None = None

    @property
    def op_name(self) -> str:
        return self.operation.name

    @functools.cached_property
    def function(self) -> Callable:
        return self.given if self.given is not None else self.operation.load_reference()

    @functools.cached_property
    def domain(self) -> Domain:
        return declared_domain(self.function)


def reference_implementation(operation: Operation) -> Implementation:
    """The op's reference kernel as an implementation (imported when a test first calls it)."""
    target = operation.reference
    where = target if isinstance(target, str) else (
        f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', target)}")
    return Implementation(operation, f"reference ({where})", is_reference=True)


def bind_function(operation: Operation, function: Callable, label: str | None = None
                  ) -> Implementation:
    """An implementation given as a function, its ``@supports`` checked against the op."""
    implementation = Implementation(
        operation, label or (f"{getattr(function, '__module__', '?')}:"
                             f"{getattr(function, '__qualname__', function)}"),
        given=function)
    implementation.domain.validate_for(operation.name, operation.dimensions, operation.dtypes)
    return implementation
