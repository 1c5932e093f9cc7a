"""What a run records beside its verdicts: the conformance report, pytest-xdist workers'
records merged on the controller, and the TPU compiler check's statistics.

A worker sends what it recorded with every test's report (in ``user_properties``), so a
worker that crashes loses only the verdict of the test it crashed in; the controller merges
them (``WorkerRecordsMerger``), writes ``--pallas-report`` and prints the summary's compile
line. Imports nothing heavy: the report's modules load only when a run recorded something.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from ..suite.membership import is_conformance_item
from .header import header_line
from .run_state import benchmark_run, run_state
from .session import PallasSession, session_of

# The keys, in a test report's user_properties, of what a worker recorded during the test.
WORKER_RECORDS = "pallas_conformance_records"
WORKER_COMPILES = "pallas_compile_stats"
WORKER_SECONDS = "pallas_conformance_seconds"  # how long a conformance test's call took

def is_controller(config: pytest.Config) -> bool:
    """Whether this process reports the run: one process alone, or pytest-xdist's controller."""
    return not hasattr(config, "workerinput")


# --- the TPU compiler check's statistics ---------------------------------------------------


def session_compiles(session: PallasSession) -> tuple[int, int, float]:
    """This session's TPU compiles, verdicts from the cache and compile seconds, in this
    process (none where no test used the check)."""
    if session.run.compiles_before is None:
        return (0, 0, 0.0)
    from ..checks.compile_check import STATS

    compiles, cached, seconds = session.run.compiles_before
    return (STATS.compiles - compiles, STATS.cached - cached, STATS.seconds - seconds)


def compile_summary(session: PallasSession, config: pytest.Config) -> str | None:
    """What the TPU compiler check cost in this session, its pytest-xdist workers' included."""
    if not session.options.compile_chips:
        return None
    compiles, cached, seconds = session_compiles(session)
    merger = config.pluginmanager.get_plugin("pallas-worker-records")
    for worker_compiles, worker_cached, worker_seconds in (
            merger.compiles.values() if merger is not None else ()):
        compiles, cached = compiles + worker_compiles, cached + worker_cached
        seconds += worker_seconds
    if not compiles and not cached:
        return None
    return (f"pallas: TPU compiler check: {compiles} kernel compiles in "
            f"{seconds:.1f} s, {cached} verdicts from the cache")


def write_terminal_summary(session: PallasSession, terminal: Any,
                           config: pytest.Config) -> None:
    """The plugin's lines at the end of the run: tests skipped for the simulated device count,
    the TPU compiler check's cost, and the conformance summary (``suite.summary``)."""
    simulated = session.simulated_devices()
    if simulated is not None:
        from .device_skips import summary_lines

        for line in summary_lines(terminal.stats.get("skipped", ()), simulated):
            terminal.write_line(line, yellow=True)
    compile_line = compile_summary(session, config)
    if compile_line:
        terminal.write_line(compile_line)
    if not session.recording or not session.recorder.ops:
        return
    from ..suite.summary import write_conformance_summary

    options = session.options
    report_line = None
    if options.report_path:
        created = session.run.report_directory_created
        report_line = f"report written to {options.report_path}" + (
            f" (directory {created} created)" if created else "")
    write_conformance_summary(
        terminal, session.recorder,
        # Not in pytest's header (a conformance_tests class in a run without Pallas flags).
        header=None if (options.session_opted_in or session.scope_all) else header_line(session),
        judge=options.judge, incomplete_reasons=session.incomplete_reasons,
        report_line=report_line)


# --- pytest-xdist's workers and their controller -------------------------------------------


def send_worker_records(item: pytest.Item, call: Any, report: pytest.TestReport) -> None:
    """On a worker: attach what this test recorded to its report, for the controller."""
    config = item.config
    if is_controller(config):
        return
    session = session_of(config)
    if call.when == "teardown" and session.recording:
        records = session.recorder.take()
        if records:
            report.user_properties.append((WORKER_RECORDS, records))
        compiles = session_compiles(session)
        if any(compiles):  # this worker's totals so far, for the controller's summary line
            report.user_properties.append(
                (WORKER_COMPILES, (config.workerinput.get("workerid"), compiles)))
    if call.when == "call" and is_conformance_item(item):
        report.user_properties.append((WORKER_SECONDS, report.duration))


class WorkerRecordsMerger:
    """On the pytest-xdist controller: merges what each worker recorded, report by report."""

    def __init__(self, session: PallasSession) -> None:
        self.session = session  # its recorder made when the first records arrive
        self.compiles: dict[str, tuple[int, int, float]] = {}  # per worker: its totals so far
        self.seconds: dict[str, float] = {}  # per conformance test: how long its call took

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # First, so that junitxml and other reporters never see the records as a property.
        kept = []
        for name, value in report.user_properties:
            if name == WORKER_RECORDS:
                self.session.recorder.merge(value)
            elif name == WORKER_COMPILES:
                worker, totals = value
                self.compiles[worker] = tuple(totals)
            elif name == WORKER_SECONDS:
                self.seconds[report.nodeid] = float(value)
            else:
                kept.append((name, value))
        report.user_properties[:] = kept

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.seconds:
            return  # no worker ran a conformance test
        from .conformance_order import store

        store(session.config, self.seconds)  # the next run's workers take the longest first


# --- the conformance report ----------------------------------------------------------------


def finish_conformance_report(session: pytest.Session, exitstatus: Any) -> None:
    """At the session's end, on the controller: say why the report is incomplete, if it is,
    and write ``--pallas-report``."""
    pallas = session_of(session.config)
    if not pallas.recording or not is_controller(session.config):
        return  # a worker's results went to the controller with each test's report
    pallas.recorder.order_ops(pallas.conformance_ops)
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        pallas.incomplete_reasons.append("the run was interrupted")
    elif exitstatus == pytest.ExitCode.INTERNAL_ERROR:
        pallas.incomplete_reasons.append("pytest stopped on an internal error")
    elif session.shouldstop:
        pallas.incomplete_reasons.append(f"the run stopped early: {session.shouldstop}")
    if pallas.options.report_path:
        write_report(session.config, complete=not pallas.incomplete_reasons)


def write_report(config: pytest.Config, *, complete: bool) -> None:
    """Write ``--pallas-report``: complete at the end, or as far as the run has got."""
    from ..suite.report import environment_facts, write_json_atomically

    pallas = session_of(config)
    backend = pallas.backend if pallas.options.session_opted_in else pallas.backend_if_made
    reasons = pallas.incomplete_reasons if not complete else []
    if not complete and not reasons:
        reasons = ["the run has not finished: it is still running, or was killed"]
    document = pallas.recorder.document(complete=complete, incomplete_reasons=reasons,
                                        environment=environment_facts(backend))
    document["seed"] = pallas.options.seed
    if pallas.options.several_chips:
        document["environment"]["chips"] = list(pallas.options.chips)  # a row per op and chip
    document["ops_selected"] = list(pallas.conformance_ops) + [
        op_name for op_name in pallas.recorder.ops if op_name not in pallas.conformance_ops]
    write_json_atomically(pallas.options.report_path, document)


# --- the session's start and end ------------------------------------------------------------


def session_start(session: pytest.Session) -> Generator[None, Any, Any]:
    """Around pytest-xdist's own session start (it launches the workers): a report that says
    the run has begun, and Hypothesis imported while the workers start."""
    pallas = session_of(session.config)
    if pallas.recording and pallas.options.report_path and is_controller(session.config):
        write_report(session.config, complete=False)
    result = yield
    if pallas.options.session_opted_in:
        from .workers import hands_tests_to_workers, import_hypothesis_while_workers_start

        if hands_tests_to_workers(session.config):
            import_hypothesis_while_workers_start()  # a no-op where a module imported it
    return result


def session_finish(session: pytest.Session, exitstatus: Any) -> None:
    """Before pytest-benchmark saves its results and before the terminal summary: an
    interrupted run's benchmarks withheld, the conformance report finished."""
    benchmarks = run_state(session.config).benchmarks
    if benchmarks is not None:
        benchmarks.withhold_interrupted_run(session.config, exitstatus)
    finish_conformance_report(session, exitstatus)


def benchmark_json(config: pytest.Config, output_json: dict[str, Any]) -> None:
    """pytest-benchmark's JSON says whether the run's Pallas benchmarks are complete."""
    benchmark_run(config).mark_completeness(output_json)


def terminal_summary(terminal: Any, config: pytest.Config) -> None:
    """The benchmarks' table, then the plugin's lines (``write_terminal_summary``)."""
    benchmarks = run_state(config).benchmarks
    if benchmarks is not None:
        benchmarks.terminal_summary(terminal)
    write_terminal_summary(session_of(config), terminal, config)
