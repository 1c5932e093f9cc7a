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


@pytest.fixture
def float32_products():
    """The test's dots (its kernels' and its references') and its comparator at float32
    products, whatever --pallas-numerics: for tests that measure the error models' power
    against float32 arithmetic (as --pallas-numerics=exact computes)."""
    from pytest_pallas._compat.chip_matmuls import float32_dots_exact
    from pytest_pallas.compare import backend_matmul_precision

    with float32_dots_exact(), backend_matmul_precision("float32"):
        yield
