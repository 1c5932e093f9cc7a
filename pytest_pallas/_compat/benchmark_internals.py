"""Every use of a pytest-benchmark internal, in one place, guarded;
tests/test_benchmark_compat.py checks each against the installed pytest-benchmark.

* A ``BenchmarkFixture`` keeps its clock in ``_timer``: ``pallas_benchmark``
  reads it to time a kernel's first call with the same clock, and swaps in
  ``time.process_time`` for interpreted kernels when the user chose no timer
  (``--benchmark-timer`` sets it for the whole session, not for one fixture).
* A ``BenchmarkFixture``'s round budget is ``_max_time`` and ``_min_rounds``: a kernel
  too slow for pytest-benchmark's calibration is timed over the rounds that budget allows.
* The plugin's session object is ``config._benchmarksession``: its ``save`` and
  ``autosave`` are cleared when a run is interrupted, so that a partial run never
  becomes the newest saved baseline.

A pytest-benchmark that moved either one leaves that feature off: the default
clock, or an interrupted run saved as pytest-benchmark would save it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

_TIMER = "_timer"
_MAX_TIME = "_max_time"
_MIN_ROUNDS = "_min_rounds"
_SESSION = "_benchmarksession"


def timer_of(benchmark: Any) -> Callable[[], float]:
    """The clock ``benchmark`` times rounds with (``time.perf_counter`` if it cannot be read)."""
    timer = getattr(benchmark, _TIMER, None)
    return timer if callable(timer) else time.perf_counter


def round_budget(benchmark: Any) -> tuple[float, int]:
    """``(max_time, min_rounds)`` of ``benchmark`` (``--benchmark-max-time`` and
    ``--benchmark-min-rounds``), pytest-benchmark's defaults (1.0 s, 5) if they cannot be
    read."""
    return (float(getattr(benchmark, _MAX_TIME, 1.0)), int(getattr(benchmark, _MIN_ROUNDS, 5)))


def use_timer(benchmark: Any, timer: Callable[[], float]) -> bool:
    """Make ``benchmark`` time its rounds with ``timer``; False if this pytest-benchmark
    keeps its clock elsewhere (the fixture's own clock is then left as it is)."""
    if not callable(getattr(benchmark, _TIMER, None)):
        return False
    setattr(benchmark, _TIMER, timer)
    return True


def benchmark_session(config: Any) -> Any | None:
    """pytest-benchmark's session object for ``config``, or None."""
    return getattr(config, _SESSION, None)
