"""A pytest plugin for the tests that run the suite on broken kernels (``-p _pallas_no_shrink``).

Skips Hypothesis's shrink and explain phases: they only simplify a failure
already found, cost minutes of interpreted kernel calls, and do not change
the verdict.
"""
import pytest
from hypothesis import Phase

from pytest_pallas._compat.hypothesis_internals import change_settings, is_given_test


@pytest.hookimpl(trylast=True)  # after pytest-pallas has given the test its settings and seed
def pytest_runtest_setup(item):
    function = getattr(item, "obj", None)
    function = getattr(function, "__func__", function)
    if is_given_test(function):
        change_settings(function, phases=(Phase.explicit, Phase.generate), database=None)
