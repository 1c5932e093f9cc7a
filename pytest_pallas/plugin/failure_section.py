"""The ``pallas`` section of a failed Pallas test's report: what the test's kernels say of
the failure (``KernelRun.failure_notes``), the seed, and the command that reruns the test
alone with the run's Pallas flags."""

from __future__ import annotations

import os
import re
import shlex
from typing import TYPE_CHECKING

import pytest

from ..suite.membership import is_conformance_item
from .chips import chip_of, test_id_without_chip

if TYPE_CHECKING:
    from .session import PallasSession

# Flags a rerun of one test sets itself, or leaves out.
_NOT_REPEATED = ("--pallas-seed", "--pallas-report", "--pallas-sweep-first")


def failure_section(session: PallasSession, item: pytest.Item, call: pytest.CallInfo,
                    report: pytest.TestReport) -> str:
    """The section: the kernels' notes, the interpret parameters they changed, the seed and
    the command that reruns the test."""
    command = reproduce_command(session, item.config, _rerunnable_nodeid(item),
                                chip=chip_of(item),
                                sweep_case=_failed_sweep_case(item, report))
    text = f"seed {session.options.seed}; reproduce with:\n  {command}"
    note, kept = session.kernel_run(item).failure_notes(
        call.excinfo.value if call.excinfo else None)
    text = f"{kept}\n{text}" if kept else text
    return f"{note}\n\n{text}" if note else text


def reproduce_command(session: PallasSession, config: pytest.Config, nodeid: str, *,
                      chip: str | None = None, sweep_case: int | None = None) -> str:
    """The command that reruns test ``nodeid`` alone with this run's seed and Pallas flags;
    ``chip``: the chip the test's copy ran as, in a run of several (the rerun stands in for
    it alone); ``sweep_case`` (1-based): the failed sweep case, which the rerun tries first."""
    if chip is not None:
        nodeid = test_id_without_chip(nodeid, chip)
    words = ["pytest", nodeid, f"--pallas-seed={session.options.seed}"]
    if chip is not None:
        words.append(f"--pallas-chip={chip}")
    args = list(session.invocation)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--pallas-"):
            continue
        name = arg.partition("=")[0]
        option = [arg]
        if "=" not in arg and not _is_switch(config, name) and args:
            option.append(args.pop(0))  # "--pallas-impl add=m:f": the value is the next word
        if name not in _NOT_REPEATED and not (chip is not None and name == "--pallas-chip"):
            words += option
    if sweep_case is not None:
        words.append(f"--pallas-sweep-first={sweep_case}")
    return " ".join(shlex.quote(word) for word in words)


def _is_switch(config: pytest.Config, name: str) -> bool:
    """Whether option ``name`` takes no value: its value is a bool (``options.add_options``
    declares every on/off flag with ``action="store_true"``)."""
    return isinstance(config.getoption(name, default=None), bool)


def _rerunnable_nodeid(item: pytest.Item) -> str:
    """``item``'s test id with its file as a path from where pytest was run: the packaged
    suite's files live in site-packages, outside the user's project and its rootdir."""
    _, separator, rest = item.nodeid.partition("::")
    path = os.path.relpath(item.path, item.config.invocation_params.dir)
    if path.startswith(os.pardir):
        path = str(item.path)
    return path + separator + rest


def _failed_sweep_case(item: pytest.Item, report: pytest.TestReport) -> int | None:
    """The number of the first sweep case a conformance property failed on, if any."""
    if not is_conformance_item(item):
        return None
    found = re.search(r"input \(sweep case (\d+)\)", report.longreprtext)
    return int(found.group(1)) if found else None
