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
from typing import Any

SCHEMA_VERSION = 1


@dataclasses.dataclass
class PropertyResult:
    passed: int = 0
    failed: int = 0
    examples: int = 0
    worst_error: float = 0.0
    first_failure: str = ""

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
        }


@dataclasses.dataclass
class OpRecord:
    implementation: str
    restrictions: dict[str, Any]
    restrictions_text: str
    properties: dict[str, PropertyResult] = dataclasses.field(default_factory=dict)


class ConformanceRecorder:
    """Collects outcomes while the suite runs; one per pytest process."""

    def __init__(self) -> None:
        self.ops: dict[str, OpRecord] = {}
        self.started = time.time()

    def register(self, op: str, implementation: str, restrictions: dict[str, Any],
                 restrictions_text: str) -> None:
        self.ops.setdefault(op, OpRecord(implementation, restrictions, restrictions_text))

    def property(self, op: str, name: str) -> PropertyResult:
        return self.ops[op].properties.setdefault(name, PropertyResult())

    def example(self, op: str, name: str, *, worst_error: float = 0.0) -> None:
        result = self.property(op, name)
        result.examples += 1
        if not math.isnan(worst_error):
            result.worst_error = max(result.worst_error, worst_error)

    def outcome(self, op: str, name: str, passed: bool, message: str = "") -> None:
        result = self.property(op, name)
        if passed:
            result.passed += 1
        else:
            result.failed += 1
            if not result.first_failure:
                result.first_failure = message.strip().splitlines()[0][:300] if message else ""

    # --- merging (pytest-xdist workers send their records to the controller) ---

    def to_dict(self) -> dict[str, Any]:
        return {
            op: {
                "implementation": record.implementation,
                "restrictions": record.restrictions,
                "restrictions_text": record.restrictions_text,
                "properties": {name: dataclasses.asdict(result)
                               for name, result in record.properties.items()},
            }
            for op, record in self.ops.items()
        }

    def take(self) -> dict[str, Any]:
        """What was recorded since the last ``take``, as ``to_dict``; the recorder starts empty."""
        data = self.to_dict()
        self.ops = {}
        return data

    def merge(self, data: dict[str, Any]) -> None:
        for op, record in data.items():
            self.register(op, record["implementation"], record["restrictions"],
                          record["restrictions_text"])
            for name, values in record["properties"].items():
                mine = self.property(op, name)
                mine.passed += values["passed"]
                mine.failed += values["failed"]
                mine.examples += values["examples"]
                mine.worst_error = max(mine.worst_error, values["worst_error"])
                mine.first_failure = mine.first_failure or values["first_failure"]

    # --- output -----------------------------------------------------------------

    def summary_lines(self) -> list[str]:
        header = ("op", "implementation", "passed", "failed", "examples", "worst/tol",
                  "restrictions")
        rows = []
        for op, record in self.ops.items():
            results = record.properties.values()
            passed = sum(1 for r in results if r.verdict == "pass")
            failed = [name for name, r in record.properties.items() if r.verdict == "fail"]
            examples = max((r.examples for r in results), default=0)
            finite = [r.worst_error for r in results if not math.isinf(r.worst_error)]
            worst = "inf" if any(math.isinf(r.worst_error) for r in results) else (
                f"{max(finite):.2g}" if finite else "-")
            rows.append((op, record.implementation, str(passed),
                         ",".join(failed) if failed else "0", str(examples), worst,
                         record.restrictions_text))
        widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(header, widths)).rstrip()]
        lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                  for row in rows]
        return lines

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
                op: {
                    "implementation": record.implementation,
                    "restrictions": record.restrictions,
                    "properties": {name: result.as_dict()
                                   for name, result in record.properties.items()},
                }
                for op, record in self.ops.items()
            },
        }


def environment_facts(backend: Any | None) -> dict[str, Any]:
    """Backend, jax/jaxlib/libtpu versions and device kind, for the report."""
    from importlib import metadata

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
