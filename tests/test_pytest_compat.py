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
