"""The hooks pytest-pallas adds to pytest: implement them in a ``conftest.py`` or a plugin."""

from __future__ import annotations

import pytest


@pytest.hookspec
def pytest_pallas_operations(config: pytest.Config) -> list:
    """Return ``pytest_pallas.Operation`` records to add to the run's ops.

    Called once at start-up, before ``--pallas-impl`` and ``--pallas-ops`` are
    checked, so a registered op can be named there and gets the packaged
    suite's properties (``pytest --pallas-conformance --pallas-impl
    my_rms_norm=my_kernels:rms_norm``). An op without a ``reference`` runs only
    with ``--pallas-impl``. Build the records inside the hook: a mistake in one
    is then a one-line usage error (exit status 4)::

        # conftest.py
        def pytest_pallas_operations(config):
            from my_ops import rms_norm_reference
            from pytest_pallas import Operation

            return [Operation("my_rms_norm", "(rows,cols),(cols)->(rows,cols)",
                              oracle=rms_norm_reference, reduction="cols",
                              params={"eps": (1e-6,)})]
    """
