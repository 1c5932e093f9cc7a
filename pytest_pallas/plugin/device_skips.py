"""Tests that skipped because of the device count the plugin simulates, for the run's summary.

A suite written for one device skips itself under the plugin's 8 simulated
CPU devices ("requires 1 device, found 8") and the run exits 0: only the
header said why, and ``-q`` hides it. The summary counts those skips and
names the flag that runs them.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from typing import Any

# The device count a skip reason asks for: "requires 1 device, found 8" (JAX's tests),
# "needs 8 devices, JAX sees 1" (the plugin's devices marker), "need at least 2 devices".
_NEEDED = re.compile(
    r"\b(?:requires?|needs?)\s+(?:at\s+least\s+|exactly\s+)?(\d+)\s+(?:\w+\s+)?devices?\b",
    re.IGNORECASE)


def skip_reason(report: Any) -> str:
    """The reason text of a skipped test's report."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr or "")


def needed_device_counts(reasons: Iterable[str]) -> collections.Counter[int]:
    """How many skips asked for each device count."""
    counts: collections.Counter[int] = collections.Counter()
    for reason in reasons:
        found = _NEEDED.search(reason)
        if found:
            counts[int(found.group(1))] += 1
    return counts


def summary_lines(skipped_reports: Iterable[Any], simulated: int) -> list[str]:
    """One line per device count the skipped tests asked for, with the flag that runs them;
    none when no test skipped for the count of ``simulated`` devices."""
    counts = needed_device_counts(skip_reason(report) for report in skipped_reports)
    lines = []
    for needed, tests in sorted(counts.items()):
        if needed == simulated:
            continue
        lines.append(
            f"pallas: {tests} test(s) skipped because they need {needed} device(s) and the run "
            f"simulates {simulated} CPU devices; run them with --pallas-devices={needed}")
    return lines
