"""Classes 3 and 4: attention's error model, public, and covering the base-2 formulation.

A user's own test of an attention kernel gets the allowance the conformance
suite applies (``assert_allclose(out, ref, op="attention", inputs=(q, k, v))``),
and that allowance covers the usual TPU formulation of softmax in base 2
(``exp2(s * log2(e) - m2)``), while the usual wrong kernels still fail. The
formulation that needed the base-2 term (q scaled by log2(e) before the dot, as
tokamax's kernel does) is tested in test_exp2_attention.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeded_bugs import kernels as wrong

from pytest_pallas import assert_allclose, error_models, operations
from pytest_pallas.ops import registry
from pytest_pallas.ops.domains import Domain
from pytest_pallas.ops.error_models import error_model_hint
from pytest_pallas.ops.inputs import sweep, sweep_case
from pytest_pallas.strategies import as_dtype
from pytest_pallas.suite.properties import expected_output, judge_value

LOG2_E = 1.4426950408889634


@jax.jit
def attention_exp2(q, k, v):
    """softmax in base 2, as tokamax's TPU flash attention does by default (float32 throughout)."""
    logits2 = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * jnp.float32(LOG2_E)
    weights = jnp.exp2(logits2 - logits2.max(axis=-1, keepdims=True))
    out = jnp.dot(weights, v.astype(jnp.float32)) / weights.sum(axis=-1, keepdims=True)
    return out.astype(q.dtype)


def _attention64(q, k, v):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = q @ np.swapaxes(k, -1, -2)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


@pytest.mark.pallas
def test_jax_flash_attention_passes_assert_allclose_with_the_attention_error_model():
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    q, k, v = (jax.random.normal(jax.random.key(i), (1, 2, 256, 128)) for i in range(3))
    blocks = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
    out = fa.flash_attention(q, k, v, block_sizes=blocks)
    expected = _attention64(q, k, v)
    # The bare float32 default is too tight (under the chip's numbers the run's default is
    # bfloat16's, wide enough without the model).
    with pytest.raises(AssertionError, match="Worst error"):
        assert_allclose(out, expected, reduction_length=256, matmul_precision="float32")
    assert assert_allclose(out, expected, reduction_length=256, op="attention",
                           inputs=(q, k, v)) <= 1.0


def test_error_model_message_names_the_allowance():
    q = np.ones((8, 128), np.float32)
    expected = _attention64(q, q, q)
    with pytest.raises(AssertionError, match="logits rounded in float32"):
        assert_allclose(np.float32(expected + 1.0), expected, op="attention", inputs=(q, q, q))


def test_unknown_op_and_missing_inputs_are_one_line_usage_errors():
    x = np.ones((8, 128), np.float32)
    with pytest.raises(ValueError, match="no such op; the known ones are"):
        assert_allclose(x, x, op="conv", inputs=(x,))
    with pytest.raises(ValueError, match=r"needs inputs="):
        assert_allclose(x, x, op="attention")


def test_suite_and_public_function_give_the_same_allowance():
    case = sweep_case(operations.attention, Domain(), 0)
    public, _ = error_models.attention_allowance(*case.args)
    suite, _ = registry.op_allowance("attention", case.args)
    assert public == suite > 0


def _one_ulp_up(array):
    """``array`` with its largest element moved one ulp (one, for integers) away from 0."""
    moved = np.array(array, copy=True)
    at = np.unravel_index(np.argmax(np.abs(moved.astype(np.float64))), moved.shape)
    if moved.dtype.kind in "iu":
        moved[at] += 1
    else:
        bits = moved.view(np.uint16 if moved.dtype.itemsize == 2 else np.uint32)
        bits[at] += 1
    return moved


@pytest.mark.parametrize("matmul_precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("op", operations.BUILT_IN, ids=lambda op: op.name)
def test_the_suite_and_assert_allclose_judge_every_built_in_op_alike(op, matmul_precision):
    # One model per op: on every sweep case, a result the oracle's rounded to the output
    # dtype and one an ulp off get the same verdict and the same worst error from the suite
    # and from assert_allclose(op=..., inputs=the case's arguments, op_params=its keywords;
    # a collective's device count too, which its global arrays do not show).
    for index in range(len(sweep(op))):
        case = sweep_case(op, Domain(), index)
        expected = expected_output(case)
        params = dict(case.kwargs, **({"devices": case.dims["devices"]} if op.collective
                                      else {}))
        rounded = np.asarray(expected).astype(as_dtype(case.dtype))
        for actual in (rounded, _one_ulp_up(rounded)):
            verdicts, suite_worst, _ = judge_value(case, actual, expected,
                                                   matmul_precision=matmul_precision)
            try:
                worst = assert_allclose(actual, expected, op=op.name, inputs=case.args,
                                        op_params=params, matmul_precision=matmul_precision)
            except AssertionError:
                worst = None
            where = f"{op.name} sweep case {index} ({case.dtype}, {case.profile})"
            assert (worst is not None) == verdicts["value"], where
            assert worst is None or worst == suite_worst, where


def test_a_collective_sum_without_its_device_count_is_a_usage_error():
    case = sweep_case(operations.reduce_scatter, Domain(), 0)
    with pytest.raises(ValueError, match=r"pass the device count, op_params=\{'devices': n\}"):
        assert_allclose(expected_output(case), expected_output(case), op="reduce_scatter",
                        inputs=case.args)


ATTENTION_SWEEP = range(len(sweep(operations.attention)))


@pytest.mark.parametrize("index", ATTENTION_SWEEP)
def test_exp2_attention_passes_every_sweep_case(index):
    case = sweep_case(operations.attention, Domain(), index)
    verdicts, worst, message = judge_value(case, attention_exp2(*case.args),
                                           expected_output(case), matmul_precision="float32")
    assert all(verdicts.values()), message


@pytest.mark.pallas
@pytest.mark.parametrize("kernel", [wrong.attention_missing_rescale,
                                    wrong.attention_no_max_subtraction])
def test_wrong_attention_kernels_still_fail_the_sweep(kernel):
    failed = []
    for index in ATTENTION_SWEEP:
        case = sweep_case(operations.attention, Domain(), index)
        verdicts, worst, _ = judge_value(case, kernel(*case.args), expected_output(case),
                                         matmul_precision="float32")
        failed.append(not all(verdicts.values()))
    assert any(failed)


def _float32_attention(q, k, v):
    logits = q @ k.T
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ v


@pytest.mark.parametrize("logit_scale", [1.0, 30.0])
def test_a_bare_comparison_of_correct_attention_names_the_keywords_that_pass_it(logit_scale):
    # Correct float32 attention (no Pallas: the rounding of any float32 evaluation) misses
    # the bare default tolerance; the failure must say which keywords add its error model.
    rng = np.random.default_rng(0)
    q = (rng.standard_normal((128, 64)) * logit_scale).astype(np.float32)
    k, v = (rng.standard_normal((256, 64)).astype(np.float32) for _ in range(2))
    out = _float32_attention(q, k, v)
    expected = _float32_attention(*(x.astype(np.float64) for x in (q, k, v)))
    with pytest.raises(AssertionError) as failure:
        assert_allclose(out, expected)
    assert 'op="attention", inputs=(q, k, v)' in str(failure.value)
    assert "reduction_length=K" in str(failure.value)
    assert assert_allclose(out, expected, op="attention", inputs=(q, k, v)) <= 1.0


def test_a_wrong_kernel_gets_no_error_model_hint():
    # Off by a whole key block's weight: no rounding explains that, and no hint says so.
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((64, 32)).astype(np.float32) for _ in range(3))
    expected = _float32_attention(*(x.astype(np.float64) for x in (q, k, v)))
    wrong_out = _float32_attention(q, k[:-8], v[:-8])
    with pytest.raises(AssertionError) as failure:
        assert_allclose(wrong_out, expected)
    assert "error model" not in str(failure.value)


@pytest.mark.parametrize("title, keywords", [
    ("'paged_attention at reference_kernels/paged_attention.py:240'",
     'op="paged_attention", inputs=(q, k_pages, v_pages, lengths, page_indices)'),
    ("'paged_flash_attention_kernel at paged_attention_kernel.py:40'",
     'op="paged_attention", inputs=(q, k_pages, v_pages, lengths, page_indices)'),
    ("'ragged_paged_attention_kernel at kernel.py:290'",
     'op="ragged_paged_attention", inputs=(q, kv_pages, kv_lens, page_indices, cu_q_lens, '
     'num_seqs), op_params={"sm_scale": sm_scale}'),
    ("'RPAm-p_16-bq_16_16-bkv_128_64 at kernel.py:278'",
     'op="ragged_paged_attention", inputs=(queries, keys, values, kv_cache, kv_lens, '
     'page_indices, cu_q_lens, distribution), op_params={"sm_scale": sm_scale}'),
])
def test_the_hint_of_a_traced_paged_kernel_is_its_model_on_one_line(title, keywords):
    hint = error_model_hint([("float32", 3.5)], reduction_length_given=True,
                            kernels=["'matmul at k.py:1'", title], shapes=[(70, 4, 128)])
    assert "\n" not in hint and hint.endswith(keywords)
    assert 'op="attention"' not in hint
    # An output of another rank (a matmul's, in the same test) is not that kernel's.
    other = error_model_hint([("float32", 3.5)], reduction_length_given=True,
                             kernels=[title], shapes=[(64, 128)])
    assert 'op="attention", inputs=(q, k, v)' in other and "\n" in other


def test_a_bare_comparison_outside_a_pallas_test_lists_every_model_one_a_line():
    rng = np.random.default_rng(2)
    q = (rng.standard_normal((128, 64)) * 30).astype(np.float32)
    k, v = (rng.standard_normal((256, 64)).astype(np.float32) for _ in range(2))
    with pytest.raises(AssertionError) as failure:
        assert_allclose(_float32_attention(q, k, v),
                        _float32_attention(*(x.astype(np.float64) for x in (q, k, v))))
    lines = str(failure.value).splitlines()
    for keywords in ('op="attention", inputs=(q, k, v)',
                     'op="paged_attention", inputs=(q, k_pages, v_pages, lengths, page_indices)',
                     'op="ragged_paged_attention", inputs=(q, kv_pages, kv_lens, page_indices, '
                     'cu_q_lens, num_seqs)'):
        assert sum(keywords in line for line in lines) == 1, keywords


# --- rms_norm: rsqrt and two products in float32 ------------------------------------------

# The main job's failing input (seed 1502051407): one column, the "large" profile. The
# reference kernel, compiled as the suite compiles it, returned 819804.4375 for 819804.5.
RMS_ROW = np.float32([[441705.75], [-4056.9333], [-4932.2095], [4673.4077], [1234.5]])
RMS_WEIGHT = np.float32([-819804.5])


def _rms_norm_float32(x, w, eps):
    x32 = x.astype(np.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * w


def test_a_correct_rms_norm_of_one_column_passes_with_its_error_model():
    from pytest_pallas.reference_kernels import norms
    from pytest_pallas.suite.properties import suite_jit

    expected = norms.rms_norm_reference(RMS_ROW.astype(np.float64),
                                        RMS_WEIGHT.astype(np.float64), eps=1e-6)
    # Off by an ulp or two of float32, as rsqrt and the products round (819804.4375 here).
    actual = np.float32(expected)
    actual[1, 0] = np.nextafter(np.nextafter(actual[1, 0], np.float32(0)), np.float32(0))
    with pytest.raises(AssertionError):
        assert_allclose(actual, expected, reduction_length=1)
    assert assert_allclose(actual, expected, reduction_length=1, op="rms_norm",
                           inputs=(RMS_ROW, RMS_WEIGHT), op_params={"eps": 1e-6}) <= 1
    # And the kernel itself, compiled as the suite compiles it, on the CPU.
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode(True):
        kernel = np.asarray(suite_jit(lambda x, w: norms.rms_norm(x, w, eps=1e-6))(
            RMS_ROW, RMS_WEIGHT))
    assert assert_allclose(kernel, expected, reduction_length=1, op="rms_norm",
                           inputs=(RMS_ROW, RMS_WEIGHT), op_params={"eps": 1e-6}) <= 1


def test_rms_norm_without_eps_still_fails_on_small_rows():
    from seeded_bugs.structure import rms_norm_without_eps

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1)).astype(np.float32)
    w = rng.standard_normal(1).astype(np.float32)
    expected = (x.astype(np.float64) / np.sqrt(x.astype(np.float64) ** 2 + 1e-6)
                * w.astype(np.float64))
    wrong_result = np.asarray(rms_norm_without_eps(x, w, eps=1e-6))
    with pytest.raises(AssertionError):
        assert_allclose(wrong_result, expected, reduction_length=1, op="rms_norm",
                        inputs=(x, w), op_params={"eps": 1e-6})
    right = np.asarray(jax.jit(_rms_norm_float32, static_argnums=2)(x, w, 1e-6))
    assert assert_allclose(right, expected, reduction_length=1, op="rms_norm",
                           inputs=(x, w), op_params={"eps": 1e-6}) <= 1
