"""Every use of a pytest-benchmark internal, in one place, guarded;
tests/test_benchmark_compat.py checks each against the installed pytest-benchmark.

* A ``BenchmarkFixture`` keeps its clock in ``_timer``: ``pallas_benchmark``
  reads it to time a kernel's first call with the same clock, and swaps in
  ``time.process_time`` for interpreted kernels when the user chose no timer
  (``--benchmark-timer`` sets it for the whole session, not for one fixture).
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
_SESSION = "_benchmarksession"


def timer_of(benchmark: Any) -> Callable[[], float]:
    """The clock ``benchmark`` times rounds with (``time.perf_counter`` if it cannot be read)."""
    timer = getattr(benchmark, _TIMER, None)
    return timer if callable(timer) else time.perf_counter


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
