"""One verdict per test of a ``--pallas-processes`` run, from every process's reports.

Process 0's reports are the test's (its captured output, its records for the conformance
report); a phase that failed in any process fails, its message made of each failing
process's, under ``process K:``. A test some process did not finish (it died, or hung past
``--pallas-timeout``) fails with the controller's reason.
"""

from __future__ import annotations

import pytest

_PHASES = ("setup", "call", "teardown")


def merged_reports(item: pytest.Item, per_process: list[list[pytest.TestReport]],
                   problem: str | None) -> list[pytest.TestReport]:
    """The reports pytest shows for ``item``: one per phase that some process reached."""
    failures = [f"process {number}: {_message(report)}"
                for number, reports in enumerate(per_process)
                for report in reports if report.failed]
    by_phase = [{report.when: report for report in reports} for reports in per_process]
    merged = []
    for when in _PHASES:
        reports = dict((number, phases[when]) for number, phases in enumerate(by_phase)
                       if when in phases)
        if not reports:
            continue
        base = reports.get(0) or next(iter(reports.values()))
        failed = [(number, report) for number, report in reports.items() if report.failed]
        if failed:
            for number, report in failed:
                if number != 0:
                    base.sections.extend(
                        (f"{title} (process {number})", text) for title, text in report.sections)
            base.longrepr = "\n\n".join(
                f"process {number}: {_message(report)}" for number, report in failed)
            base.outcome = "failed"
        merged.append(base)
    if problem is not None:
        # The phases every process finished stay; the rest is the one failure that says why.
        merged = [report for report in merged if report.when == "setup" and report.passed]
        merged.append(_report(item, "call", "\n\n".join(failures + [problem])))
    return merged


def _message(report: pytest.TestReport) -> str:
    """The failure's one line (pytest's short summary shows it), then its whole text."""
    text = report.longreprtext.strip()
    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
    if crash and text.splitlines()[-1:] != [crash] and text not in crash:
        return f"{crash.splitlines()[0]}\n{text}"
    if crash:
        return crash
    return text or report.outcome


def _report(item: pytest.Item, when: str, text: str) -> pytest.TestReport:
    return pytest.TestReport(item.nodeid, item.location, {}, "failed", text, when, (), 0.0)
