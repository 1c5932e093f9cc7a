"""The real-kernel corpus: a fast subset in every test run, the whole corpus on request.

Every run checks each kernel's values and its static rules (``check_kernel``).
With ``PALLAS_REAL_KERNELS=full`` (``tox -e real-kernels``, which also installs
tokamax and repeats the corpus on a megacore chip and with race detection) the
NaN- and zero-filled runs of ``check_uninitialized_reads`` run too.
"""

import os

import pytest

FULL = os.environ.get("PALLAS_REAL_KERNELS") == "full"


def pytest_configure(config):
    config.addinivalue_line("markers", "full_corpus: runs only with PALLAS_REAL_KERNELS=full")


def pytest_collection_modifyitems(config, items):
    if FULL:
        return
    skip = pytest.mark.skip(reason="the full real-kernel corpus: PALLAS_REAL_KERNELS=full "
                                   "(tox -e real-kernels)")
    for item in items:
        if item.get_closest_marker("full_corpus"):
            item.add_marker(skip)
