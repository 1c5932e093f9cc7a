"""The reference kernels' operand errors, word for word.

The kernels word their operand errors through ``reference_kernels/operand_checks.py``;
each case here is one of its wordings as a user meets it (two operands joined by "and",
three or more by commas, with or without the op's name in front), so a change to a
shared helper cannot reword one kernel's error unnoticed.
"""

import jax.numpy as jnp
import pytest

from pytest_pallas.reference_kernels import attention as at
from pytest_pallas.reference_kernels import grouped_matmul as gm
from pytest_pallas.reference_kernels import matmul as mm
from pytest_pallas.reference_kernels import norms
from pytest_pallas.reference_kernels import paged_attention as pa
from pytest_pallas.reference_kernels import quantized_matmul as qm

pytestmark = pytest.mark.pallas

f32, bf16, i32, i8 = jnp.float32, jnp.bfloat16, jnp.int32, jnp.int8


def _zeros(*specs):
    return [jnp.zeros(shape, dtype) for shape, dtype in specs]


@pytest.mark.parametrize(
    "kernel, operands, message",
    [
        (mm.matmul, [((4, 5, 6), f32), ((6, 7), f32)],
         "expected (m, k) @ (k, n), got shapes (4, 5, 6) and (6, 7)"),
        (mm.matmul, [((4, 5), f32), ((5, 7), bf16)],
         "x and y must both be float32 or both bfloat16, got float32 and bfloat16"),
        (gm.grouped_matmul, [((4, 8), f32), ((2, 9, 4), f32), ((2,), i32)],
         "grouped_matmul expects lhs (m, k), rhs (g, k, n) and group_sizes (g,) with matching "
         "k and g, got shapes (4, 8), (2, 9, 4), (2,)"),
        (gm.grouped_matmul, [((4, 8), i32), ((2, 8, 4), i32), ((2,), i32)],
         "grouped_matmul: lhs and rhs must both be float32 or both bfloat16, got int32 and int32"),
        (gm.grouped_matmul, [((4, 8), f32), ((2, 8, 4), f32), ((2,), f32)],
         "grouped_matmul: group_sizes must be int32, got float32"),
        (qm.quantized_matmul, [((4, 8), i32), ((8, 4), i8), ((4,), f32)],
         "quantized_matmul: x must be float32 or bfloat16, got int32"),
        (qm.quantized_matmul, [((4, 8), f32), ((8, 4), i8), ((4,), bf16)],
         "quantized_matmul: scale must be float32, got bfloat16"),
        (at.attention, [((1, 4, 8), f32), ((6, 8), f32), ((6, 8), f32)],
         "expected q (s, d), k (t, d) and v (t, d), got shapes (1, 4, 8), (6, 8), (6, 8)"),
        (at.attention, [((4, 8), f32), ((6, 8), bf16), ((6, 8), f32)],
         "q, k and v must all be float32 or all bfloat16, got float32, bfloat16, float32"),
        (at.mqa, [((2, 3, 4, 8), f32), ((3, 6, 8), f32), ((3, 6, 8), f32)],
         "expected q (b, h, s, d), k (b, t, d) and v (b, t, d), got shapes (2, 3, 4, 8), "
         "(3, 6, 8), (3, 6, 8)"),
        (pa.paged_attention,
         [((2, 3, 8), f32), ((2, 4, 8, 8), f32), ((2, 4, 8, 8), f32), ((2,), i32), ((2, 2), i32)],
         "paged_attention: the number of query heads h=3 must be a multiple of the number of kv "
         "heads g=2"),
        (pa.paged_attention,
         [((2, 4, 8), f32), ((2, 4, 8, 8), f32), ((2, 4, 8, 8), f32), ((2,), i32), ((2, 2), f32)],
         "paged_attention: page_indices must be int32, got float32"),
        (lambda x, w: norms.rms_norm(x, w, eps=1e-6), [((4, 5), f32), ((4,), f32)],
         "rms_norm expects x (rows, cols) and w (cols,), got shapes (4, 5), (4,)"),
        (lambda x, w: norms.rms_norm(x, w, eps=1e-6), [((4, 5), f32), ((5,), i32)],
         "rms_norm: x and w must be float32 or bfloat16, got float32 and int32"),
    ],
)
def test_operand_errors_word_for_word(kernel, operands, message):
    with pytest.raises(ValueError) as error:
        kernel(*_zeros(*operands))
    assert str(error.value) == message
