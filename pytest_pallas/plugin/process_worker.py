"""A worker of a ``--pallas-processes`` run: the controller's tests in the controller's
order, an agreement check before each test body, its reports appended to its results file,
and a skip for kernels that reach another process's device (see ``plugin.processes``)."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest

from .session import session_of


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
        from ..supervision.remote_kernels import remote_kernels_skipped

        with remote_kernels_skipped():
            return (yield)


def _wait_for(path: str) -> str:
    while True:
        try:
            with open(path) as file:
                return file.read()
        except FileNotFoundError:
            time.sleep(0.01)


def _end_with_the_controller() -> None:
    """A worker whose controller died (killed before it could stop its workers) ends too."""
    controller = os.getppid()

    def watch() -> None:
        while os.getppid() == controller:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="pallas-processes-controller", daemon=True).start()
