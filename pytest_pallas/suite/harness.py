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
import functools
import re
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import note, target
from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu

from .._compat import jax_internals, pallas_call_hooks
from ..backend import Backend, gpu_interpreters_used
from ..checks import kernel_model
from ..checks.kernel_check import (
    first_difference,
    poison_differs_from_zero,
    run_on_fresh_memory,
    run_on_poisoned_and_zeroed_memory,
    uninitialized_read_violation,
)
from ..compare import bitwise_differences, without_uninitialized_read_hint
from ..ops import inputs as op_inputs
from ..ops.domains import Domain
from ..ops.operation import DEVICES
from ..supervision.timeout import TimeoutInterrupt
from . import grid_coverage, judge, properties
from .implementation import Implementation
from .report import VALUE_PROPERTIES, ConformanceRecorder


def _failure_summary(error: Exception) -> str:
    """One line for the report: the timeout's own message, not XLA's wrapping of it."""
    text = str(error)
    match = re.search(r"(?:Kernel|Pallas)Timeout: (.*)", text)
    if match:
        return match.group(1)
    return f"{type(error).__name__}: {text}"


_GRID_COVERAGE = "grid coverage (which kernel grid axes the examples exercised)"


# The property a conformance test is checking now (its recorder, row and name): a test that
# --pallas-timeout stops by ending its process records its failure there
# (``record_stuck_property``).
_checking: tuple[ConformanceRecorder, str, str] | None = None


def record_stuck_property(message: str) -> bool:
    """Record the property being checked now as failed with ``message`` (its process is
    about to end); whether a property was being checked."""
    if _checking is None:
        return False
    recorder, row, name = _checking
    recorder.outcome(row, name, False, message)
    return True


def _checking(prop: str) -> Callable:
    """A check of the suite, which begins with ``prop``: a ``--pallas-timeout`` that stops it
    in its Python code (``TimeoutInterrupt``) is recorded as the failure of the property it
    was checking."""
    def decorate(check: Callable) -> Callable:
        @functools.wraps(check)
        def checked(self: Conformance, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            self._checks(prop)
            try:
                return check(self, *args, **kwargs)
            except TimeoutInterrupt:
                record_stuck_property("ran past --pallas-timeout (stopped in Python code)")
                raise
        return checked
    return decorate


# The implementations whose state probe ran in this process (once each: it traces dozens
# of times).
_STATE_PROBED: set = set()


def forget_session_state() -> None:
    """At the end of a pytest session: what the judge saw in it (the implementations probed,
    the first program of each signature) is forgotten, so that the next session in the same
    process (pytester's in-process runs) judges afresh."""
    _STATE_PROBED.clear()
    judge.forget_first_programs()


class PlainInterpreterCannotRun(UserWarning):
    """JAX's plain interpreter crashed inside JAX on a kernel; the suite used the TPU one."""


class Conformance:
    """The object behind the ``conformance`` fixture."""

    def __init__(self, implementation: Implementation, backend: Backend,
                 recorder: ConformanceRecorder, *, interpreter_chosen: bool = False,
                 sweep_first: int | None = None, most_drawn_devices: int | None = None,
                 judge: bool = False, row_per_chip: bool = False) -> None:
        self.implementation = implementation
        self.operation = implementation.operation
        self.backend = backend
        self.recorder = recorder
        # The report's row of this implementation: registered once, when the recorder first
        # meets it, not at every example.
        self._row = recorder.row(implementation, backend.chip if row_per_chip else None)
        # Breadth and depth: unless the user chose an interpreter, the many
        # examples of the value and vmap properties run in the plain
        # interpreter (about 4x faster), and the written property runs in
        # the TPU interpreter, whose NaN-poisoned buffers expose unwritten
        # outputs and uninitialised accumulators. Ops whose kernels need
        # simulated DMAs or devices always run in the TPU interpreter.
        self.interpreter_chosen = interpreter_chosen
        self.sweep_first = sweep_first  # --pallas-sweep-first: 1-based, as failures number them
        # The most devices a drawn example of a collective op may take (None: its bucket's).
        self.most_drawn_devices = most_drawn_devices
        self._quiet = False  # a failing call in the plain interpreter is not a verdict
        self._plain_crash: str | None = None  # why the plain interpreter cannot run the kernel
        # Jitted implementations, for this test only: examples of one signature compile once.
        self._compiled: dict = {}
        # --pallas-judge: the judge's findings fail the test (else they are only reported).
        self.judge = judge
        self._judged_signatures: set = set()  # the program of each signature is read once

    @contextlib.contextmanager
    def _failures_unrecorded(self):
        self._quiet = True
        try:
            yield
        finally:
            self._quiet = False

    def _plain_breadth(self) -> bool:
        """Whether the many-example properties run in the plain interpreter."""
        return not (self.backend.is_compiled or self.interpreter_chosen
                    or self.operation.needs_tpu_interpreter
                    or self._plain_crash is not None)

    def _in_breadth(self, call: Callable[[], Any]) -> Any:
        """``call()`` in the interpreter of the many-example properties.

        The plain interpreter is only the faster path, never a source of failures of
        its own: a call that raises there runs again in the test's TPU interpreter,
        whose verdict counts. When the plain interpreter itself cannot run the kernel
        (it crashed inside JAX: ``pl.program_id`` inside a ``pl.when``, say), every
        later example of the op runs in the TPU interpreter, and a warning says so once.
        """
        __tracebackhide__ = True
        if self._plain_breadth():
            try:
                with pltpu.force_tpu_interpret_mode(True), self._failures_unrecorded():
                    return call()
            except Exception as error:  # the TPU interpreter's verdict follows
                crash = jax_internals.interpreter_crash(error)
                if crash is not None:
                    self._plain_crash = crash

                    warnings.warn(PlainInterpreterCannotRun(
                        f"{self.operation.name}: JAX's plain interpreter cannot run this kernel "
                        f"({crash}), a limitation of JAX, not a kernel bug; the suite runs "
                        "its value, deterministic and vmap examples in the TPU interpreter instead "
                        "(slower, same verdicts)."), stacklevel=1)
        return call()

    def _test_interpreter(self) -> str:
        if self.backend.is_compiled:
            return self.backend.platform.upper()
        return str(self.backend.interpreter)

    def _ran_in_breadth(self, *names: str) -> None:
        """Record where ``names`` ran the example that just passed through ``_in_breadth``."""
        self.recorder.ran_in(self._row, names, gpu_interpreters_used()
                             or ("plain" if self._plain_breadth() else self._test_interpreter()))

    def draw(self, data: st.DataObject | op_inputs.SweepSlot) -> op_inputs.Case | None:
        """The input of one example: drawn, or the sweep's (None past the op's last)."""
        implementation = self.implementation
        if self.operation.collective and self.backend.interpreter == "plain":
            # JAX's plain interpreter has no remote DMAs: it crashes inside JAX on them.
            pytest.skip(f"{self.operation.name}: remote copies between devices run only in the "
                        "TPU interpreter; drop --pallas-interpret=plain to check this op")
        if isinstance(data, op_inputs.SweepSlot):
            index = op_inputs.sweep_order(self.operation, implementation.domain,
                                          self.sweep_first)[data.index:data.index + 1]
            case = (op_inputs.sweep_case(self.operation, implementation.domain, index[0])
                    if index else None)
            if case is not None:
                data.case = index[0]
                note(f"input ({data!r}): {case!r}")
        else:
            case = data.draw(op_inputs.cases(self.operation, self._drawn_domain()),
                             label="input")
        note(f"implementation: {implementation.label}")
        return case

    def _drawn_domain(self) -> Domain:
        """The implementation's domain, with at most ``most_drawn_devices`` for a collective."""
        domain = self.implementation.domain
        if self.most_drawn_devices is None or not self.operation.collective:
            return domain

        most = min(domain.max_size.get(DEVICES, self.most_drawn_devices), self.most_drawn_devices)
        return dataclasses.replace(domain, max_size={**domain.max_size, DEVICES: most})

    @contextlib.contextmanager
    def _grid_recorded(self, case: op_inputs.Case,
                       kernels: list[kernel_model.PallasCallInfo] | None = None):
        """Record the grid axes of every ``pallas_call`` traced inside the block as one example
        of the op; yields the list of ``suite.grid_coverage.AxisRun`` found (filled on exit).
        ``kernels``, if given, receives the description of each ``pallas_call`` traced."""
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
                if kernels is not None:
                    kernels.append(info)
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
            self.recorder.grid_axes(self._row, unique)

    def _fail(self, name: str, message: str) -> None:
        __tracebackhide__ = True
        self.recorder.outcome(self._row, name, False, message)
        raise AssertionError(f"[{self.operation.name}: {name}] {message}")

    def _checks(self, prop: str) -> None:
        """From here the test checks ``prop`` (its calls and its oracle's computation)."""
        global _checking
        _checking = (self.recorder, self._row, prop)

    def _call(self, prop: str, case: Any) -> Any:
        __tracebackhide__ = True
        self._checks(prop)
        implementation = self.implementation

        try:
            return properties.run(implementation.function, case, self._compiled)
        except jax.errors.TracerArrayConversionError:
            message = (f"{implementation.label} turned a traced input into a NumPy array; the "
                       "suite calls implementations under jax.jit, so they must compute with "
                       "jax.numpy or Pallas, not NumPy.")
            if not self._quiet:
                self.recorder.outcome(self._row, prop, False, message)
            raise AssertionError(f"[{self.operation.name}: {prop}] {message}") from None
        except jax.errors.UnexpectedTracerError:
            message = judge.leaked_tracer_finding().line()
            if not self._quiet:
                self.recorder.outcome(self._row, prop, False, message)
                self.recorder.findings(self._row, [judge.leaked_tracer_finding()])
            raise AssertionError(f"[{self.operation.name}: {prop}] {message}") from None
        except Exception as error:
            summary = _failure_summary(error)
            if not self._quiet:
                self.recorder.outcome(self._row, prop, False, summary)
            if "--pallas-timeout" in summary:
                # pytest.fail is a BaseException: Hypothesis stops at once
                # instead of re-running a hung kernel while it shrinks.
                pytest.fail(f"[{self.operation.name}: {prop}] {summary}\ninput: {case!r}",
                            pytrace=False)
            raise

    # --- the judge (contract §8) ---------------------------------------------------

    def _judge_program(self, case: op_inputs.Case) -> None:
        """Read the implementation's traced program on ``case`` (once per signature): where
        its arithmetic runs and which host callbacks it makes. Recorded always; under
        --pallas-judge a finding fails the test, and so do checks this JAX turned off."""
        __tracebackhide__ = True
        if judge.JUDGE_CHECKS in jax_internals.features_off():
            if self.judge:  # what cannot be judged is not accepted
                self._fail("judge", f"{judge.JUDGE_CHECKS} is off on this JAX: "
                           f"{jax_internals.features_off()[judge.JUDGE_CHECKS]}")
            return
        signature = (tuple((np.shape(a), str(np.asarray(a).dtype)) for a in case.args),
                     repr(sorted(case.kwargs.items())), repr(sorted(case.blocks.items())))
        if signature in self._judged_signatures:
            return
        self._judged_signatures.add(signature)
        try:
            with pallas_call_hooks.suspend_pallas_call_observers():
                verdict = judge.program_verdict(self.implementation.function, case,
                                                compare_traces=self.judge)
        except judge.CannotTrace:  # the implementation's own call reports why
            return
        except Exception as error:  # the judge cannot read this JAX's programs
            jax_internals.feature_off(judge.JUDGE_CHECKS, error)
            if self.judge:
                self._fail("judge", f"{judge.JUDGE_CHECKS} is off on this JAX: "
                           f"{type(error).__name__}: {error}")
            return
        self.recorder.judged(self._row, verdict)
        self._judge_findings(verdict.findings)
        if self.judge:
            self.recorder.outcome(self._row, "judge", True)

    def _judge_findings(self, findings: Any) -> None:
        """Record the findings; under --pallas-judge the first fails the test, one line."""
        __tracebackhide__ = True
        if not findings:
            return
        self.recorder.findings(self._row, findings)
        if self.judge:
            more = f" (and {len(findings) - 1} more finding(s))" if len(findings) > 1 else ""
            self._fail("judge", findings[0].line() + more)

    def _judge_state(self, case: op_inputs.Case, result: Any) -> None:
        """Under --pallas-judge, once per implementation and process: no state kept across
        calls (the interleaved traces of ``suite.judge.state_findings``) and a result that
        depends on every input the oracle says matters."""
        __tracebackhide__ = True
        if not self.judge or self.implementation in _STATE_PROBED:
            return
        _STATE_PROBED.add(self.implementation)
        with pallas_call_hooks.suspend_pallas_call_observers():
            findings = judge.state_findings(self.implementation.function, case)
        if not findings:
            findings = judge.input_impact_findings(
                lambda changed: self._in_breadth(lambda: self._call("value", changed)), case,
                result, matmul_precision=self.backend.matmul_precision)
        self._judge_findings(findings)
        self.recorder.outcome(self._row, "judge", True)

    # --- properties --------------------------------------------------------------

    @_checking("value")
    def check_value(self, data: st.DataObject) -> None:
        """Shape and dtype, no NaN/Inf the oracle lacks, and the value within tolerance.

        A sweep case is checked as it is; a drawn signature on ``VALUES_PER_SIGNATURE``
        inputs, which share one compilation."""
        __tracebackhide__ = True
        case = self.draw(data)
        if case is None:
            return  # a sweep slot this op has no case for
        if isinstance(data, op_inputs.SweepSlot):
            self._check_value_of(case)
            return
        steps = self._check_value_of(case)
        # Steer the drawn examples towards grids with several steps and ragged ends.
        target(float(steps), label="grid axes exercised")
        for _ in range(op_inputs.VALUES_PER_SIGNATURE - 1):
            sibling = data.draw(op_inputs.same_signature(case), label="same signature")
            self._check_value_of(sibling)

    def _check_value_of(self, case: op_inputs.Case) -> int:
        """The value property on one input; the grid's score for Hypothesis's targeting."""
        __tracebackhide__ = True
        self._judge_program(case)
        with self._grid_recorded(case) as runs:
            result = self._in_breadth(lambda: self._call("value", case))
        self._ran_in_breadth(*VALUE_PROPERTIES)
        self.recorder.example(self._row, "shape_dtype")
        problem = properties.output_type_problem(case, result)
        if problem:
            self._fail("shape_dtype", problem)
        with without_uninitialized_read_hint():  # the suite finds out instead of guessing
            verdicts, worst, message, expected = properties.judge_against_oracle(
                case, result, matmul_precision=self.backend.matmul_precision)
        if not verdicts["finite"]:
            message += "\n" + self._nonfinite_cause(case, expected)
        self.recorder.example(self._row, "value", worst_error=worst)
        self.recorder.example(self._row, "finite")
        for name in VALUE_PROPERTIES:
            if verdicts[name]:
                self.recorder.outcome(self._row, name, True)
        if message:
            failed = "finite" if not verdicts["finite"] else "value"
            self._fail(failed, message)
        self._judge_state(case, result)
        return grid_coverage.example_score(runs)

    @_checking("written")
    def check_repeatable(self, data: st.DataObject) -> None:
        """Every output element written (NaN- vs zero-poisoned outputs agree) and the same twice."""
        __tracebackhide__ = True
        if self.backend.is_compiled:
            pytest.skip("written/deterministic: output poisoning needs an interpreter (run "
                        "without --pallas-tpu or --pallas-gpu)")

        case = self.draw(data)
        self._judge_program(case)
        kernels: list[kernel_model.PallasCallInfo] = []
        with self._grid_recorded(case, kernels):
            zeroed = run_on_fresh_memory(lambda: self._call("written", case), "zero",
                                         self.backend.interpret_params)
            once, again = self._in_breadth(lambda: (
                self._call("deterministic", case),
                self._call("deterministic", case)))
        self.recorder.ran_in(self._row, ("written",),
                             gpu_interpreters_used() or self._test_interpreter())
        self._ran_in_breadth("deterministic")
        problem = properties.output_type_problem(case, zeroed)
        if problem:
            self._fail("shape_dtype", problem)
        self.recorder.example(self._row, "written")
        self.recorder.example(self._row, "deterministic")
        # The first deterministic call ran on fresh memory filled with NaN (the TPU
        # interpreter's, or the plain one's: NaN, the integer minimum). Where it equals the
        # zeroed run bit for bit, no read of fresh memory reached the result, and the
        # TPU interpreter's NaN-filled run, one more compilation, is not needed: it decides
        # only where they differ (the interpreters may round differently) or where a buffer's
        # poison in the plain interpreter is zero too (``poison_differs_from_zero``).
        if not poison_differs_from_zero(kernels) or first_difference(once, zeroed) is not None:
            first = run_on_fresh_memory(lambda: self._call("written", case), "nan",
                                        self.backend.interpret_params)
            violation = uninitialized_read_violation(f"'{self.implementation.label}'", first,
                                                     zeroed)
            if violation is not None:
                self._fail("written", str(violation))
        self.recorder.outcome(self._row, "written", True)
        differs = bitwise_differences(once, again)
        if np.any(differs):
            where = tuple(int(i) for i in np.argwhere(differs)[0])
            self._fail("deterministic", (
                f"two calls on the same input differ in {int(differs.sum())} elements (first at "
                f"{where}): the kernel depends on grid order or on uninitialised memory."
            ))
        self.recorder.outcome(self._row, "deterministic", True)

    def _poisoned_runs(self, case: Any) -> tuple[Any, Any]:
        """The results in the TPU interpreter with fresh memory filled with NaN, then zeros
        (a failing call raises)."""
        __tracebackhide__ = True
        return run_on_poisoned_and_zeroed_memory(
            lambda: properties.run(self.implementation.function, case, self._compiled),
            self.backend.interpret_params)

    def _nonfinite_cause(self, case: Any, expected: np.ndarray) -> str:
        """Why a result has NaN or Inf where the oracle is finite, found out, not guessed.

        A NaN in interpret mode is either memory the kernel never wrote (the interpreter
        fills it with NaN) or the kernel's own arithmetic: the same input run with fresh
        memory filled with NaN and with zeros tells the two apart.
        """
        if self.backend.is_compiled:
            return ("cause: an overflow or 0/0 in the kernel's arithmetic, or memory it "
                    f"read before writing; run without --pallas-{self.backend.platform} to "
                    "find out which.")
        try:
            poisoned, zeroed = self._poisoned_runs(case)
        except Exception as error:  # the diagnosis is a courtesy: the failure stands
            return f"cause: not found ({type(error).__name__} when rerun to find it)."
        violation = uninitialized_read_violation(f"'{self.implementation.label}'", poisoned,
                                                 zeroed)
        if violation is not None:
            return f"cause: {violation}"
        if not _introduces_nonfinite(poisoned, expected):
            return ("cause: not found: rerun in the TPU interpreter, the same input gives no NaN "
                    "or Inf; run with --pallas-interpret=tpu for that interpreter's verdict.")
        return ("cause: the kernel's arithmetic, not uninitialised memory (the result is the "
                "same with fresh memory filled with NaN and with zeros): an overflow, such as "
                "exp of a large input without subtracting the row maximum first, or 0/0, or "
                "inf - inf.")

    @_checking("vmap")
    def check_vmap(self, data: st.DataObject) -> None:
        """The op under ``jax.vmap`` equals the op on each slice."""
        __tracebackhide__ = True

        case = self.draw(data)
        self._judge_program(case)
        batched_args = properties.vmapped_case_args(case)
        function = properties.suite_jit(jax.vmap(functools.partial(
            self.implementation.function, **properties.call_kwargs(case), **case.blocks)),
            long_run=True)  # a batch of examples in one grid
        try:
            result = self._in_breadth(
                lambda: jax.block_until_ready(function(*batched_args)))
        except Exception as error:
            self.recorder.outcome(self._row, "vmap", False, f"{type(error).__name__}: {error}")
            raise
        self._ran_in_breadth("vmap")
        worst = 0.0
        for index in range(batched_args[0].shape[0]):
            slice_case = case.with_args(tuple(a[index] for a in batched_args))
            if not hasattr(result, "shape") or result.shape[0] <= index:
                self._fail("vmap", f"under jax.vmap {self.operation.name} returned "
                           f"{properties.describe_output(result)}")
            with without_uninitialized_read_hint():  # the value property diagnoses NaN
                verdicts, error, message, _ = properties.judge_against_oracle(
                    slice_case, result[index], matmul_precision=self.backend.matmul_precision)
            worst = max(worst, error)
            if message:
                self._fail("vmap", f"under jax.vmap, batch element {index}:\n{message}")
        self.recorder.example(self._row, "vmap", worst_error=worst)
        self.recorder.outcome(self._row, "vmap", True)


def _introduces_nonfinite(result: Any, expected: np.ndarray) -> bool:
    """Whether ``result`` has NaN or Inf where ``expected`` is finite (True if it cannot say)."""
    try:
        return bool(np.any(properties.introduced_nonfinite(result, expected)))
    except (TypeError, ValueError):  # not an array of the expected shape
        return True
