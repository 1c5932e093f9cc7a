"""False alarms of ``--pallas-judge``'s program checks on kernels nobody here wrote.

Every kernel of the corpora (JAX's shipped Pallas TPU kernels, and tokamax's, tpu-inference's
and MaxText's where installed) runs its arithmetic in its kernels, with layout work and
index arithmetic around them: the judge must find nothing. With no op record to state their
work, the work is the kernels' own (their declared cost estimates, or their bodies'
arithmetic times their grids). docs/grading.md records the count.
"""

from __future__ import annotations

import importlib.util

import jax
import numpy as np
import pytest

from pytest_pallas.checks import honesty
from pytest_pallas.checks.jaxpr_analysis import pallas_call_params_in

from .corpus import CASES
from .corpus_2026 import CASES_2026, THIRD_PARTY_WARNINGS

pytestmark = [pytest.mark.pallas, *THIRD_PARTY_WARNINGS]


def _params():
    params = []
    for case in [*CASES, *CASES_2026]:
        marks = [pytest.mark.devices(case.devices)]
        if case.package and importlib.util.find_spec(case.package.replace("-", "_")) is None:
            marks.append(pytest.mark.skip(reason=f"{case.package} is not installed"))
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_the_judge_finds_nothing_in_a_real_kernel(case):
    args = case.args()
    closed = jax.make_jaxpr(case.kernel)(*args)
    declared = sum(honesty.op_work(params.get("cost_estimate"))
                   for params in pallas_call_params_in(closed))
    outputs = jax.tree.leaves(jax.eval_shape(case.kernel, *args))
    elements = (sum(int(np.size(a)) for a in jax.tree.leaves(args))
                + sum(int(np.prod(o.shape)) for o in outputs))
    verdict = honesty.judge_program(closed, work=max(declared, honesty.kernel_work(closed)),
                                    elements=elements)
    assert verdict.kernels >= 1
    assert verdict.findings == (), [finding.line() for finding in verdict.findings]
