"""Runs the contract's properties for one op: draws a case, calls the implementation,
judges, records.

The conformance test modules are thin: each property test draws with
``st.data()`` (the domain depends on the implementation chosen on the
command line, so it cannot be fixed at import time) and hands over to the
methods here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import note, target
from hypothesis import strategies as st

from .._compat import jax_internals, pallas_call_hooks
from ..backend import Backend
from ..checks import kernel_model
from ..checks.kernel_check import run_on_poisoned_and_zeroed_memory, uninitialized_read_violation
from ..compare import bitwise_differences, without_uninitialized_read_hint
from ..ops import inputs as op_inputs
from ..ops.domains import Domain, SupportsError, declared_domain
from ..ops.operation import Operation
from ..ops.registry import get_operation, op_names
from . import grid_coverage, properties
from .report import ConformanceRecorder


@dataclasses.dataclass(frozen=True)
class Implementation:
    op: str
    function: Callable
    label: str
    domain: Domain
    is_reference: bool
    # The op itself when it is not in the registry (a class from ``conformance_tests``).
    bound_operation: Operation | None = None

    @property
    def operation(self) -> Operation:
        return self.bound_operation or get_operation(self.op)


def bind_implementations(user_targets: dict[str, str], resolve: Callable[[str, str], Callable],
                         selected_ops: tuple[str, ...]) -> dict[str, Implementation | str]:
    """Resolve every op to its implementation: the user's callable, or the reference's target.

    References stay as "module:attr" strings until first use, so that a run
    that checks one user op never imports the other reference kernels.
    """
    bound: dict[str, Implementation | str] = {}
    for op in selected_ops:
        operation = get_operation(op)
        if op in user_targets:
            target = user_targets[op]
            function = resolve(target, op)
            domain = declared_domain(function)
            try:
                domain.validate_for(op, operation.dimensions, operation.dtypes)
            except SupportsError as error:
                import pytest

                raise pytest.UsageError(f"--pallas-impl {op}={target}: {error}")
            bound[op] = Implementation(op, function, target, domain, is_reference=False)
        elif operation.reference is None:
            import pytest

            raise pytest.UsageError(
                f"op {op!r} has no reference kernel to check; give --pallas-impl {op}=MODULE:ATTR."
            )
        else:
            bound[op] = operation.reference
    return bound


def selected_ops(user_ops: tuple[str, ...], impl_ops: tuple[str, ...]) -> tuple[str, ...]:
    """The ops the packaged suite runs: those of --pallas-impl (and --pallas-ops), else every
    op with a reference kernel (or those --pallas-ops names)."""
    names = op_names()
    if impl_ops:
        ops = impl_ops if not user_ops else tuple(op for op in impl_ops if op in user_ops)
    else:
        ops = user_ops or tuple(op for op in names if get_operation(op).reference is not None)
    return tuple(op for op in names if op in ops)


def bind_function(operation: Operation, function: Callable, label: str | None = None
                  ) -> Implementation:
    """An implementation given as a function (``conformance_tests``), its ``@supports`` checked."""
    domain = declared_domain(function)
    domain.validate_for(operation.name, operation.dimensions, operation.dtypes)
    label = label or (f"{getattr(function, '__module__', '?')}:"
                      f"{getattr(function, '__qualname__', function)}")
    return Implementation(operation.name, function, label, domain, is_reference=False,
                          bound_operation=operation)


def _failure_summary(error: Exception) -> str:
    """One line for the report: the timeout's own message, not XLA's wrapping of it."""
    import re

    text = str(error)
    match = re.search(r"KernelTimeout: (.*)", text)
    if match:
        return match.group(1)
    return f"{type(error).__name__}: {text}"


_GRID_COVERAGE = "grid coverage (which kernel grid axes the examples exercised)"


class PlainInterpreterCannotRun(UserWarning):
    """JAX's plain interpreter crashed inside JAX on a kernel; the suite used the TPU one."""


class Conformance:
    """The object behind the ``conformance`` fixture."""

    def __init__(self, implementations: dict[str, Implementation | str], backend: Backend,
                 recorder: ConformanceRecorder, *, interpreter_chosen: bool = False,
                 sweep_first: int | None = None) -> None:
        self._implementations = implementations
        self.backend = backend
        self.recorder = recorder
        # Breadth and depth: unless the user chose an interpreter, the many
        # examples of the value and vmap properties run in the plain
        # interpreter (about 4x faster), and the written property runs in
        # the TPU interpreter, whose NaN-poisoned buffers expose unwritten
        # outputs and uninitialised accumulators. Ops whose kernels need
        # simulated DMAs or devices always run in the TPU interpreter.
        self.interpreter_chosen = interpreter_chosen
        self.sweep_first = sweep_first  # --pallas-sweep-first: 1-based, as failures number them
        self._keys: dict[str, str] = {}
        self._quiet = False  # a failing call in the plain interpreter is not a verdict
        self._plain_crashed: dict[str, str] = {}  # op -> why the plain interpreter cannot run it
        # Jitted implementations, for this test only: examples of one signature compile once.
        self._compiled: dict = {}

    @contextlib.contextmanager
    def _failures_unrecorded(self):
        self._quiet = True
        try:
            yield
        finally:
            self._quiet = False

    def _plain_breadth(self, op: str) -> bool:
        """Whether the many-example properties of ``op`` run in the plain interpreter."""
        return not (self.backend.is_tpu or self.interpreter_chosen
                    or self.implementation(op).operation.needs_tpu_interpreter
                    or op in self._plain_crashed)

    def _in_breadth(self, op: str, call: Callable[[], Any]) -> Any:
        """``call()`` in the interpreter of the many-example properties.

        The plain interpreter is only the faster path, never a source of failures of
        its own: a call that raises there runs again in the test's TPU interpreter,
        whose verdict counts. When the plain interpreter itself cannot run the kernel
        (it crashed inside JAX: ``pl.program_id`` inside a ``pl.when``, say), every
        later example of the op runs in the TPU interpreter, and a warning says so once.
        """
        __tracebackhide__ = True
        if self._plain_breadth(op):
            from jax.experimental.pallas import tpu as pltpu

            try:
                with pltpu.force_tpu_interpret_mode(True), self._failures_unrecorded():
                    return call()
            except Exception as error:  # the TPU interpreter's verdict follows
                crash = jax_internals.interpreter_crash(error)
                if crash is not None:
                    self._plain_crashed[op] = crash
                    import warnings

                    warnings.warn(PlainInterpreterCannotRun(
                        f"{op}: JAX's plain interpreter cannot run this kernel ({crash}), a "
                        "limitation of JAX, not a kernel bug; the suite runs its value, "
                        "deterministic and vmap examples in the TPU interpreter instead "
                        "(slower, same verdicts)."), stacklevel=1)
        return call()

    def _test_interpreter(self) -> str:
        return "TPU" if self.backend.is_tpu else str(self.backend.interpreter)

    def _ran_in_breadth(self, op: str, *names: str) -> None:
        """Record where ``names`` ran the example that just passed through ``_in_breadth``."""
        self.recorder.ran_in(self._key(op), names,
                             "plain" if self._plain_breadth(op) else self._test_interpreter())

    def implementation(self, op: str) -> Implementation:
        bound = self._implementations[op]
        if isinstance(bound, str):
            operation = get_operation(op)
            function = operation.load_reference()
            bound = Implementation(op, function, f"reference ({bound})",
                                   declared_domain(function), is_reference=True)
            self._implementations[op] = bound
        key = op
        known = self.recorder.ops.get(op)
        if known is not None and known.implementation != bound.label:
            # A second implementation of the op in this run (two conformance_tests classes):
            # a row of its own.
            key = f"{op} ({bound.label})"
        self._keys[op] = key
        self.recorder.register(key, bound.label, bound.domain.as_dict(), bound.domain.describe())
        return bound

    def _key(self, op: str) -> str:
        """The report's row for ``op``'s implementation."""
        return self._keys.get(op, op)

    def draw(self, data: st.DataObject | op_inputs.SweepSlot,
             op: str) -> tuple[Implementation, op_inputs.Case | None]:
        """The input of one example: drawn, or the sweep's (None past the op's last)."""
        implementation = self.implementation(op)
        if implementation.operation.collective and self.backend.interpreter == "plain":
            import pytest

            # JAX's plain interpreter has no remote DMAs: it crashes inside JAX on them.
            pytest.skip(f"{op}: remote copies between devices run only in the TPU "
                        "interpreter; drop --pallas-interpret=plain to check this op")
        if isinstance(data, op_inputs.SweepSlot):
            index = op_inputs.sweep_order(implementation.operation, implementation.domain,
                                          self.sweep_first)[data.index:data.index + 1]
            case = (op_inputs.sweep_case(implementation.operation, implementation.domain,
                                         index[0]) if index else None)
            if case is not None:
                data.case = index[0]
                note(f"input ({data!r}): {case!r}")
        else:
            case = data.draw(op_inputs.cases(implementation.operation, implementation.domain),
                             label="input")
        note(f"implementation: {implementation.label}")
        return implementation, case

    @contextlib.contextmanager
    def _grid_recorded(self, op: str, case: op_inputs.Case):
        """Record the grid axes of every ``pallas_call`` traced inside the block as one example
        of ``op``; yields the list of ``suite.grid_coverage.AxisRun`` found (filled on exit)."""
        runs: list[grid_coverage.AxisRun] = []
        if _GRID_COVERAGE in jax_internals.features_off():
            yield runs
            return
        operation = case.operation
        shapes = [tuple(np.shape(arg)) for arg in case.args]

        def observer(params: dict[str, Any]) -> None:
            # Never raises: an observer that raises aborts the kernel's trace.
            try:
                info = kernel_model.describe_pallas_call(params)
                runs.extend(grid_coverage.axis_runs(info, operation.arguments,
                                                    operation.result, shapes))
            except Exception as error:
                jax_internals.feature_off(_GRID_COVERAGE, error)

        try:
            with pallas_call_hooks.observe_pallas_calls(observer):
                yield runs
        finally:
            unique = list(dict.fromkeys(runs))  # a call retried in the TPU interpreter
            runs[:] = unique
            self.recorder.grid_axes(self._key(op), unique)

    def _fail(self, op: str, name: str, message: str) -> None:
        __tracebackhide__ = True
        self.recorder.outcome(self._key(op), name, False, message)
        raise AssertionError(f"[{op}: {name}] {message}")

    def _call(self, op: str, prop: str, implementation: Implementation, case: Any) -> Any:
        __tracebackhide__ = True
        import jax

        try:
            return properties.run(implementation.function, case, self._compiled)
        except jax.errors.TracerArrayConversionError:
            message = (f"{implementation.label} turned a traced input into a NumPy array; the "
                       "suite calls implementations under jax.jit, so they must compute with "
                       "jax.numpy or Pallas, not NumPy.")
            if not self._quiet:
                self.recorder.outcome(self._key(op), prop, False, message)
            raise AssertionError(f"[{op}: {prop}] {message}") from None
        except Exception as error:
            summary = _failure_summary(error)
            if not self._quiet:
                self.recorder.outcome(self._key(op), prop, False, summary)
            if "--pallas-timeout" in summary:
                import pytest

                # pytest.fail is a BaseException: Hypothesis stops at once
                # instead of re-running a hung kernel while it shrinks.
                pytest.fail(f"[{op}: {prop}] {summary}\ninput: {case!r}", pytrace=False)
            raise

    # --- properties --------------------------------------------------------------

    def check_value(self, op: str, data: st.DataObject) -> None:
        """Shape and dtype, no NaN/Inf the oracle lacks, and the value within tolerance."""
        __tracebackhide__ = True
        implementation, case = self.draw(data, op)
        if case is None:
            return  # a sweep slot this op has no case for
        with self._grid_recorded(op, case) as runs:
            result = self._in_breadth(op, lambda: self._call(op, "value", implementation, case))
        if not isinstance(data, op_inputs.SweepSlot):
            # Steer the drawn examples towards grids with several steps and ragged ends.
            target(float(grid_coverage.example_score(runs)), label="grid axes exercised")
        self._ran_in_breadth(op, "shape_dtype", "finite", "value")
        self.recorder.example(self._key(op), "shape_dtype")
        problem = properties.output_type_problem(case, result)
        if problem:
            self._fail(op, "shape_dtype", problem)
        with without_uninitialized_read_hint():  # the suite finds out instead of guessing
            verdicts, worst, message, expected = properties.judge_against_oracle(
                case, result, matmul_precision=self.backend.matmul_precision)
        if not verdicts["finite"]:
            message += "\n" + self._nonfinite_cause(op, implementation, case, expected)
        self.recorder.example(self._key(op), "value", worst_error=worst)
        self.recorder.example(self._key(op), "finite")
        for name in ("shape_dtype", "finite", "value"):
            if verdicts[name]:
                self.recorder.outcome(self._key(op), name, True)
        if message:
            failed = "finite" if not verdicts["finite"] else "value"
            self._fail(op, failed, message)

    def check_repeatable(self, op: str, data: st.DataObject) -> None:
        """Every output element written (NaN- vs zero-poisoned outputs agree) and the same twice."""
        __tracebackhide__ = True
        if self.backend.is_tpu:
            import pytest

            pytest.skip("written/deterministic: output poisoning needs the TPU interpreter")

        implementation, case = self.draw(data, op)
        with self._grid_recorded(op, case):
            first, zeroed = self._poisoned_runs(op, "written", implementation, case)
        once, again = self._in_breadth(op, lambda: (
            self._call(op, "deterministic", implementation, case),
            self._call(op, "deterministic", implementation, case)))
        self.recorder.ran_in(self._key(op), ("written",), self._test_interpreter())
        self._ran_in_breadth(op, "deterministic")
        problem = properties.output_type_problem(case, first)
        if problem:
            self._fail(op, "shape_dtype", problem)
        self.recorder.example(self._key(op), "written")
        self.recorder.example(self._key(op), "deterministic")
        violation = uninitialized_read_violation(f"'{implementation.label}'", first, zeroed)
        if violation is not None:
            self._fail(op, "written", str(violation))
        self.recorder.outcome(self._key(op), "written", True)
        differs = bitwise_differences(once, again)
        if np.any(differs):
            where = tuple(int(i) for i in np.argwhere(differs)[0])
            self._fail(op, "deterministic", (
                f"two calls on the same input differ in {int(differs.sum())} elements (first at "
                f"{where}): the kernel depends on grid order or on uninitialised memory."
            ))
        self.recorder.outcome(self._key(op), "deterministic", True)

    def _poisoned_runs(self, op: str, prop: str | None, implementation: Implementation,
                       case: Any) -> tuple[Any, Any]:
        """The results in the TPU interpreter with fresh memory filled with NaN, then zeros.

        A failing call fails ``prop``; with ``prop`` None it only raises.
        """
        __tracebackhide__ = True

        def call() -> Any:
            if prop is None:
                return properties.run(implementation.function, case, self._compiled)
            return self._call(op, prop, implementation, case)

        return run_on_poisoned_and_zeroed_memory(call, self.backend.interpret_params)

    def _nonfinite_cause(self, op: str, implementation: Implementation, case: Any,
                         expected: np.ndarray) -> str:
        """Why a result has NaN or Inf where the oracle is finite, found out, not guessed.

        A NaN in interpret mode is either memory the kernel never wrote (the interpreter
        fills it with NaN) or the kernel's own arithmetic: the same input run with fresh
        memory filled with NaN and with zeros tells the two apart.
        """
        if self.backend.is_tpu:
            return ("cause: an overflow or 0/0 in the kernel's arithmetic, or memory it "
                    "read before writing; run without --pallas-tpu to find out which.")
        try:
            poisoned, zeroed = self._poisoned_runs(op, None, implementation, case)
        except Exception as error:  # the diagnosis is a courtesy: the failure stands
            return f"cause: not found ({type(error).__name__} when rerun to find it)."
        violation = uninitialized_read_violation(f"'{implementation.label}'", poisoned, zeroed)
        if violation is not None:
            return f"cause: {violation}"
        if not _introduces_nonfinite(poisoned, expected):
            return ("cause: not found: rerun in the TPU interpreter, the same input gives no NaN "
                    "or Inf; run with --pallas-interpret=tpu for that interpreter's verdict.")
        return ("cause: the kernel's arithmetic, not uninitialised memory (the result is the "
                "same with fresh memory filled with NaN and with zeros): an overflow, such as "
                "exp of a large input without subtracting the row maximum first, or 0/0, or "
                "inf - inf.")

    def check_vmap(self, op: str, data: st.DataObject) -> None:
        """The op under ``jax.vmap`` equals the op on each slice."""
        __tracebackhide__ = True
        import functools

        import jax

        implementation, case = self.draw(data, op)
        batched_args = properties.vmapped_case_args(case)
        function = jax.jit(jax.vmap(functools.partial(
            implementation.function, **properties.call_kwargs(case), **case.blocks)))
        try:
            result = self._in_breadth(
                op, lambda: jax.block_until_ready(function(*batched_args)))
        except Exception as error:
            self.recorder.outcome(self._key(op), "vmap", False, f"{type(error).__name__}: {error}")
            raise
        self._ran_in_breadth(op, "vmap")
        worst = 0.0
        for index in range(batched_args[0].shape[0]):
            slice_case = case.with_args(tuple(a[index] for a in batched_args))
            if not hasattr(result, "shape") or result.shape[0] <= index:
                self._fail(op, "vmap", f"under jax.vmap {op} returned "
                           f"{properties.describe_output(result)}")
            with without_uninitialized_read_hint():  # the value property diagnoses NaN
                verdicts, error, message, _ = properties.judge_against_oracle(
                    slice_case, result[index], matmul_precision=self.backend.matmul_precision)
            worst = max(worst, error)
            if message:
                self._fail(op, "vmap", f"under jax.vmap, batch element {index}:\n{message}")
        self.recorder.example(self._key(op), "vmap", worst_error=worst)
        self.recorder.outcome(self._key(op), "vmap", True)


def _introduces_nonfinite(result: Any, expected: np.ndarray) -> bool:
    """Whether ``result`` has NaN or Inf where ``expected`` is finite (True if it cannot say)."""
    try:
        return bool(np.any(properties.introduced_nonfinite(result, expected)))
    except (TypeError, ValueError):  # not an array of the expected shape
        return True
