"""The pytest internal the plugin relies on (pytest_pallas/_compat/pytest_internals.py),
checked against the installed pytest."""

import pytest

from pytest_pallas._compat.pytest_internals import skip_at_test


def test_the_installed_pytest_takes_the_item_location_keyword():
    # Without it a skip the plugin raises in a hook names pluggy's line: the fallback works,
    # but reads worse, and this says so when a pytest drops the keyword.
    with pytest.raises(pytest.skip.Exception) as skipped:
        skip_at_test("why")
    assert skipped.value.msg == "why"
    assert skipped.value._use_item_location is True


def test_the_installed_pytest_keeps_what_a_stuck_test_reads(pytestconfig):
    # plugin/stuck_tests.py: what the stuck test printed, read from pytest's capture, and
    # the results of a replaced process counted in the terminal's summary.
    from pytest_pallas._compat.pytest_internals import captured_output, count_in_terminal_summary

    print("printed by the test")
    out, _ = captured_output(pytestconfig)
    if pytestconfig.getoption("capture") != "no":
        assert "printed by the test" in out
    terminal = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    assert callable(terminal._add_stats)
    report = pytest.TestReport("test_x.py::test_earlier", ("test_x.py", 1, "test_earlier"), {},
                               "passed", None, "call")
    before = len(terminal.stats.get("passed", []))
    count_in_terminal_summary(terminal, report)
    assert len(terminal.stats["passed"]) == before + 1
    terminal.stats["passed"].remove(report)  # not a result of this run
