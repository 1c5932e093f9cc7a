"""What a run has done so far that later hooks read, in one place.

One object per pytest run, kept in pytest's config: some of it is decided before pytest
configures (pytest-xdist's worker count, in ``pytest_cmdline_main``), before the session
exists; the session holds the same object (``PallasSession.run``). The closing hooks read it
to know what the run used, instead of asking which modules were ever imported.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest


@dataclasses.dataclass
class RunState:
    # pytest-xdist's workers the plugin chose for a conformance run (the header says so).
    workers_chosen: int | None = None
    # How an accelerator run's workers split the host's devices (the header says so).
    device_split: str | None = None
    # The directory --pallas-report created because it did not exist (the summary says so).
    report_directory_created: str | None = None
    # Where pytest-xdist's workers hand a stuck test's failure to the controller.
    stuck_tests_folder: str | None = None
    # In one process: what replaces the process when a test is stuck (plugin.stuck_tests).
    stuck_test_replacement: Any = None
    # The run's pallas_benchmark results (bench.table.BenchmarkRun), once one ran.
    benchmarks: Any = None
    # Ops a conftest or plugin registered (ops.registry), to unregister at the end.
    operations_registered: bool = False
    # A conformance test ran: the suite's per-session state is forgotten at the end.
    conformance_ran: bool = False
    # The TPU compiler check's totals when this run first used it (compiles, cached,
    # seconds): an in-process run shares its counters with the run around it.
    compiles_before: tuple[int, int, float] | None = None


_KEY = pytest.StashKey[RunState]()


def run_state(config: pytest.Config) -> RunState:
    """The run's state, made on first use."""
    state = config.stash.get(_KEY, None)
    if state is None:
        state = config.stash[_KEY] = RunState()
    return state


def benchmark_run(config: pytest.Config) -> Any:
    """The run's ``bench.table.BenchmarkRun``, made when a run first has a benchmark."""
    state = run_state(config)
    if state.benchmarks is None:
        from ..bench.table import BenchmarkRun  # no JAX: a run of benchmarks is the edge

        state.benchmarks = BenchmarkRun()
    return state.benchmarks
