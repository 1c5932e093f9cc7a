"""pytest-xdist's events on its controller: a worker configured with the run's seed and
order, a worker down, a test that crashed its worker (or ended it because the test was stuck
past ``--pallas-timeout``)."""

from __future__ import annotations

from typing import Any

from .options import WORKER_SEED_KEY
from .run_state import run_state
from .session import session_of


def configure_node(node: Any) -> None:
    """A worker draws with the controller's seed: the one the header prints and a failure's
    reproduce line gives (left to itself, each worker would pick its own at random); it
    orders the conformance tests for the controller's ``--dist``, and knows where to hand a
    stuck test's failure."""
    from .conformance_order import worker_input

    session = session_of(node.config)
    node.workerinput[WORKER_SEED_KEY] = session.options.seed
    node.workerinput.update(worker_input(node.config))
    if session.options.timeout_seconds and not session.options.compiled:
        from .stuck_tests import FOLDER_KEY, folder_for_workers

        node.workerinput[FOLDER_KEY] = folder_for_workers(node.config)


def node_down(node: Any, error: Any) -> None:
    """A worker that crashed leaves the conformance report incomplete; one that ended itself
    for a stuck test did not crash (the test's failure comes in its place)."""
    session = session_of(node.config)
    if error is None or _ended_for_a_stuck_test(node.config, node.gateway.id):
        return
    if session.recording:
        session.incomplete_reasons.append(
            f"pytest-xdist worker {node.gateway.id} crashed ({str(error).strip()})")


def crashed_item(crashitem: str, report: Any) -> None:
    """The test a worker died in: a stuck test's failure in place of xdist's "worker
    crashed" report, or a conformance report that says it lacks the test's verdict."""
    # The report pytest-xdist makes for the crashed test carries its worker, hence the config.
    node = getattr(report, "node", None)
    config = getattr(node, "config", None)
    if config is None:
        return
    if _ended_for_a_stuck_test(config, node.gateway.id):
        from .stuck_tests import take_stuck_test

        if take_stuck_test(config, node.gateway.id, crashitem, report):
            return  # not a crash: the report is now the test's failure
    session = session_of(config)
    if session.recording:
        session.incomplete_reasons.append(f"{crashitem} crashed its worker and has no verdict")


def _ended_for_a_stuck_test(config: Any, worker: str) -> bool:
    if run_state(config).stuck_tests_folder is None:
        return False  # no worker was given a folder: none ended itself
    from .stuck_tests import ended_for_a_stuck_test

    return ended_for_a_stuck_test(config, worker)
