"""``--pallas-processes=N``: every test runs in N JAX processes joined by ``jax.distributed``.

The pytest the user started is the controller, as pytest-xdist's is: it collects, prints
the one header and the one summary, writes the one ``--pallas-report``, and runs no test.
It starts N worker pytests with the same arguments (the controller's seed, its share of the
simulated devices each), each ``jax.distributed`` process ``i`` of N on 127.0.0.1 with CPU
(gloo) collectives. The workers run the controller's tests in the controller's order, each
test in every process at once; before each test body they compare what they are about to run
(test id and seed), and a disagreement fails that test with one line. Each worker writes its
reports to a file of its own in an exchange directory; the controller reads them, and gives
each test one verdict: failed when any process failed, each failure under ``process K:``.

A process that dies, or a test that runs past ``--pallas-timeout`` in any process (a
collective some process never reaches waits forever), fails that test naming the processes
that did not finish; the controller then kills every worker (their process groups) and starts
them again from the next test. Workers never outlive the controller.

The exchange is plain files: each worker appends one JSON line per event to
``results-K.jsonl``; ``order.json`` holds the controller's test ids; ``agree-I-K`` what
process K is about to run as test I.
"""

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
from typing import Any

import pytest

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


def requested_processes(config: pytest.Config) -> int:
    """``--pallas-processes``, validated: 1 when not given."""
    value = config.getoption("--pallas-processes", default=None)
    if value is None:
        return 1
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise pytest.UsageError(
            f"--pallas-processes={value!r} must be a whole number of processes, 1 or more; "
            "give e.g. --pallas-processes=2.")
    return count


def worker_process() -> tuple[int, int] | None:
    """``(process, processes)`` in a worker of a ``--pallas-processes`` run, else None."""
    value = os.environ.get(PROCESS_ENV)
    if not value:
        return None
    index, _, count = value.partition("/")
    return int(index), int(count)


def configure(config: pytest.Config) -> None:
    """From ``pytest_cmdline_main``, before pytest_configure: make this process the
    controller or a worker of a ``--pallas-processes`` run (nothing for one process)."""
    worker = worker_process()
    if worker is not None:
        _configure_worker(config, *worker)
        return
    count = requested_processes(config)
    if count == 1:
        return
    _check_combination(config, count)
    config.pluginmanager.register(ProcessController(config, count), "pallas-processes")


def _check_combination(config: pytest.Config, count: int) -> None:
    option = config.option
    workers = getattr(option, "numprocesses", None)
    if workers not in (None, 0, "0") or getattr(option, "dist", "no") != "no":
        raise pytest.UsageError(
            f"--pallas-processes={count} runs each test in {count} JAX processes and does not "
            "combine with pytest-xdist's -n/--dist; drop -n and --dist.")
    if option.pallas_tpu or option.pallas_gpu:
        raise pytest.UsageError(
            f"--pallas-processes={count} simulates the hosts of a slice on this CPU; on a "
            "multi-host TPU slice start `pytest --pallas-tpu` on every host instead.")
    devices = _devices(config)
    if devices % count:
        raise pytest.UsageError(
            f"--pallas-devices={devices} cannot be split among --pallas-processes={count}; "
            f"give a multiple of {count} "
            f"(e.g. --pallas-devices={count * max(1, devices // count)}).")


def _devices(config: pytest.Config) -> int:
    from ..settings import DEFAULT_DEVICES

    value = config.getoption("--pallas-devices", default=None) or config.getini("pallas_devices")
    try:
        return int(value) if value else DEFAULT_DEVICES
    except ValueError:
        return DEFAULT_DEVICES  # the plugin's own option check says what is wrong


def header_line(count: int, devices: int) -> str:
    return (f"pallas: {count} JAX processes joined by jax.distributed on this host, "
            f"{devices // count} CPU devices each (gloo collectives); one verdict per test")


# --- the controller ----------------------------------------------------------------------


class ProcessController:
    """The user's pytest in a ``--pallas-processes`` run: starts the workers and reports."""

    def __init__(self, config: pytest.Config, count: int) -> None:
        self.config = config
        self.count = count
        self.devices = _devices(config)
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
        from .session import session_of

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
        from .session import session_of

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


# --- a worker ------------------------------------------------------------------------------


def _configure_worker(config: pytest.Config, index: int, count: int) -> None:
    from .options import WORKER_SEED_KEY

    # Like a pytest-xdist worker: the controller's seed; records travel with the reports to
    # the controller, which alone writes the report.
    config.workerinput = {WORKER_SEED_KEY: int(os.environ[SEED_ENV]),
                          "workerid": f"process{index}"}
    join_processes(os.environ[COORDINATOR_ENV], count, index)
    config.pluginmanager.register(
        ProcessWorker(config, index, count, os.environ[EXCHANGE_ENV],
                      int(os.environ.get(FIRST_TEST_ENV, "0"))), "pallas-process-worker")


def join_processes(coordinator: str, count: int, index: int, *,
                   on_this_host: bool = True) -> None:
    """``jax.distributed.initialize`` before JAX's backends start, and JAX's TPU interpreter
    made to run across the processes. ``on_this_host``: N processes of this CPU, with gloo
    collectives on the loopback interface; else the hosts of a TPU slice."""
    if on_this_host:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from .._compat.interpreter_processes import install_process_local_barriers

    if on_this_host:
        from .._compat.cpu_collectives import gloo_on_loopback

        gloo_on_loopback()
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, count, index)
    # Every process starts its backend now, together: starting one exchanges the devices of
    # all, and a process that ran no test would leave the others waiting in their first.
    jax.devices()
    install_process_local_barriers()


class ProcessWorker:
    """One of the N processes: the controller's tests in its order, its reports to a file."""

    def __init__(self, config: pytest.Config, index: int, count: int, exchange: str,
                 first: int) -> None:
        self._config = config
        self.index = index
        self.count = count
        self.exchange = exchange
        self.first = first
        self.position: dict[str, int] = {}
        self.disagreement: dict[str, str] = {}
        self.results = open(os.path.join(exchange, f"results-{index}.jsonl"), "a")
        _end_with_the_controller()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        with open(os.path.join(self.exchange, "order.json")) as file:
            order = json.load(file)
        by_id = {item.nodeid: item for item in items}
        self.position = {nodeid: number for number, nodeid in enumerate(order)}
        items[:] = [by_id[nodeid] for nodeid in order[self.first:] if nodeid in by_id]
        for index, nodeid in enumerate(order[self.first:], start=self.first):
            if nodeid not in by_id:
                self._not_collected(index, nodeid)

    def _not_collected(self, index: int, nodeid: str) -> None:
        """A test process 0 runs and this process did not collect: the others see it at
        their agreement check; the controller gets this process's failure at once."""
        why = f"did not collect {nodeid}"
        with open(os.path.join(self.exchange, f"agree-{index}-{self.index}"), "w") as file:
            file.write("no test (it did not collect this one)")
        report = pytest.TestReport(nodeid, (nodeid.partition("::")[0], None, nodeid), {},
                                   "failed", why + "; every process must collect the same "
                                   "tests (a conftest or an option that differs by process?)",
                                   "call", (), 0.0)
        self._write(event="start", index=index)
        self.pytest_runtest_logreport(report)
        self._write(event="finish", index=index)

    def _write(self, **event: Any) -> None:
        self.results.write(json.dumps(event) + "\n")
        self.results.flush()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._write(event="start", index=self.position.get(nodeid, -1))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        config = self._config
        data = config.hook.pytest_report_to_serializable(config=config, report=report)
        self._write(event="report", index=self.position.get(report.nodeid, -1), report=data)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self._write(event="finish", index=self.position.get(nodeid, -1))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Before the test body: every process is about to run the same test with the same
        seed, or the test fails with one line (a collective would wait forever)."""
        from .session import session_of

        index = self.position[item.nodeid]
        mine = f"{item.nodeid} (seed {session_of(item.config).key_seed(item.nodeid)})"
        path = os.path.join(self.exchange, f"agree-{index}-{self.index}")
        with open(path + ".tmp", "w") as file:
            file.write(mine)
        os.replace(path + ".tmp", path)
        for other in range(self.count):
            theirs = _wait_for(os.path.join(self.exchange, f"agree-{index}-{other}"))
            if theirs != mine:
                self.disagreement[item.nodeid] = (
                    f"the processes disagree on test {index}: process {self.index} runs "
                    f"{mine}, process {other} runs {theirs}; every process must collect the "
                    "same tests with the same seed")
                return

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        disagreement = self.disagreement.pop(item.nodeid, None)
        if disagreement:
            pytest.fail(disagreement, pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Item):
        from .._compat.pallas_call_hooks import observe_pallas_calls

        with observe_pallas_calls(_skip_remote_kernels):
            return (yield)


def _skip_remote_kernels(params: dict[str, Any]) -> None:
    from .._compat.interpreter_processes import remote_device_operations

    found = remote_device_operations(params.get("jaxpr"))
    if found:
        from .._compat.pytest_internals import skip_at_test

        skip_at_test(
            f"a kernel copies to or signals another device ({', '.join(sorted(set(found)))}), "
            "which JAX's interpreters run only within one process: run it with "
            "--pallas-processes=1")


def _wait_for(path: str) -> str:
    while True:
        try:
            with open(path) as file:
                return file.read()
        except FileNotFoundError:
            time.sleep(0.01)


def _end_with_the_controller() -> None:
    """A worker whose controller died (killed before it could stop its workers) ends too."""
    import threading

    controller = os.getppid()

    def watch() -> None:
        while os.getppid() == controller:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="pallas-processes-controller", daemon=True).start()
