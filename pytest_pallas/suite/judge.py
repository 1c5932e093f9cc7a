"""``--pallas-judge``: the checks that judge an implementation as a Pallas kernel (contract §8).

Three kinds, each a list of ``checks.honesty.Finding``:

* where the arithmetic runs (``program_verdict``): the implementation's traced program on
  the case's inputs, read by ``checks.honesty.judge_program``;
* no state across calls (``state_findings``): under ``jax.jit`` a program without host
  callbacks is a pure function of its inputs once traced, so state kept across calls (a
  call counter, a cache by shape) can act only when the implementation is traced. The probe
  traces it ``STATE_PROBE_ROUNDS`` times on the case's shapes, interleaved with traces on
  other shapes, and every trace of the same shapes must be the same program;
* the result depends on the inputs (``input_impact_findings``): an argument whose change
  changes the oracle's result must change the implementation's.

The suite's harness runs them (``suite.harness.Conformance``) and the report shares their
verdicts (``suite.report``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..checks import honesty
from ..checks.honesty import Finding, ProgramVerdict
from ..dtypes import as_dtype
from ..ops.inputs import Case
from ..ops.operation import DEVICES, SHAPE
from . import properties

# Rounds of the state probe: each traces the case's shapes and, interleaved, shapes twice
# as large. A counter that changes the program only after more traces than these (plus the
# run's own) is beyond this probe.
STATE_PROBE_ROUNDS = 24

JUDGE_CHECKS = "the judge's reading of traced programs (--pallas-judge)"


def traced_function(implementation: Callable, case: Case) -> tuple[Callable, tuple[Any, ...]]:
    """The function the suite calls for ``case`` (keywords bound; inside ``shard_map`` for a
    collective op) and its arguments."""
    if case.operation.collective:
        return properties.collective_function(implementation, case), tuple(case.args)
    return (functools.partial(implementation, **properties.call_kwargs(case), **case.blocks),
            tuple(case.args))


def _abstract(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype
                                      if not hasattr(a, "dtype") else a.dtype) for a in args)


def op_work(case: Case) -> float:
    """The op's FLOPs plus transcendentals for ``case`` by its cost model (0 if it has none)."""
    op = case.operation
    kwargs = properties.call_kwargs(case)
    try:
        if op.collective:
            devices = int(case.dims[DEVICES])
            block = tuple(np.array_split(np.asarray(a), devices)[0] for a in case.args)
            return devices * honesty.op_work(op.estimate_cost(*_abstract(block),
                                                              num_devices=devices, **kwargs))
        return honesty.op_work(op.estimate_cost(*_abstract(case.args), **kwargs))
    except Exception:  # a cost model that cannot take these arguments: the output's size
        return 0.0


# The first program the judge traced of each (implementation, keywords, argument shapes):
# every later trace of the same must match it (``_same_as_first``).
_first_programs: dict[tuple[Any, ...], str] = {}


def forget_first_programs() -> None:
    """At the end of a pytest session: the next session's judge starts from no program (a
    process may run several, pytester's in-process runs among them)."""
    _first_programs.clear()


def _same_as_first(implementation: Callable, case: Case, abstract: tuple[Any, ...],
                   closed: Any) -> bool:
    key = (implementation, repr(sorted(case.kwargs.items())), repr(sorted(case.blocks.items())),
           tuple((tuple(a.shape), str(a.dtype)) for a in abstract))
    fingerprint = _fingerprint(closed)
    return _first_programs.setdefault(key, fingerprint) == fingerprint


def _state_finding(detail: str) -> Finding:
    return Finding("state", f"{detail}: the implementation keeps state across calls (a call "
                   "counter, a cache by shape), so its result depends on what ran before")


def leaked_tracer_finding() -> Finding:
    """A call that met a value traced in another call (JAX's UnexpectedTracerError)."""
    return _state_finding("a call returned or used a value traced in an earlier call "
                          "(JAX's UnexpectedTracerError)")


class CannotTrace(Exception):
    """The implementation raised while traced: its own call, which follows, reports why."""


def program_verdict(implementation: Callable, case: Case, *, compare_traces: bool = True
                    ) -> ProgramVerdict:
    """Where the arithmetic of ``implementation`` runs on ``case`` (its traced program); with
    ``compare_traces``, a program other than the one the judge first traced for the same
    shapes is a finding (the state probe's memory; printing a program costs time, so the
    suite compares only under --pallas-judge).

    Raises ``CannotTrace`` when tracing the implementation raises; any other exception is
    the judge's own (a JAX whose programs it cannot read)."""
    function, args = traced_function(implementation, case)
    abstract = _abstract(args)
    try:
        closed = jax.make_jaxpr(lambda *arguments: function(*arguments))(*abstract)
    except Exception as error:
        raise CannotTrace(f"{type(error).__name__}: {error}") from error
    verdict = _judge(closed, case, args)
    if compare_traces and not _same_as_first(implementation, case, abstract, closed):
        finding = _state_finding("traced again on shapes it was traced on before, it gave "
                                 "another program")
        return dataclasses.replace(verdict, findings=(*verdict.findings, finding))
    return verdict


def _judge(closed: Any, case: Case, args: tuple[Any, ...]) -> ProgramVerdict:
    elements = int(np.prod(case.operation.result_shape(case.dims))) + sum(
        int(np.size(a)) for a in args)
    integer_op = np.dtype(as_dtype(case.dtype)).kind in "iu"
    return honesty.judge_program(closed, work=op_work(case), elements=elements,
                                 integer_op=integer_op)


def _fingerprint(closed: Any) -> str:
    """Text equal for two traces of the same program (constants' bytes included)."""
    # A kernel's interpret setting is the run's choice, not the implementation's.
    text = re.sub(r"\binterpret=[^\n]*", "", str(closed))
    digest = hashlib.sha256(text.encode())
    for const in getattr(closed, "consts", ()):
        try:
            digest.update(np.asarray(const).tobytes())
        except Exception:  # a constant that is no array (a PRNG key): its repr
            digest.update(repr(const).encode())
    return digest.hexdigest()


def _larger_case_args(case: Case) -> tuple[Any, ...] | None:
    """Abstract arguments of the op with every size doubled (devices kept): another
    signature to interleave with ``case``'s; None if the op cannot be sized so."""
    op = case.operation
    dims: dict[str, Any] = {}
    for name, size in case.dims.items():
        if name == DEVICES:
            dims[name] = size
        elif name == SHAPE:
            dims[name] = tuple(2 * int(n) for n in size)
        elif isinstance(size, int):
            dims[name] = 2 * size
        else:
            dims[name] = size
    try:
        shapes = op.argument_shapes(dims)
    except Exception:
        return None
    return tuple(jax.ShapeDtypeStruct(shape, np.asarray(arg).dtype)
                 for shape, arg in zip(shapes, case.args))


def state_findings(implementation: Callable, case: Case,
                   rounds: int = STATE_PROBE_ROUNDS) -> list[Finding]:
    """Trace ``implementation`` on ``case``'s shapes ``rounds`` times, interleaved with traces
    on larger shapes: every trace of one set of shapes must give the same program."""
    function, args = traced_function(implementation, case)
    shapes = {"the case's shapes": _abstract(args)}
    larger = _larger_case_args(case)
    if larger is not None:
        shapes["shapes twice as large"] = larger
    for trace in range(1, rounds * len(shapes) + 1):
        label = list(shapes)[(trace - 1) % len(shapes)]
        try:
            # A new function object each time: JAX caches a trace by the function.
            closed = jax.make_jaxpr(lambda *arguments: function(*arguments))(*shapes[label])
        except Exception as error:
            if label != "the case's shapes" and trace <= len(shapes):
                del shapes[label]  # outside the implementation's domain: no interleaving
                continue
            return [_state_finding(f"traced again on {label} (trace {trace} of the probe), "
                                   f"it raised {type(error).__name__}")]
        if not _same_as_first(implementation, case, shapes[label], closed):
            return [_state_finding(f"trace {trace} of the probe, on {label}, gave another "
                                   "program than the first trace of those shapes")]
    return []


def _perturbed(arg: np.ndarray) -> np.ndarray:
    """Another array of the same shape and dtype: the values moved by one place and negated."""
    flat = np.asarray(arg).ravel()
    moved = np.roll(flat, 1)
    if np.asarray(arg).dtype.kind in "iu":
        info = np.iinfo(np.asarray(arg).dtype)
        changed = np.clip(moved.astype(np.int64) * -1 + 1, info.min, info.max)
    else:
        changed = -moved.astype(np.float64) + 0.5
    return changed.astype(np.asarray(arg).dtype).reshape(np.shape(arg))


def input_impact_findings(run: Callable[[Case], Any], case: Case, result: Any, *,
                          matmul_precision: str) -> list[Finding]:
    """For each argument whose change changes the oracle's result beyond the tolerance, the
    implementation's result (``run(case)``) must change too.

    Arguments with structure (index tables, group sizes: the op's ``arg_dtypes``, and the
    integer arguments of an op with an ``inputs`` builder) are left as drawn.
    """
    op = case.operation
    # Index tables, group sizes, lengths: an op's fixed-dtype arguments and, for an op with
    # an ``inputs`` builder, its integer ones.
    structured = set(op.arg_dtypes) | ({i for i, a in enumerate(case.args)
                                        if np.asarray(a).dtype.kind in "iub"}
                                       if op.inputs else set())
    expected = properties.expected_output(case)
    findings = []
    for index, arg in enumerate(case.args):
        if index in structured or np.asarray(arg).size < 2:
            continue
        args = list(case.args)
        args[index] = _perturbed(arg)
        changed = case.with_args(tuple(args))
        expected_changed = properties.expected_output(changed)
        as_result = expected.astype(np.float64) if expected.dtype.kind == "f" else expected
        _, _, differs = properties.judge_value(changed, as_result, expected_changed,
                                               matmul_precision=matmul_precision)
        if not differs:
            continue  # the oracle says this change does not matter
        other = run(changed)
        if np.array_equal(np.asarray(other), np.asarray(result), equal_nan=True):
            findings.append(Finding("input-impact", (
                f"argument {index} changed and the oracle's result changed, but the "
                "implementation returned the same array: its result does not depend on "
                "that input")))
    return findings
