"""The Pallas TPU kernels of 2026 (tpu-inference 0.32.0, tokamax 0.0.17, MaxText 0.2.5, JAX 0.12)
through the plugin's checks, as a user runs them: no ``interpret=`` anywhere.

Values against a float64 reference, ``check_kernel`` and (``PALLAS_REAL_KERNELS=full``)
``check_uninitialized_reads``, in the run's interpreter; ``tox -e real-kernels-2026``
repeats the file under ``--pallas-interpret=plain``, ``--pallas-detect-races`` and
``--pallas-chip=v5p``. A case whose package is not installed skips; see
docs/corpus.md for what installs them.
"""

from __future__ import annotations

import importlib.util

import pytest

from pytest_pallas import assert_allclose, check_kernel, check_uninitialized_reads

from .corpus_2026 import CASES_2026, THIRD_PARTY_WARNINGS

pytestmark = [pytest.mark.pallas, *THIRD_PARTY_WARNINGS]


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package.replace("-", "_")) is not None


def _case_params(check: str):
    params = []
    for case in CASES_2026:
        marks = [pytest.mark.devices(case.devices)]
        if case.slow and check != "check_kernel":
            marks.append(pytest.mark.full_corpus)
        if case.package and not _installed(case.package):
            marks.append(pytest.mark.skip(
                reason=f"{case.package} is not installed: bash .ci/install-corpus-2026 "
                       "(Python >= 3.12; docs/corpus.md)"))
        elif check in case.defect_fails:
            marks.append(pytest.mark.xfail(strict=True, reason=case.defect))
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


def _skip_below_its_tensor_cores(case) -> None:
    from jax.experimental.pallas import tpu as pltpu

    cores = pltpu.get_tpu_info().num_cores   # the stand-in chip's (--pallas-chip)
    if cores < case.min_tensor_cores:
        pytest.skip(f"a megacore kernel: it needs {case.min_tensor_cores} TensorCores, the "
                    f"stand-in chip has {cores}; run it with --pallas-chip=v5p")
    vmem_mib = pltpu.get_tpu_info().vmem_capacity_bytes // 2**20
    if vmem_mib < case.vmem_limit_mib:
        pytest.skip(f"the kernel asks for {case.vmem_limit_mib} MiB of VMEM (vmem_limit_bytes), "
                    f"the stand-in chip has {vmem_mib} MiB; run it with --pallas-chip=v5e")


@pytest.mark.parametrize("case", _case_params("values"))
def test_values(case):
    _skip_below_its_tensor_cores(case)
    args = case.args()
    assert_allclose(case.kernel(*args), case.reference(*args), **case.comparison(args))


@pytest.mark.parametrize("case", _case_params("check_kernel"))
def test_check_kernel(case):
    check_kernel(case.kernel, *case.args())


@pytest.mark.full_corpus
@pytest.mark.parametrize("case", _case_params("uninitialized_reads"))
def test_uninitialized_reads(case):
    _skip_below_its_tensor_cores(case)
    args = case.args()
    out = check_uninitialized_reads(case.kernel, *args)
    assert_allclose(out, case.reference(*args), **case.comparison(args))
