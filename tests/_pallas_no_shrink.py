"""A pytest plugin for the tests that run the suite on broken kernels (``-p _pallas_no_shrink``).

Skips Hypothesis's shrink and explain phases: they only simplify a failure
already found, cost minutes of interpreted kernel calls, and do not change
the verdict.
"""
import pytest
from hypothesis import Phase, settings


@pytest.hookimpl(trylast=True)  # after pytest-pallas has given the test its settings and seed
def pytest_runtest_setup(item):
    function = getattr(item, "obj", None)
    function = getattr(function, "__func__", function)
    if getattr(function, "is_hypothesis_test", False):
        current = getattr(function, "_hypothesis_internal_use_settings", None) or settings.default
        function._hypothesis_internal_use_settings = settings(
            current, phases=(Phase.explicit, Phase.generate), database=None)
