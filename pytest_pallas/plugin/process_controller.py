"""The controller of a ``--pallas-processes`` run: the user's pytest, which starts the N
workers, reads their reports as they write them, gives each test one verdict and restarts
every worker after a hang or a death (see ``plugin.processes``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from .session import session_of

# A worker's environment: which process it is (``K/N``), where the coordinator listens,
# the exchange directory, and the index of the first test it runs.
PROCESS_ENV = "PYTEST_PALLAS_PROCESS"
COORDINATOR_ENV = "PYTEST_PALLAS_COORDINATOR"
EXCHANGE_ENV = "PYTEST_PALLAS_EXCHANGE"
FIRST_TEST_ENV = "PYTEST_PALLAS_FIRST_TEST"
SEED_ENV = "PYTEST_PALLAS_PROCESSES_SEED"

# How long the other processes may still run a test after one process failed it: they are
# most likely waiting in a collective for the failed one, which has moved on.
_AFTER_A_FAILURE_SECONDS = 10.0
# How long a worker may take to start (import JAX, join the others, collect).
_START_SECONDS = 180.0


def header_line(count: int, devices: int) -> str:
    return (f"pallas: {count} JAX processes joined by jax.distributed on this host, "
            f"{devices // count} CPU devices each (gloo collectives); one verdict per test")


class ProcessController:
    """The user's pytest in a ``--pallas-processes`` run: starts the workers and reports."""

    def __init__(self, config: pytest.Config, count: int, devices: int) -> None:
        self.config = config
        self.count = count
        self.devices = devices  # --pallas-devices: the processes' devices together
        self.workers: list[subprocess.Popen] = []
        self.exchange = ""

    def pytest_report_header(self, config: pytest.Config) -> str:
        return header_line(self.count, self.devices)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(
                f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} "
                "during collection")
        if session.config.option.collectonly or not session.items:
            return True
        self.exchange = tempfile.mkdtemp(prefix="pytest-pallas-processes-")
        try:
            with open(os.path.join(self.exchange, "order.json"), "w") as file:
                json.dump([item.nodeid for item in session.items], file)
            first = 0
            while first < len(session.items) and not session.shouldstop:
                first = self._run_from(session, first)
        finally:
            self.stop_workers()
            shutil.rmtree(self.exchange, ignore_errors=True)
        return True

    def pytest_unconfigure(self) -> None:
        self.stop_workers()  # an interrupted run too

    # -- the workers' lives --

    def _start_workers(self, first: int) -> list[_Results]:
        self.stop_workers()
        for name in os.listdir(self.exchange):
            if name != "order.json":
                os.remove(os.path.join(self.exchange, name))

        seed = session_of(self.config).options.seed
        # The controller alone stops early (-x, --maxfail): a worker that stopped would
        # leave the others waiting in the next test's collectives.
        arguments = [*self.config.invocation_params.args, "--maxfail=0"]
        environment = dict(os.environ)
        environment.pop("JAX_NUM_CPU_DEVICES", None)  # the controller's count, not a share
        # Each its share of the devices; a count the user put in XLA_FLAGS stays, per process.
        flags = environment.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            environment["XLA_FLAGS"] = (
                f"{flags} --xla_force_host_platform_device_count={self.devices // self.count}"
            ).strip()
        environment.update({COORDINATOR_ENV: f"127.0.0.1:{_free_port()}",
                            EXCHANGE_ENV: self.exchange, FIRST_TEST_ENV: str(first),
                            SEED_ENV: str(seed)})
        results = []
        for index in range(self.count):
            environment[PROCESS_ENV] = f"{index}/{self.count}"
            log = open(os.path.join(self.exchange, f"process-{index}.log"), "wb")
            self.workers.append(subprocess.Popen(
                [sys.executable, "-m", "pytest", *arguments],
                cwd=str(self.config.invocation_params.dir), env=dict(environment),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))  # a process group of its own, killed as one
            log.close()
            results.append(_Results(os.path.join(self.exchange, f"results-{index}.jsonl")))
        return results

    def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                try:
                    os.killpg(worker.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    worker.kill()
        for worker in self.workers:
            try:
                worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.workers = []

    def _run_from(self, session: pytest.Session, first: int) -> int:
        """Run the tests from index ``first`` in freshly started workers; the index to start
        again from after a hang or a death, or past the end when all ran."""
        results = self._start_workers(first)
        timeout = self._timeout()
        clock = time.monotonic()
        started = False
        for index in range(first, len(session.items)):
            item = session.items[index]
            item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            failed_at: float | None = None
            while True:
                for each in results:
                    each.read()
                # Timed once every process has started it: a process restarted with the
                # others may still be starting (importing JAX, joining them).
                if not started and all(index in each.started for each in results):
                    started, clock = True, time.monotonic()
                finished = [index in each.finished for each in results]
                if all(finished):
                    break
                problem = self._problem(index, results, finished, clock, started, timeout,
                                        failed_at)
                if isinstance(problem, float):
                    failed_at = problem
                    problem = None
                if problem:
                    self._report(item, results, index, problem)
                    return index + 1
                time.sleep(0.05)
            self._report(item, results, index, None)
            clock, failed_at = time.monotonic(), None
            if session.shouldfail or session.shouldstop:
                break
        self.stop_workers()
        return len(session.items)

    def _timeout(self) -> float:
        return session_of(self.config).options.timeout_seconds

    def _problem(self, index: int, results: list[_Results], finished: list[bool],
                 clock: float, started: bool, timeout: float,
                 failed_at: float | None) -> str | float | None:
        """Why the test at ``index`` ends unfinished in some process, if it does; or the time
        a process failed it, for the others' grace."""
        now = time.monotonic()
        for number, worker in enumerate(self.workers):
            code = worker.poll()
            if code is not None and not finished[number]:
                results[number].read()
                if index in results[number].finished:
                    continue
                return (f"process {number} exited (code {code}) before finishing this test"
                        + _log_tail(os.path.join(self.exchange, f"process-{number}.log")))
        unfinished = ", ".join(f"process {n}" for n, done in enumerate(finished) if not done)
        if not started:
            limit = max(_START_SECONDS, timeout)
            if now - clock > limit:
                return f"{unfinished} did not start this test within {limit:g}s"
            return None
        if timeout and now - clock > timeout:
            return (f"{unfinished} did not finish this test within --pallas-timeout="
                    f"{timeout:g}s (a collective that some process never reaches waits "
                    "forever); every process was stopped and started again for the next test")
        if failed_at is None and any(each.failed(index) for each in results):
            return now
        if failed_at is not None and now - failed_at > _AFTER_A_FAILURE_SECONDS:
            return (f"{unfinished} still ran this test {_AFTER_A_FAILURE_SECONDS:g}s after "
                    "another process failed it (waiting in a collective for it, most "
                    "likely); every process was stopped and started again for the next test")
        return None

    # -- one verdict per test --

    def _report(self, item: pytest.Item, results: list[_Results], index: int,
                problem: str | None) -> None:
        from .process_verdicts import merged_reports

        per_process = [[self._report_from(data) for data in each.reports.get(index, [])]
                       for each in results]
        for report in merged_reports(item, per_process, problem):
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


    def _report_from(self, data: dict) -> pytest.TestReport:
        report = self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
        if isinstance(report.longrepr, list):  # a skip's (path, line, reason), through JSON
            report.longrepr = tuple(report.longrepr)
        report.location = tuple(report.location)
        return report


class _Results:
    """What one worker wrote to its results file, read as it grows."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.started: set[int] = set()
        self.finished: set[int] = set()
        self.reports: dict[int, list[dict]] = {}

    def read(self) -> None:
        try:
            with open(self.path, "rb") as file:
                file.seek(self.offset)
                chunk = file.read()
        except FileNotFoundError:
            return
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            event = json.loads(line)
            index = event["index"]
            if event["event"] == "start":
                self.started.add(index)
            elif event["event"] == "report":
                self.reports.setdefault(index, []).append(event["report"])
            elif event["event"] == "finish":
                self.finished.add(index)

    def failed(self, index: int) -> bool:
        return any(report.get("outcome") == "failed" for report in self.reports.get(index, ()))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as file:
            tail = file.read().splitlines()[-lines:]
    except OSError:
        return ""
    return ("; its last output:\n" + "\n".join(tail)) if tail else ""
