"""Every use of a pytest internal, guarded; tests/test_pytest_compat.py checks it against the
installed pytest.

* pytest reports a skip at the line that raised it. The plugin decides some skips in its
  hooks (a marker's ``tpu_only`` in setup, a limit of JAX's interpreters after the call), so
  ``-rs`` would name a line of pluggy's or of the plugin instead of the user's test.
  ``skip.Exception(..., _use_item_location=True)``, what pytest itself raises for a
  ``skipif`` mark or a skip inside a fixture, names the test. pytest 8.0, the oldest the
  project supports, has the keyword (read in its source; CI's pytest is checked by the
  test); a pytest without it reports the skip where it was raised.
* A test that ``--pallas-timeout`` ends with its process: what it printed, read from pytest's
  capture by the watchdog's thread; the results of the process before, counted in the
  terminal's summary of the pytest that replaced it (``plugin.stuck_tests``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NoReturn

import pytest
from _pytest.python import CallSpec
from _pytest.unittest import TestCaseFunction


def skip_at_test(reason: str) -> NoReturn:
    """Skip the running test with ``reason``, reported at the test's own line."""
    __tracebackhide__ = True
    try:
        skip = pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:
        skip = pytest.skip.Exception(reason)
    raise skip


def take_unittest_error(item: pytest.Item) -> BaseException | None:
    """The error a ``unittest.TestCase`` test recorded in its call, taken from where pytest
    keeps it; None when it recorded none (or only a skip), and for other tests.

    pytest runs a TestCase's test inside unittest, which catches its exception: pytest keeps
    it in the item (``TestCaseFunction._excinfo``) and reports it after the call, so a hook
    around the call sees no exception. Taken from there, the error can be judged (a TPU
    rule, a limit of JAX's interpreters) and raised again, which is then what pytest reports.
    """
    recorded = getattr(item, "_excinfo", None)
    if not isinstance(recorded, list):
        return None
    for index, excinfo in enumerate(recorded):
        error = getattr(excinfo, "value", None)
        if isinstance(error, BaseException) and not isinstance(error, pytest.skip.Exception):
            del recorded[index]
            return error
    return None


def run_test_again(item: pytest.Item) -> None:
    """Run ``item``'s test function again; raises what it raised (a ``unittest.TestCase``
    test's recorded error too, see ``take_unittest_error``)."""
    __tracebackhide__ = True
    item.runtest()
    error = take_unittest_error(item)
    if error is not None:
        raise error


def item_per_parameter(item: pytest.Item, labels: tuple[str, ...]) -> list[pytest.Item] | None:
    """``item`` once per label, each id suffixed as pytest parametrizes (``test_x[v6e]``,
    ``test_x[3-v6e]``), or None for an item that cannot be copied (not a test function).

    pytest makes a parametrized function's items from a ``CallSpec`` (private) whose id list
    names them; a copy with one id more is what ``pytest.mark.parametrize`` would have made
    (``-k v6e`` selects it). A ``unittest.TestCase`` item makes its instance from its name,
    so its copies make theirs from the method's own name (``originalname``).
    """
    if not isinstance(item, pytest.Function) or type(item) not in (pytest.Function,
                                                                   TestCaseFunction):
        return None
    item_class = type(item)
    if item_class is TestCaseFunction:
        if not hasattr(TestCaseFunction, "_getinstance"):  # an older pytest: run it once
            return None
        item_class = _parametrized_test_case_function()
    callspec = getattr(item, "callspec", None) or CallSpec()
    copies = []
    for label in labels:
        spec = dataclasses.replace(callspec, _idlist=(*callspec._idlist, label))
        copies.append(item_class.from_parent(
            item.parent, name=f"{item.originalname}[{spec.id}]", callspec=spec,
            fixtureinfo=item._fixtureinfo, originalname=item.originalname,
            keywords={label: True}))
    return copies


@functools.cache
def _parametrized_test_case_function() -> type:
    class ParametrizedTestCaseFunction(TestCaseFunction):
        """A ``TestCaseFunction`` whose name carries a parameter: its ``TestCase`` is made
        for the method it names without it."""

        def _getinstance(self):
            return self.parent.obj(self.originalname)

    return ParametrizedTestCaseFunction


def captured_output(config: pytest.Config) -> tuple[str, str]:
    """What the running test printed so far (stdout, stderr), read from pytest's capture
    (``CaptureManager.read_global_capture``) by another thread; empty when nothing is
    captured (``-s``) or pytest keeps it elsewhere."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    try:
        out, err = capture.read_global_capture()
    except Exception:  # noqa: BLE001 (no capture, or a pytest whose capture moved)
        return "", ""
    return str(out or ""), str(err or "")


def count_in_terminal_summary(terminal: Any, report: pytest.TestReport) -> None:
    """Count ``report`` in the terminal's final summary without printing its line (a result
    of a process that ran before this one, which printed it). pytest's terminal reporter
    keeps its results by category in ``stats`` (``TerminalReporter._add_stats``)."""
    config = terminal.config
    category = config.hook.pytest_report_teststatus(report=report, config=config)[0]
    add_stats = getattr(terminal, "_add_stats", None)
    if add_stats is not None:
        add_stats(category, [report])
    else:
        terminal.stats.setdefault(category, []).append(report)
