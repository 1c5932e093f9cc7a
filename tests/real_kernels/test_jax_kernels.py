"""The kernels JAX ships in ``jax.experimental.pallas.ops.tpu``, through the plugin's checks.

Values against a float64 reference, ``check_kernel`` (the static TPU rules and
Mosaic lowering) and ``check_uninitialized_reads``, in the run's backend; the
same file runs on a megacore chip and with race detection from
``test_corpus_flags.py``. A real defect is an ``xfail(strict=True)`` whose
reason says what is wrong and how it was proved.
"""

from __future__ import annotations

import pytest

from pytest_pallas import assert_allclose, check_kernel, check_uninitialized_reads

from .corpus import CASES

pytestmark = pytest.mark.pallas


def _case_params(check: str):
    params = []
    for case in CASES:
        marks = [pytest.mark.devices(case.devices)]
        if case.slow and check != "check_kernel":
            marks.append(pytest.mark.full_corpus)
        if check in case.defect_fails:
            marks.append(pytest.mark.xfail(strict=True, reason=case.defect))
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


def _runs(case, check: str) -> range:
    """A timing-dependent defect is looked for in several runs; everything else runs once."""
    return range(case.defect_runs if check in case.defect_fails else 1)


@pytest.mark.parametrize("case", _case_params("values"))
def test_values(case):
    args = case.args()
    for _ in _runs(case, "values"):
        assert_allclose(case.kernel(*args), case.reference(*args), **case.comparison(args))


@pytest.mark.parametrize("case", _case_params("check_kernel"))
def test_check_kernel(case):
    check_kernel(case.kernel, *case.args())


@pytest.mark.full_corpus
@pytest.mark.parametrize("case", _case_params("uninitialized_reads"))
def test_uninitialized_reads(case):
    args = case.args()
    for _ in _runs(case, "uninitialized_reads"):
        out = check_uninitialized_reads(case.kernel, *args)
        assert_allclose(out, case.reference(*args), **case.comparison(args))
