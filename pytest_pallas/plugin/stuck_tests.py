"""A Pallas test past ``--pallas-timeout`` that its process cannot stop (its thread inside
XLA, which never returns to Python): its failure is kept where the run's results are, its
process ends, and the run goes on with the next test (``supervision.timeout`` decides when).

* Under pytest-xdist, the worker writes the test's failed report into a folder its
  controller made, and ends. The controller puts that report in place of xdist's "worker
  crashed" one (``pytest_handlecrashitem``) and xdist starts a new worker for the tests
  left; such an end does not count against ``--max-worker-restart`` unless the user set it.
* In one process, the process is replaced (``os.execve``: the same process id, terminal
  and exit status) by a fresh pytest of the same command line that runs only the tests
  after the stuck one. It is handed, in a file, the reports of the tests before it and the
  stuck test's failure (pytest's own serialisation), the conformance records and the seed,
  and gives the reports to the JUnit XML, ``--pallas-report`` and the summary before its
  first test. Only a process whose program is this pytest is replaced: a pytest run inside
  another program (``pytest.main`` in a script, an IDE's runner) keeps the stuck test.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import types
from typing import Any

import pytest

from .._compat.pytest_internals import captured_output, count_in_terminal_summary
from ..suite.membership import is_conformance_item
from .failure_section import failure_section
from .options import RESUME_ENV
from .run_records import WORKER_COMPILES, WORKER_RECORDS, session_compiles
from .run_state import benchmark_run, run_state
from .session import session_of

# Where a pytest-xdist worker writes a stuck test's report (config.workerinput).
FOLDER_KEY = "pallas_stuck_tests"


def end_stuck_test(item: pytest.Item, text: str, seconds: float) -> None:
    """From the watchdog's thread: fail ``item`` with ``text`` (its call ran ``seconds``) and
    end this process so that the run goes on. Returns when this run has no way to go on."""
    config = item.config
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        folder = workerinput.get(FOLDER_KEY)
        if folder:
            _hand_to_controller(item, text, seconds, folder, workerinput["workerid"])
        return  # a --pallas-processes worker: its controller ends it
    replacement = run_state(config).stuck_test_replacement
    if replacement is None:
        why = ("this pytest runs inside another program (pytest.main), whose process the "
               "plugin does not replace; run pytest from a shell, or with -n, to have the run "
               "go on without it")
    else:
        why = "its process could not be replaced"
        try:
            replacement.replace_process(item, text, seconds)  # does not return
        except Exception as error:  # noqa: BLE001 (said below; the test runs on)
            why = f"replacing its process failed ({error!r})"
    sys.stderr.write(f"\npallas: {item.nodeid} ran past --pallas-timeout and cannot be stopped "
                     f"in its process; it runs to its end: {why}.\n")


def _failed_report(item: pytest.Item, text: str, seconds: float) -> pytest.TestReport:
    """The stuck test's failed call, with what it printed and the plugin's section."""
    sections = [(f"Captured {name} call", value)
                for name, value in zip(("stdout", "stderr"), captured_output(item.config))
                if value]
    report = pytest.TestReport(
        nodeid=item.nodeid, location=item.location, keywords=dict.fromkeys(item.keywords, 1),
        outcome="failed", longrepr=text, when="call", sections=sections, duration=seconds,
        user_properties=list(item.user_properties))
    try:  # the seed and the command that reruns it
        call = types.SimpleNamespace(when="call", excinfo=None)
        report.sections.append(("pallas", failure_section(session_of(item.config), item, call,
                                                          report)))
    except Exception:  # noqa: BLE001 (read while the test's thread is stopped mid-way)
        pass
    return report


def _with_records(item: pytest.Item, report: pytest.TestReport, process: str) -> bool:
    """Record a stuck conformance test's property as failed, and attach this process's
    conformance records and compile totals to ``report``, as a pytest-xdist worker does with
    each test's (``run_records.send_worker_records``). Whether the report lacks the stuck
    test's property (a conformance test whose property could not be recorded)."""
    session = session_of(item.config)
    unrecorded = is_conformance_item(item)
    try:
        if session.recording:
            if unrecorded and run_state(item.config).conformance_ran:
                from ..suite.harness import record_stuck_property  # a conformance test ran

                unrecorded = not record_stuck_property(str(report.longrepr).splitlines()[0])
            records = session.recorder.take()
            if records:
                report.user_properties.append((WORKER_RECORDS, records))
        compiles = session_compiles(session)
        if any(compiles):
            report.user_properties.append((WORKER_COMPILES, (process, compiles)))
    except Exception:  # noqa: BLE001 (a recorder caught mid-way: its records are lost)
        unrecorded = is_conformance_item(item)
    return unrecorded


def _serialised(config: pytest.Config, report: pytest.TestReport) -> dict:
    return config.hook.pytest_report_to_serializable(config=config, report=report)


# --- under pytest-xdist ---------------------------------------------------------------------


def _hand_to_controller(item: pytest.Item, text: str, seconds: float, folder: str,
                        worker: str) -> None:
    report = _failed_report(item, text, seconds)
    unrecorded = _with_records(item, report, worker)
    _write_json(os.path.join(folder, f"{worker}.json"), {
        "nodeid": item.nodeid, "unrecorded": unrecorded,
        "report": _serialised(item.config, report)})
    os._exit(1)  # xdist's controller starts a new worker for the tests left


def folder_for_workers(config: pytest.Config) -> str:
    """On pytest-xdist's controller: the folder its workers write stuck tests' reports to."""
    state = run_state(config)
    if state.stuck_tests_folder is None:
        state.stuck_tests_folder = tempfile.mkdtemp(prefix="pytest-pallas-stuck-")
    return state.stuck_tests_folder


def remove_folder(config: pytest.Config) -> None:
    folder = run_state(config).stuck_tests_folder
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def ended_for_a_stuck_test(config: pytest.Config, worker: str) -> bool:
    """Whether pytest-xdist's worker ``worker`` ended itself for a stuck test."""
    folder = run_state(config).stuck_tests_folder
    return folder is not None and os.path.exists(os.path.join(folder, f"{worker}.json"))


def take_stuck_test(config: pytest.Config, worker: str, crashitem: str,
                    report: pytest.TestReport) -> bool:
    """On pytest-xdist's controller, for the test a worker died in: if the worker ended
    itself because that test was stuck, turn xdist's "worker crashed" ``report`` into the
    test's failure, say so, and return True."""
    folder = run_state(config).stuck_tests_folder
    path = os.path.join(folder, f"{worker}.json") if folder is not None else ""
    if not path or not os.path.exists(path):
        return False
    with open(path) as file:
        handed = json.load(file)
    os.remove(path)
    if handed["nodeid"] != crashitem:
        return False
    failed = config.hook.pytest_report_from_serializable(config=config, data=handed["report"])
    for name, value in vars(failed).items():
        setattr(report, name, value)  # xdist's report keeps its worker (report.node)
    if config.option.maxworkerrestart is None:  # the user's own limit stands
        from .._compat.xdist_internals import allow_one_more_worker_restart

        allow_one_more_worker_restart(config)
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:  # beside xdist's "replacing crashed worker"
        terminal.write_line(f"pallas: pytest-xdist's worker {worker} was ended: {crashitem} "
                            "ran past --pallas-timeout and could not be stopped in it",
                            yellow=True)
    session = session_of(config)
    if session.recording and handed["unrecorded"]:
        session.incomplete_reasons.append(stuck_conformance_reason(crashitem))
    return True


# --- in one process -----------------------------------------------------------------------


def arm(config: pytest.Config) -> None:
    """Before the first test of a one-process run: keep what replacing its process needs
    (the reports, the terminal's file descriptors, the environment). Nothing for a run
    whose process is not this pytest's own (``pytest.main`` inside another program)."""
    params = config.invocation_params
    state = run_state(config)
    if (state.stuck_test_replacement is not None or params.plugins
            or list(sys.argv[1:]) != list(params.args)):
        return
    replacement = Replacement(config)
    state.stuck_test_replacement = replacement
    config.pluginmanager.register(replacement, "pallas-stuck-test-replacement")


class Replacement:
    """In one process: the reports so far, and the process's replacement by a fresh pytest
    that runs the tests after a stuck one."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.reports: list[pytest.TestReport] = []
        # The process's stdin, stdout and stderr as pytest found them: while a test runs,
        # pytest's capture has put files in their place.
        self.descriptors = [_duplicate(descriptor) for descriptor in (0, 1, 2)]
        self.environment = dict(os.environ)  # before any test changed it

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.append(report)

    def pytest_unconfigure(self) -> None:
        for descriptor in self.descriptors:
            if descriptor is not None:
                os.close(descriptor)

    def replace_process(self, item: pytest.Item, text: str, seconds: float) -> None:
        config = self.config
        session = session_of(config)
        report = _failed_report(item, text, seconds)
        unrecorded = _with_records(item, report, f"the process ended at {item.nodeid}")
        items = item.session.items
        failed = item.session.testsfailed + 1
        maxfail = config.getoption("maxfail", 0)
        stop = bool(maxfail and failed >= maxfail) or bool(item.session.shouldstop)
        remaining = [] if stop else [later.nodeid
                                     for later in items[items.index(item) + 1:]]
        state = {
            "stuck": item.nodeid, "unrecorded": unrecorded,
            "reports": [_serialised(config, kept) for kept in self.reports]
            + [_serialised(config, report)],
            "remaining": remaining, "seed": session.options.seed,
            "incomplete_reasons": list(session.incomplete_reasons),
            "benchmarks": bool(_benchmarks_run(config)),
        }
        descriptor, path = tempfile.mkstemp(prefix="pytest-pallas-resume-", suffix=".json")
        os.close(descriptor)
        _write_json(path, state)
        for saved, descriptor in zip(self.descriptors, (0, 1, 2)):
            if saved is not None:
                os.dup2(saved, descriptor)
        for stream in (sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 (a closed stream: nothing to flush)
                pass
        os.write(2, (f"\npallas: {item.nodeid} ran past --pallas-timeout and cannot be stopped "
                     "in this process; a fresh pytest replaces it and runs the tests after it "
                     f"({len(remaining)}); the results so far are kept\n").encode())
        os.chdir(config.invocation_params.dir)
        environment = dict(self.environment, **{RESUME_ENV: path})
        argv = [sys.executable, *sys.orig_argv[1:]]
        os.execve(sys.executable, argv, environment)


# --- the fresh pytest that replaced a stuck one ---------------------------------------------


def _duplicate(descriptor: int) -> int | None:
    """A copy of ``descriptor``, None when it is not open (a closed stdin, say)."""
    try:
        return os.dup(descriptor)
    except OSError:
        return None


def _benchmarks_run(config: pytest.Config) -> list:
    """The Pallas benchmarks this process ran."""
    benchmarks = run_state(config).benchmarks
    return benchmarks.records if benchmarks is not None else []


def resume(config: pytest.Config) -> None:
    """In the pytest that replaced a stuck one (``RESUME_ENV`` set): take the state it was
    handed, run the stuck one's seed, and register what runs only the tests left."""
    path = os.environ.pop(RESUME_ENV)  # not for the subprocesses this run starts
    try:
        with open(path) as file:
            state = json.load(file)
        os.remove(path)
    except (OSError, ValueError) as error:
        raise pytest.UsageError(
            f"{RESUME_ENV}={path}: the state of the pytest this one replaces cannot be read "
            f"({error}); unset {RESUME_ENV} and run pytest again.") from None
    if config.option.pallas_seed is None:
        config.option.pallas_seed = str(state["seed"])
    config.pluginmanager.register(Resumption(config, state), "pallas-resumption")


class Resumption:
    """The tests left after a stuck one, and the results before it given to the reporters."""

    def __init__(self, config: pytest.Config, state: dict[str, Any]) -> None:
        self.config = config
        self.state = state
        self.replayed = False
        self.missing: list[str] = []

    def pytest_report_header(self) -> str:
        return (f"pallas: this pytest replaces one whose test {self.state['stuck']} ran past "
                f"--pallas-timeout; it runs the tests after it ({len(self.state['remaining'])}) "
                "and reports the ones before with their results")

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self):
        # Before pytest-benchmark saves: the benchmarks before the stuck test were lost.
        if self.state.get("benchmarks"):
            benchmark_run(self.config).withhold_partial_run(self.config, (
                f"the benchmarks before {self.state['stuck']}, which ran past --pallas-timeout, "
                "were lost with its process"))
        return (yield)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        by_id = {item.nodeid: item for item in items}
        wanted = self.state["remaining"]
        items[:] = [by_id[nodeid] for nodeid in wanted if nodeid in by_id]
        self.missing = [nodeid for nodeid in wanted if nodeid not in by_id]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self) -> None:
        # Inside the test loop: pytest stops a run whose failures came before it as one
        # that failed to collect.
        self.replay()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        try:
            return (yield)
        finally:
            self.replay()  # no test was left

    def replay(self) -> None:
        if self.replayed:
            return
        self.replayed = True

        config = self.config
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        logreport = config.pluginmanager.subset_hook_caller(
            "pytest_runtest_logreport", remove_plugins=[terminal] if terminal else [])
        for data in self.state["reports"]:
            report = config.hook.pytest_report_from_serializable(config=config, data=data)
            logreport(report=report)  # the terminal printed it in the process before
            if terminal is not None:
                count_in_terminal_summary(terminal, report)
        session = session_of(config)
        session.incomplete_reasons.extend(self.state["incomplete_reasons"])
        if session.recording and self.state["unrecorded"]:
            session.incomplete_reasons.append(stuck_conformance_reason(self.state["stuck"]))
        if self.missing:
            names = ", ".join(self.missing[:5]) + (" ..." if len(self.missing) > 5 else "")
            reason = (f"{len(self.missing)} tests left after {self.state['stuck']} were not "
                      f"collected again by the pytest that replaced its process: {names}")
            session.incomplete_reasons.append(reason)
            if terminal is not None:
                terminal.write_line(f"pallas: {reason}", yellow=True)


def stuck_conformance_reason(nodeid: str) -> str:
    return (f"{nodeid} ran past --pallas-timeout and its process was ended: the report lacks "
            "the outcome of the property it was checking")


def _write_json(path: str, document: dict) -> None:
    """Write ``document`` whole or not at all (the reader may look at any moment)."""
    partial = f"{path}.{os.getpid()}.{time.monotonic_ns()}.partial"
    with open(partial, "w") as file:
        json.dump(document, file)
    os.replace(partial, path)
