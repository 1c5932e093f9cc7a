"""The conformance run's end-of-run summary in pytest's terminal: the recorder's table, its
legends, the judge's findings, the axes not exercised and why the report is incomplete."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .report import ConformanceRecorder

SUMMARY_LEGEND = (
    "properties passed/failed: of shape_dtype, finite, value, written, deterministic and vmap; "
    "pytest counts tests (test_value, test_written_and_deterministic, test_vmap per op)",
    "interpreters: where value, deterministic and vmap ran / where written ran (plain: "
    "interpret=True, fast; tpu: JAX's TPU interpreter, NaN-poisoned memory; gpu: JAX's GPU "
    "interpreter, for Mosaic GPU kernels; TPU, GPU: compiled)",
    "worst/tol: the worst error seen, in units of the tolerance (<= 1 passes)",
)
JUDGE_LEGEND = ("judge: the least share of the op's FLOPs that ran inside Pallas kernels, and "
                "the judge's findings (contract §8)")


def write_conformance_summary(terminal: Any, recorder: ConformanceRecorder, *,
                              header: str | None, judge: bool,
                              incomplete_reasons: Sequence[str],
                              report_line: str | None) -> None:
    """Write the summary with pytest's ``terminal`` reporter. ``header``: the run's pallas
    header where pytest's own header lacks it; ``judge``: whether --pallas-judge fails the
    findings; ``report_line``: where the JSON report was written."""
    terminal.write_sep("=", "pallas conformance")
    if header is not None:
        terminal.write_line(header)
    for line in (*recorder.summary_lines(), *SUMMARY_LEGEND):
        terminal.write_line(line)
    if recorder.judged_any():
        terminal.write_line(JUDGE_LEGEND + (
            "" if judge else "; reported only: --pallas-judge fails them"))
        for line in recorder.finding_lines():
            terminal.write_line(line, yellow=not judge, red=judge)
    for line in recorder.coverage_lines():
        terminal.write_line(f"not exercised: {line}", yellow=True)
    for reason in incomplete_reasons:
        terminal.write_line(f"incomplete: {reason}", yellow=True)
    if report_line is not None:
        terminal.write_line(report_line)
