"""Class 4: attention in base 2, the way tokamax's TPU flash attention computes it by default.

tokamax's splash kernel (``use_base2_exp=True``) multiplies the q block by
log2(e) *before* the dot product (``q *= LOG2E``), keeps its running maximum
in base 2 and exponentiates with ``exp2``. On the "offset" value profile
(integer q and k with one feature shifting every logit by -256) the base-e
logits are exact float32 integers, but the scaled q is not: every step of the
d-term float32 dot then rounds at the magnitude of a partial sum near -256 *
log2(e). Before the error model had its base-2 term, such a correct kernel
failed ``mha``'s and ``mqa``'s offset sweep case at 1.3 to 1.65 times the
tolerance (s and t multiples of 128, as tokamax requires).

The kernel below is written the way tokamax writes it (online softmax over kv
blocks of 128, m and l in float32 scratch, ``exp2``); the same kernel with one
mistake each (no log2(e) scaling, no max subtraction, no rescale) must still
fail.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas import assert_allclose, operations
from pytest_pallas.ops.domains import Domain
from pytest_pallas.ops.inputs import sweep, sweep_case
from pytest_pallas.suite.properties import expected_output

LOG2E = math.log2(math.e)
BLOCK = 128
# tokamax's blocks are 128: its sequence lengths and head dimension are multiples of 128,
# which a user declares with @supports(multiple_of=...).
TOKAMAX_SHAPES = Domain(multiple_of={"s": BLOCK, "t": BLOCK, "d": BLOCK})


def _kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, base2_scale: bool,
            subtract_max: bool, rescale: bool):
    kv = pl.program_id(1)

    @pl.when(kv == 0)
    def _initialise():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    q = q_ref[...]
    if base2_scale:
        q *= LOG2E  # as tokamax's splash kernel: logits, and so m, in base 2
    logits = lax.dot_general(q, k_ref[...], (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    m_prev = m_ref[...]
    m_next = jnp.maximum(m_prev, logits.max(axis=1, keepdims=True))
    p = jnp.exp2(logits - m_next) if subtract_max else jnp.exp2(logits)
    alpha = jnp.exp2(m_prev - m_next) if (rescale and subtract_max) else 1.0
    l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p, v_ref[...].astype(jnp.float32),
                                                  preferred_element_type=jnp.float32)
    m_ref[...] = m_next

    @pl.when(kv == pl.num_programs(1) - 1)
    def _write_back():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def exp2_attention(q, k, v, *, base2_scale=True, subtract_max=True, rescale=True):
    """``softmax(q @ k.T) @ v`` for (s, d) q and (t, d) k, v; s, t multiples of 128."""
    (s, d), t = q.shape, k.shape[0]
    kernel = functools.partial(_kernel, base2_scale=base2_scale, subtract_max=subtract_max,
                               rescale=rescale)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((s, d), q.dtype),
        grid=(s // BLOCK, t // BLOCK),
        in_specs=[pl.BlockSpec((BLOCK, d), lambda i, j: (i, 0)),
                  pl.BlockSpec((BLOCK, d), lambda i, j: (j, 0)),
                  pl.BlockSpec((BLOCK, d), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((BLOCK, d), lambda i, j: (i, 0)),
        scratch_shapes=[pltpu.VMEM((BLOCK, 1), jnp.float32), pltpu.VMEM((BLOCK, 1), jnp.float32),
                        pltpu.VMEM((BLOCK, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(q, k, v)


def for_op(op: str, **mistakes):
    """``exp2_attention`` over the leading axes of ``op``'s arguments (mqa shares k and v)."""
    kernel = functools.partial(exp2_attention, **mistakes)
    if op == "attention":
        return jax.jit(kernel)
    if op == "mqa":  # q (b, h, s, d), k and v (b, t, d): one k and v per batch element
        return jax.jit(jax.vmap(jax.vmap(kernel, in_axes=(0, None, None))))
    return jax.jit(jax.vmap(jax.vmap(kernel)))  # mha


def _offset_case(op: str, dtype: str = "float32"):
    operation = getattr(operations, op)
    index = sweep(operation, TOKAMAX_SHAPES).index((dtype, "offset"))
    return sweep_case(operation, TOKAMAX_SHAPES, index)


def _softmax64_of(logits2, v):
    """float64 softmax in base 2 of the given base-2 logits, times v."""
    logits2 = np.asarray(logits2, np.float64)
    weights = np.exp2(logits2 - logits2.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ np.asarray(v, np.float64)


@pytest.mark.pallas
@pytest.mark.parametrize("op", ["mha", "mqa"])
def test_base2_attention_passes_the_offset_sweep_case(op):
    case = _offset_case(op)
    out = for_op(op)(*case.args)
    assert assert_allclose(out, expected_output(case), reduction_length=case.args[1].shape[-2],
                           op=op, inputs=case.args) <= 1.0


@pytest.mark.pallas
def test_base2_attention_error_is_the_rounding_of_its_logits():
    """The proof that the kernel is right: its deviation from the float64 oracle is the
    rounding of its float32 base-2 logits. Given those logits, the rest of the kernel is
    within the bare default tolerance of a float64 softmax of them; and that float64
    softmax, exact but for the logits, is as far from the oracle as the kernel (beyond the
    bare tolerance, within the error model's)."""
    case = _offset_case("attention")
    q, k, v = case.args
    t = k.shape[0]
    out = for_op("attention")(q, k, v)
    logits2 = lax.dot_general(jnp.asarray(q) * LOG2E, jnp.asarray(k), (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.float32)
    from_rounded_logits = _softmax64_of(logits2, v)
    expected = expected_output(case)
    assert assert_allclose(out, from_rounded_logits, reduction_length=t) <= 1.0
    with pytest.raises(AssertionError, match="Worst error"):
        assert_allclose(np.float32(from_rounded_logits), expected, reduction_length=t)
    kernel_error = np.abs(np.asarray(out, np.float64) - expected).max()
    logits_error = np.abs(from_rounded_logits - expected).max()
    assert logits_error == pytest.approx(kernel_error, rel=0.2)
    assert assert_allclose(np.float32(from_rounded_logits), expected, reduction_length=t,
                           op="attention",
                           inputs=case.args) <= 1.0


@pytest.mark.pallas
@pytest.mark.parametrize("mistake", [dict(base2_scale=False), dict(subtract_max=False),
                                     dict(rescale=False)],
                         ids=["exp2-of-unscaled-logits", "no-max-subtraction", "missing-rescale"])
def test_wrong_base2_kernels_fail_the_sweep(mistake):
    kernel = for_op("attention", **mistake)
    failed = []
    for index in range(len(sweep(operations.attention, TOKAMAX_SHAPES))):
        case = sweep_case(operations.attention, TOKAMAX_SHAPES, index)
        try:
            assert_allclose(kernel(*case.args), expected_output(case),
                            reduction_length=case.args[1].shape[0], op="attention",
                            inputs=case.args)
        except AssertionError:
            failed.append(case.profile)
    assert failed, f"{mistake} passed every sweep case"
