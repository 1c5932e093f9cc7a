"""pytest plugin of ``benchmarks/worker_seconds.py``: each process's CPU seconds, written to
``$PALLAS_WORKER_SECONDS_DIR/<worker>.json`` when it ends (a process without the variable
writes nothing). ``$PALLAS_WORKER_SECONDS_ONLY`` (test names, one per line) deselects every
other test: one worker's share, run alone."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

# Set by benchmarks/worker_seconds.py: where each process writes its record, and the tests
# to keep (the others deselected).
DIRECTORY_VARIABLE = "PALLAS_WORKER_SECONDS_DIR"
ONLY_VARIABLE = "PALLAS_WORKER_SECONDS_ONLY"

_tests: list[tuple[str, float]] = []
_collected: list[float] = []


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = _cpu_seconds()
    yield
    _tests.append((item.name, round(_cpu_seconds() - started, 3)))


def pytest_collection_modifyitems(config, items):
    only = os.environ.get(ONLY_VARIABLE)
    if not only:
        return
    wanted = set(only.splitlines())
    dropped = [item for item in items if item.name not in wanted]
    items[:] = [item for item in items if item.name in wanted]
    config.hook.pytest_deselected(items=dropped)


def pytest_collection_finish(session):
    _collected.append(_cpu_seconds())


def pytest_unconfigure(config):
    directory = os.environ.get(DIRECTORY_VARIABLE)
    if not directory:
        return
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    record = {"name": name, "cpu": _cpu_seconds(), "tests": _tests,
              "collected": _collected[0] if _collected else _cpu_seconds()}
    pathlib.Path(directory, f"{name}.json").write_text(json.dumps(record))
