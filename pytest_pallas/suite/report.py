"""What the conformance run found: per op and property, collected, summarised, written as JSON.

The JSON report is written atomically (a temporary file renamed over the
target), first with ``"complete": false`` when the run starts and again at
its end, so an interrupted run leaves valid JSON that says it is incomplete.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import tempfile
import time
from importlib import metadata
from typing import Any

from .grid_coverage import AxisRun, GridCoverage

SCHEMA_VERSION = 1
# The properties of the value test (test_value), which stops at its first failing example.
VALUE_PROPERTIES = ("shape_dtype", "finite", "value")


@dataclasses.dataclass
class PropertyResult:
    passed: int = 0
    failed: int = 0
    examples: int = 0
    worst_error: float = 0.0
    first_failure: str = ""
    # Where the examples ran: "plain", "tpu" (JAX's interpreters) or "TPU" (compiled),
    # comma-separated if several (a kernel the plain interpreter cannot run moves to tpu).
    interpreter: str = ""

    @property
    def verdict(self) -> str:
        if self.failed:
            return "fail"
        return "pass" if self.passed else "not run"

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "tests_passed": self.passed,
            "tests_failed": self.failed,
            "examples": self.examples,
            "worst_error_in_tolerances": None if math.isinf(self.worst_error) else self.worst_error,
            "first_failure": self.first_failure or None,
            "interpreter": self.interpreter or None,
        }

    def ran_in(self, interpreter: str) -> None:
        names = set(filter(None, self.interpreter.split(","))) | set(
            filter(None, interpreter.split(",")))
        self.interpreter = ",".join(sorted(names))


@dataclasses.dataclass
class CompileResult:
    """The TPU compiler's verdicts on one op's kernels for one chip (--pallas-compile)."""

    compiled: int = 0  # kernel verdicts (shapes) the compiler accepted
    rejected: int = 0
    vmem_bytes: int | None = None  # the most scoped VMEM the compiler reported asking for
    vmem_limit_bytes: int | None = None
    first_rejection: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "compiled": self.rejected == 0 and self.compiled > 0,
            "kernels_compiled": self.compiled,
            "kernels_rejected": self.rejected,
            "vmem_bytes": self.vmem_bytes,
            "vmem_limit_bytes": self.vmem_limit_bytes,
            "first_rejection": self.first_rejection or None,
        }


@dataclasses.dataclass
class JudgeResult:
    """What the judge's checks (``suite.judge``) found of one implementation (contract §8)."""

    programs: int = 0                 # traced programs read (one per signature)
    share_in_kernels: float = 1.0     # the least share of the op's work inside kernels seen
    least_kernels: int | None = None  # the fewest pallas_calls a program made
    host_callbacks: list[str] = dataclasses.field(default_factory=list)
    # One line each, the first of each check ("[judge: no-kernel] ...").
    findings: list[str] = dataclasses.field(default_factory=list)

    def add_findings(self, lines: Any) -> None:
        for line in lines:
            check = line.partition("]")[0]
            if not any(known.partition("]")[0] == check for known in self.findings):
                self.findings.append(line)

    def merge(self, values: dict[str, Any]) -> None:
        if values.get("programs"):
            self.share_in_kernels = min(self.share_in_kernels if self.programs else 1.0,
                                        values["share_in_kernels"])
            kernels = values.get("least_kernels")
            if kernels is not None:
                self.least_kernels = (kernels if self.least_kernels is None
                                      else min(self.least_kernels, kernels))
            self.programs += values["programs"]
        for callback in values.get("host_callbacks", ()):
            if callback not in self.host_callbacks:
                self.host_callbacks.append(callback)
        self.add_findings(values.get("findings", ()))

    @property
    def share_text(self) -> str:
        """The summary table's cell: "in kernels: 100%", with the count of findings."""
        if not self.programs and not self.findings:
            return "-"
        text = "-"
        if self.programs:
            share = 100.0 * self.share_in_kernels
            shown = f"{share:.0f}"
            if share < 100 and shown == "100":
                shown = "99"
            text = f"in kernels: {shown}%"
        if self.findings:
            text += f", {len(self.findings)} finding{'s' if len(self.findings) > 1 else ''}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "programs_read": self.programs,
            "share_of_flops_in_kernels": round(self.share_in_kernels, 6) if self.programs
            else None,
            "pallas_calls": self.least_kernels,
            "host_callbacks": list(self.host_callbacks),
            "findings": list(self.findings),
        }


@dataclasses.dataclass
class OpRecord:
    implementation: str
    restrictions: dict[str, Any]
    restrictions_text: str
    properties: dict[str, PropertyResult] = dataclasses.field(default_factory=dict)
    compile: dict[str, CompileResult] = dataclasses.field(default_factory=dict)
    grid_coverage: GridCoverage = dataclasses.field(default_factory=GridCoverage)
    judge: JudgeResult = dataclasses.field(default_factory=JudgeResult)

    @property
    def interpreters_text(self) -> str:
        """Where the breadth properties ran / where written ran: "plain/tpu", or one name."""
        def where(name: str) -> str:
            result = self.properties.get(name)
            return result.interpreter if result is not None and result.interpreter else "-"

        breadth, depth = where("value"), where("written")
        return breadth if depth in ("-", breadth) else f"{breadth}/{depth}"


class ConformanceRecorder:
    """Collects outcomes while the suite runs; one per pytest process."""

    def __init__(self) -> None:
        self.ops: dict[str, OpRecord] = {}
        self.started = time.time()
        # Each implementation's row, by the implementation
        # (``suite.implementation.Implementation``).
        self._rows: dict[Any, str] = {}

    def register(self, op_name: str, implementation: str, restrictions: dict[str, Any],
                 restrictions_text: str) -> None:
        self.ops.setdefault(op_name, OpRecord(implementation, restrictions, restrictions_text))

    def row(self, implementation: Any, chip: str | None = None) -> str:
        """The row of ``implementation`` (a ``suite.implementation.Implementation``): the op's name,
        or ``"op (label)"`` for a second implementation of the same op in one run (two
        ``conformance_tests`` classes); ``chip``: in a run of several chips, the chip its
        test stands in for, a row each (``"op [v6e]"``). Registered when the recorder first
        meets it, and again only after a ``take`` emptied the recorder (a pytest-xdist
        worker's, per test).
        """
        key = self._rows.get((implementation, chip))
        if key is None:
            key = implementation.operation.name
            known = self.ops.get(key)
            if known is not None and known.implementation != implementation.label:
                key = f"{key} ({implementation.label})"
            if chip is not None:
                key = f"{key} [{chip}]"
            self._rows[(implementation, chip)] = key
        if key not in self.ops:
            domain = implementation.domain
            self.register(key, implementation.label, domain.as_dict(), domain.describe())
        return key

    def order_ops(self, first: tuple[str, ...]) -> None:
        """The ops in ``first``'s order, then the others as they came: the summary and the
        report read the same whether one process ran the tests or pytest-xdist's workers,
        whose records arrive in the order the workers finish."""
        rank = {op_name: index for index, op_name in enumerate(first)}
        self.ops = dict(sorted(self.ops.items(), key=lambda item: rank.get(item[0], len(rank))))

    def property(self, op_name: str, name: str) -> PropertyResult:
        return self.ops[op_name].properties.setdefault(name, PropertyResult())

    def example(self, op_name: str, name: str, *, worst_error: float = 0.0) -> None:
        result = self.property(op_name, name)
        result.examples += 1
        if not math.isnan(worst_error):
            result.worst_error = max(result.worst_error, worst_error)

    def ran_in(self, op_name: str, names: tuple[str, ...], interpreter: str) -> None:
        """Record that properties ``names`` of ``op`` ran an example in ``interpreter``."""
        for name in names:
            self.property(op_name, name).ran_in(interpreter)

    def outcome(self, op_name: str, name: str, passed: bool, message: str = "") -> None:
        result = self.property(op_name, name)
        if passed:
            result.passed += 1
        else:
            result.failed += 1
            if not result.first_failure:
                result.first_failure = message.strip().splitlines()[0][:300] if message else ""

    def compiled(self, op_name: str, verdict: Any) -> None:
        """Record a ``checks.compile_check.CompileVerdict`` on one of ``op``'s kernels."""
        record = self.ops.get(op_name)
        if record is None:
            return  # the op's implementation was not resolved: nothing of it ran
        result = record.compile.setdefault(verdict.chip, CompileResult())
        if verdict.compiled:
            result.compiled += 1
        else:
            result.rejected += 1
            if not result.first_rejection:
                result.first_rejection = f"[{verdict.rule}] {verdict.message}"[:300]
        if verdict.vmem_bytes is not None:
            result.vmem_bytes = max(result.vmem_bytes or 0, verdict.vmem_bytes)
            result.vmem_limit_bytes = verdict.vmem_limit_bytes

    def judged(self, op_name: str, verdict: Any) -> None:
        """Record a ``checks.honesty.ProgramVerdict`` of one of ``op``'s traced programs."""
        record = self.ops.get(op_name)
        if record is None:
            return
        record.judge.merge({"programs": 1, "share_in_kernels": verdict.share_in_kernels,
                            "least_kernels": verdict.kernels,
                            "host_callbacks": verdict.host_callbacks})

    def findings(self, op_name: str, findings: Any) -> None:
        """Record the judge's ``checks.honesty.Finding``s on ``op``'s implementation."""
        record = self.ops.get(op_name)
        if record is not None:
            record.judge.add_findings(finding.line() for finding in findings)

    def grid_axes(self, op_name: str, runs: list[AxisRun]) -> None:
        """Record the grid axes one example of ``op`` ran (``suite.grid_coverage.axis_runs``)."""
        record = self.ops.get(op_name)
        if record is not None:
            record.grid_coverage.add(runs)

    # --- merging (pytest-xdist workers send their records to the controller) ---

    def to_dict(self) -> dict[str, Any]:
        return {
            op_name: {
                "implementation": record.implementation,
                "restrictions": record.restrictions,
                "restrictions_text": record.restrictions_text,
                "properties": {name: dataclasses.asdict(result)
                               for name, result in record.properties.items()},
                "compile": {chip: dataclasses.asdict(result)
                            for chip, result in record.compile.items()},
                "grid_coverage": record.grid_coverage.to_list(),
                "judge": dataclasses.asdict(record.judge),
            }
            for op_name, record in self.ops.items()
        }

    def take(self) -> dict[str, Any]:
        """What was recorded since the last ``take``, as ``to_dict``; the recorder starts empty."""
        data = self.to_dict()
        self.ops = {}
        return data

    def merge(self, data: dict[str, Any]) -> None:
        for op_name, record in data.items():
            self.register(op_name, record["implementation"], record["restrictions"],
                          record["restrictions_text"])
            for name, values in record["properties"].items():
                mine = self.property(op_name, name)
                mine.passed += values["passed"]
                mine.failed += values["failed"]
                mine.examples += values["examples"]
                mine.worst_error = max(mine.worst_error, values["worst_error"])
                mine.first_failure = mine.first_failure or values["first_failure"]
                mine.ran_in(values.get("interpreter", ""))
            for chip, values in record.get("compile", {}).items():
                mine = self.ops[op_name].compile.setdefault(chip, CompileResult())
                mine.compiled += values["compiled"]
                mine.rejected += values["rejected"]
                if values["vmem_bytes"] is not None:
                    mine.vmem_bytes = max(mine.vmem_bytes or 0, values["vmem_bytes"])
                    mine.vmem_limit_bytes = values["vmem_limit_bytes"]
                mine.first_rejection = mine.first_rejection or values["first_rejection"]
            self.ops[op_name].grid_coverage.merge(record.get("grid_coverage", ()))
            self.ops[op_name].judge.merge(record.get("judge", {}))

    # --- output -----------------------------------------------------------------

    def summary_lines(self) -> list[str]:
        compiles = any(record.compile for record in self.ops.values())
        judged = self.judged_any()
        header = ("op", "implementation", "properties passed", "failed", "examples",
                  "worst/tol", "interpreters", *(("compiled",) if compiles else ()),
                  *(("judge",) if judged else ()), "restrictions")
        rows = []
        for op_name, record in self.ops.items():
            results = record.properties.values()
            passed = sum(1 for r in results if r.verdict == "pass")
            failed = [name for name, r in record.properties.items() if r.verdict == "fail"]
            examples = max((r.examples for r in results), default=0)
            finite = [r.worst_error for r in results if not math.isinf(r.worst_error)]
            worst = "inf" if any(math.isinf(r.worst_error) for r in results) else (
                f"{max(finite):.2g}" if finite else "-")
            compiled = (
                (",".join(chip if result.rejected == 0 else f"{chip}:NO"
                          for chip, result in record.compile.items()) or "-",)
                if compiles else ())
            rows.append((op_name, record.implementation, str(passed),
                         ",".join(failed) if failed else "0", str(examples), worst,
                         record.interpreters_text, *compiled,
                         *((record.judge.share_text,) if judged else ()),
                         record.restrictions_text))
        widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(header, widths)).rstrip()]
        lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                  for row in rows]
        return lines

    def judged_any(self) -> bool:
        """Whether the judge read a program or found something of any implementation."""
        return any(record.judge.programs or record.judge.findings for record in self.ops.values())

    def finding_lines(self) -> list[str]:
        """One line per finding of the judge: "op (implementation): [judge: ...] ..."."""
        return [f"{op_name}: {line}" for op_name, record in self.ops.items()
                for line in record.judge.findings]

    def coverage_lines(self) -> list[str]:
        """One line per kernel grid axis of an op that no example ran with more than one step
        (or, where it walks a blocked array dimension, with a ragged last block).

        None for an op whose value property failed: it stopped at its first failing example,
        so the axes its later examples would have stepped say nothing of its inputs (the
        report's ``grid_coverage`` still lists them)."""
        return [line for op_name, record in self.ops.items()
                if not any(record.properties.get(name, PropertyResult()).verdict == "fail"
                           for name in VALUE_PROPERTIES)
                for line in record.grid_coverage.unexercised(op_name)]

    def document(self, *, complete: bool, environment: dict[str, Any],
                 incomplete_reasons: list[str] = ()) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "complete": complete,
            "incomplete_reasons": list(incomplete_reasons),
            "started": self.started,
            "duration_seconds": round(time.time() - self.started, 3),
            "environment": environment,
            "ops": {
                op_name: {
                    "implementation": record.implementation,
                    "restrictions": record.restrictions,
                    "properties": {name: result.as_dict()
                                   for name, result in record.properties.items()},
                    # --pallas-compile: per chip, whether every kernel traced compiled.
                    "compile": {chip: result.as_dict()
                                for chip, result in record.compile.items()},
                    # Per kernel grid axis: whether an example ran it with more than one
                    # step and with a ragged last block (grid_coverage.py).
                    "grid_coverage": record.grid_coverage.to_list(),
                    # --pallas-judge's checks (contract §8): the share of the op's FLOPs
                    # inside Pallas kernels, the host callbacks found and each finding.
                    "judge": record.judge.as_dict(),
                }
                for op_name, record in self.ops.items()
            },
        }


def environment_facts(backend: Any | None) -> dict[str, Any]:
    """Backend, jax/jaxlib/libtpu versions and device kind, for the report."""
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "libtpu": version("libtpu") or version("libtpu-nightly"),
        "pytest_pallas": version("pytest-pallas"),
    }
    if backend is not None:
        facts.update({
            "backend": backend.name,
            "chip": backend.chip,
            "device_kind": backend.device_kind,
            "device_count": backend.device_count,
        })
    return facts


def write_json_atomically(path: str, document: dict[str, Any]) -> None:
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=".pallas-report-", dir=directory)
    try:
        with os.fdopen(descriptor, "w") as handle:
            json.dump(document, handle, indent=2, sort_keys=True, allow_nan=False)
            handle.write("\n")
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
