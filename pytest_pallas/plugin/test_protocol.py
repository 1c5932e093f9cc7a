"""One Pallas test from setup to report: a skip its markers decide, its ``KernelRun`` opened,
its call watched and judged (``KernelRun.after_success`` / ``after_failure``), its run closed,
and a failed call's report given the ``pallas`` section.

The call and the teardown are generators the plugin's hook wrappers delegate to (``yield
from``): pytest's other plugins run where they yield.
"""

from __future__ import annotations

import functools
from collections.abc import Generator
from typing import Any

import pytest

from .._compat.pytest_internals import skip_at_test, take_unittest_error
from . import run_records
from .failure_section import failure_section
from .hypothesis_settings import (
    restate_hypothesis_notes,
    restore_hypothesis_attributes,
    seed_hypothesis,
)
from .session import session_of
from .skips import skip_reason


def setup(item: pytest.Item) -> None:
    """Skip a test its markers rule out; else open its ``KernelRun`` and seed Hypothesis."""
    session = session_of(item.config)
    if not session.uses_pallas(item):
        return
    reason = skip_reason(session, item)
    if reason:
        skip_at_test(reason)  # reported at the test, as a skipif mark is
    session.open_kernel_run(item)
    seed_hypothesis(session, item)


def call(item: pytest.Item) -> Generator[None, Any, Any]:
    """Around the test's call: the watchdog, and what the call's end means (a rule broken, a
    hang, a crash of JAX's interpreter, ...)."""
    __tracebackhide__ = True
    session = session_of(item.config)
    if not session.uses_pallas(item):
        return (yield)
    run = session.kernel_run(item)
    run.begin_call()
    with run.watchdog(on_stuck=functools.partial(_end_stuck_test, item)) as watchdog:
        try:
            result = yield
            # A unittest.TestCase test records its error instead of raising it.
            recorded = take_unittest_error(item)
            if recorded is not None:
                raise recorded
        except BaseException as error:
            if isinstance(error, Exception):
                # A TestCase's recorded error is its failure, also where the call raised
                # after it (JAX's suites turn an unraisable exception into an error).
                error = take_unittest_error(item) or error
            restate_hypothesis_notes(item, error)
            return run.after_failure(error, watchdog)  # raises, skips or reruns
    run.after_success(watchdog)
    return result


def teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    """After every other teardown: the test's Hypothesis attributes restored, its run closed."""
    try:
        return (yield)
    finally:
        restore_hypothesis_attributes(item)
        session_of(item.config).close_kernel_run(item)


def make_report(item: pytest.Item, call_info: pytest.CallInfo) -> Generator[None, Any, Any]:
    """A worker's records sent with the report; a failed call's report gets the ``pallas``
    section."""
    report = yield
    session = session_of(item.config)
    run_records.send_worker_records(item, call_info, report)
    if report.failed and call_info.when == "call" and session.uses_pallas(item):
        report.sections.append(("pallas", failure_section(session, item, call_info, report)))
    return report


def _end_stuck_test(item: pytest.Item, text: str, seconds: float) -> None:
    from .stuck_tests import end_stuck_test

    end_stuck_test(item, text, seconds)
