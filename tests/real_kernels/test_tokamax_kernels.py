"""tokamax's Pallas TPU kernels through the plugin's checks (skipped when tokamax is absent).

``tox -e real-kernels`` installs it; see the README's "Real kernels".
"""

import pytest

pytest.importorskip("tokamax")

from pytest_pallas import assert_allclose, check_kernel, check_uninitialized_reads  # noqa: E402

from .tokamax_corpus import TOKAMAX_CASES  # noqa: E402

pytestmark = pytest.mark.pallas

CASES = [pytest.param(case, id=case.name) for case in TOKAMAX_CASES]


@pytest.mark.parametrize("case", CASES)
def test_values(case):
    args = case.args()
    assert_allclose(case.kernel(*args), case.reference(*args), **case.comparison(args))


@pytest.mark.parametrize("case", CASES)
def test_check_kernel(case):
    check_kernel(case.kernel, *case.args())


@pytest.mark.full_corpus
@pytest.mark.parametrize("case", CASES)
def test_uninitialized_reads(case):
    args = case.args()
    out = check_uninitialized_reads(case.kernel, *args)
    assert_allclose(out, case.reference(*args), **case.comparison(args))
