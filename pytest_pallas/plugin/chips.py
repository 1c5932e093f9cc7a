"""A run of several TPU generations (``--pallas-chip=v5e,v6e,7x`` or ``all``): each test once
per chip, its id suffixed as pytest parametrizes it (``test_x[v6e]``), and a summary per chip.

The matrix of generations a kernel team's CI runs, in one run: every Pallas test is copied
once per chip at collection, and each copy's kernels run standing in for its chip.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest

from .._compat.pytest_internals import item_per_parameter

CHIP_KEY = pytest.StashKey[str]()


def each_test_per_chip(items: list[pytest.Item], chips: tuple[str, ...],
                       uses_pallas: Callable[[pytest.Item], bool]) -> list[pytest.Item]:
    """``items`` with every Pallas test once per chip, the copies of a test side by side (a
    test that is not a test function, a doctest say, runs once, as the first chip)."""
    per_chip = []
    for item in items:
        # A copy already (pytest may report a collector's children again): as it is.
        copies = (item_per_parameter(item, chips)
                  if chip_of(item) is None and uses_pallas(item) else None)
        if copies is None:
            per_chip.append(item)
            continue
        for chip, copy in zip(chips, copies):
            copy.stash[CHIP_KEY] = chip
            per_chip.append(copy)
    return per_chip


def chip_of(item: pytest.Item) -> str | None:
    """The chip a copy of a test runs as; None for a test of a one-chip run."""
    return item.stash.get(CHIP_KEY, None)


def chip_of_test_id(nodeid: str, chips: tuple[str, ...]) -> str | None:
    """The chip a test id's suffix names (``test_x[3-v6e]`` -> ``"v6e"``): how a report
    that crossed from a pytest-xdist worker, which has no item, is told apart."""
    if not nodeid.endswith("]"):
        return None
    last = nodeid[nodeid.rfind("[") + 1:-1].rpartition("-")[2]
    return last if last in chips else None


def test_id_without_chip(nodeid: str, chip: str) -> str:
    """``test_x[3-v6e]`` -> ``test_x[3]``, ``test_x[v6e]`` -> ``test_x``: the id pytest
    collects, to rerun one chip's copy with ``--pallas-chip`` naming that chip."""
    head, _, params = nodeid[:-1].rpartition("[")
    rest = params[:-len(chip)].rstrip("-")
    return f"{head}[{rest}]" if rest else head


class ChipTally:
    """The outcome of every test, per chip, for the summary at the run's end (the
    controller's, under pytest-xdist: reports carry their test's id)."""

    def __init__(self, chips: tuple[str, ...]) -> None:
        self.chips = chips
        self.outcomes: dict[str, collections.Counter] = {chip: collections.Counter()
                                                         for chip in chips}

    @pytest.hookimpl(optionalhook=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        chip = chip_of_test_id(report.nodeid, self.chips)
        if chip is None:
            return
        outcome = _outcome(report)
        if outcome is not None:
            self.outcomes[chip][outcome] += 1

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not any(self.outcomes.values()):
            return  # nothing ran (--collect-only, say)
        terminalreporter.write_sep("-", "pallas: per chip")
        for line in self.summary_lines():
            terminalreporter.write_line(line)

    def summary_lines(self) -> list[str]:
        """One line per chip: ``v6e: 12 passed, 1 failed, 3 skipped``."""
        lines = []
        for chip, counts in self.outcomes.items():
            text = ", ".join(f"{counts[name]} {name}" for name in
                             ("passed", "failed", "skipped", "xfailed", "xpassed", "error")
                             if counts[name]) or "no test"
            lines.append(f"{chip}: {text}")
        return lines


def _outcome(report: pytest.TestReport) -> str | None:
    """The outcome pytest's summary counts for this phase's report, or None (a passed setup
    or teardown)."""
    if hasattr(report, "wasxfail"):
        if report.when == "call":
            return "xfailed" if report.skipped else "xpassed"
        return None
    if report.when == "call":
        return report.outcome
    if report.failed:
        return "error"
    if report.skipped:
        return "skipped"  # a skip at setup (a marker, the test's own gate in a fixture)
    return None
