"""A run's Pallas benchmarks (``BenchmarkRun``): the results ``PallasBenchmark`` records,
the terminal table of each kernel's time, its ratio to XLA and its fraction of the
roofline, and what an interrupted run withholds.

This module imports no JAX: the plugin makes a ``BenchmarkRun`` when a run has a
``pallas_benchmark`` test, and reads it at the run's end.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from .._compat import jax_internals
from .._compat.benchmark_internals import benchmark_session

# XLA's CPU code on one thread, as the interpreted kernels mostly run: otherwise the
# kernel/XLA ratio that the gate judges would change with the runner's core count.
SINGLE_THREADED_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def request_single_threaded_xla(run: BenchmarkRun, environ=os.environ) -> str:
    """Make XLA's CPU code single-threaded for this run's benchmarks, if still possible.

    XLA reads ``XLA_FLAGS`` when JAX creates its CPU client, so this must run before
    the first JAX computation; the plugin calls it at collection when a test uses
    ``pallas_benchmark``, and at configure time under ``--benchmark-only`` when a
    Pallas flag has it create the backend then.
    A user's XLA_FLAGS that sets ``intra_op_parallelism_threads`` is left alone.
    Returns (and records in ``run``, for ``extra_info``) how XLA runs.
    """
    if run.xla_threads is not None:
        return run.xla_threads
    flags = environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism" in flags:
        state = "as XLA_FLAGS sets"
    elif "jax" in sys.modules and jax_internals.backends_are_initialized():
        state = "multi-threaded"
    else:
        environ["XLA_FLAGS"] = f"{flags} {SINGLE_THREADED_XLA}".strip()
        state = "single-threaded"
    run.xla_threads = state
    return state


def format_seconds(seconds: float) -> str:
    """``0.00123`` -> ``"1.23 ms"``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_versus_xla(speedup: float | None) -> str:
    """``2.0`` -> ``"2.00x faster"``, ``0.25`` -> ``"4.00x slower"``."""
    if speedup is None:
        return "-"
    if speedup >= 1:
        return f"{speedup:.2f}x faster"
    return f"{1 / speedup:.3g}x slower"


def _bar(fraction: float, width: int = 10) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "#" * filled + "." * (width - filled)


def format_roofline(fraction: float | None, bound: str | None) -> str:
    if fraction is None:
        return "-"
    percent = f"{fraction:.1%}" if fraction >= 0.001 else f"{fraction:.1e}"
    return f"{_bar(fraction)} {percent} ({bound})"


def summary_lines(records: list[dict[str, Any]]) -> list[str]:
    """The rows of the table printed at the end of a benchmark run."""
    # lazy: the estimate imports JAX; the table loads before JAX starts
    from .benchmark_estimate import estimate_cell, estimate_columns

    estimated = estimate_columns(records)  # chips with the TPU compiler's estimate
    header = ("kernel", "median", *(f"{chip} est." for chip in estimated), "vs XLA",
              "fraction of roofline")
    rows = [(
        record["name"],
        format_seconds(record["median"]),
        *(estimate_cell(record, chip, format_seconds) for chip in estimated),
        format_versus_xla(record.get("speedup_vs_xla")),
        format_roofline(record.get("fraction_of_roofline"), record.get("roofline_bound")),
    ) for record in records]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    if any(not record.get("roofline_meaningful") for record in records):
        chips = sorted({str(record.get("chip")) for record in records})
        lines.append(
            f"interpreted on the CPU: the roofline is TPU {', '.join(chips)}'s and 'vs XLA' "
            "compares with XLA's native CPU code; both mean something only with --pallas-tpu. "
            "Regressions are judged by the ratio to XLA (python -m pytest_pallas.benchmark_gate)."
        )
    if estimated:
        lines.append("'<chip> est.': the TPU compiler's schedule of the kernel for that chip as "
                     "time (libtpu, no TPU; docs/estimate.md); the gate judges it without noise.")
    if any(record.get("xla_threads") == "multi-threaded" for record in records):
        lines.append(
            "XLA ran multi-threaded: JAX had started before the benchmarks were collected, so "
            "the ratio to XLA depends on the core count; run them with --benchmark-only, or set "
            f"XLA_FLAGS='{SINGLE_THREADED_XLA}'.")
    return lines


class BenchmarkRun:
    """One run's Pallas benchmarks: a record per benchmark, how XLA's CPU code ran, and why
    the run is incomplete (cut short by Ctrl-C, or a stuck test whose process was replaced),
    if it is."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        # How XLA's CPU code runs in the benchmarks: "single-threaded", "as XLA_FLAGS sets"
        # or "multi-threaded" (JAX's CPU client existed before the benchmarks were known);
        # None until asked (bench.fixture.request_single_threaded_xla).
        self.xla_threads: str | None = None
        self.interrupted: str | None = None

    def record(self, name: str, median: float, info: dict[str, Any]) -> None:
        self.records.append({"name": name, "median": median, **info})

    def withhold_interrupted_run(self, config: pytest.Config, exitstatus: int) -> None:
        """Keep an interrupted run's benchmarks out of pytest-benchmark's storage
        (``withhold_partial_run``), where it recorded any."""
        if exitstatus == pytest.ExitCode.INTERRUPTED and self.records:
            self.withhold_partial_run(config, "the run was interrupted")

    def withhold_partial_run(self, config: pytest.Config, why: str) -> None:
        """Keep a run that has only part of its benchmarks out of pytest-benchmark's storage.

        ``--benchmark-autosave``/``--benchmark-save`` would store the partial run as the
        newest one, and ``--benchmark-compare`` (with no run id) then takes it as the
        baseline. An explicit ``--benchmark-json`` file is still written, marked
        ``"pallas": {"complete": false}``, which the gate refuses. Runs before
        pytest-benchmark saves (the plugin's sessionfinish wrapper is tryfirst).
        """
        # pytest-benchmark's session object: its save/autosave options, read when it saves.
        session = benchmark_session(config)
        saving = session is not None and (
            getattr(session, "save", None) or getattr(session, "autosave", None))
        if not saving:
            self.interrupted = why
            return
        session.save, session.autosave = None, False
        self.interrupted = (
            f"{why}: its benchmarks were NOT saved to the benchmark storage, where "
            "--benchmark-compare would take a partial run for the newest baseline; rerun to save")

    def mark_completeness(self, output_json: dict[str, Any]) -> None:
        """Say in pytest-benchmark's JSON whether the run finished (``benchmark_gate`` checks)."""
        output_json["pallas"] = {"complete": self.interrupted is None}

    def terminal_summary(self, terminalreporter: Any) -> None:
        """Print the table of this run's Pallas benchmarks, if any ran."""
        if not self.records:
            return
        terminalreporter.write_sep("=", "pallas benchmarks")
        for line in summary_lines(self.records):
            terminalreporter.write_line(line)
        if self.interrupted is not None:
            terminalreporter.write_line(f"pallas: {self.interrupted}.", yellow=True)
