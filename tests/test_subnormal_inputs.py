"""Subnormal inputs: a TPU, and XLA on the CPU, read them as 0; the oracle reads them in float64.

A correct rms_norm of a 1 x 1 bfloat16 input of 2.8e-40 returns 0 on the chip, where the
float64 oracle returns 2.8e-37 (x / sqrt(eps)): the suite judged that a value failure of the
reference kernel (seed 5 of the main job, before the declared blocks changed its draws).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas import operations
from pytest_pallas.ops.inputs import Case
from pytest_pallas.reference_kernels import norms
from pytest_pallas.suite.properties import judge_against_oracle


def _subnormal_case():
    x = np.array([[2.8e-40]], dtype=ml_dtypes.bfloat16)
    w = np.array([1.0], dtype=ml_dtypes.bfloat16)
    return Case(operations.rms_norm, {"rows": 1, "cols": 1}, "bfloat16", "small", 0, (x, w),
                {"eps": 1e-6})


def test_a_correct_kernel_on_a_subnormal_input_passes():
    case = _subnormal_case()
    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        result = norms.rms_norm(*map(jnp.asarray, case.args), eps=1e-6)
    assert float(np.asarray(result, np.float64)[0, 0]) == 0.0  # flushed, as on the chip
    verdicts, _, message, _ = judge_against_oracle(case, result, matmul_precision="float32")
    assert verdicts["value"] and not message


def test_a_wrong_result_on_a_subnormal_input_still_fails():
    case = _subnormal_case()
    wrong = np.array([[1.0]], dtype=ml_dtypes.bfloat16)  # neither oracle's answer
    verdicts, _, message, _ = judge_against_oracle(case, wrong, matmul_precision="float32")
    assert not verdicts["value"] and message
