"""reference_kernels.paged_attention: page tables in SMEM, double-buffered page DMAs, GQA."""

import jax
import numpy as np
import pytest
from seeded_bugs import new_ops as bugs

from pytest_pallas import assert_allclose
from pytest_pallas.reference_kernels import paged_attention as pa

pytestmark = pytest.mark.pallas


@pytest.fixture(autouse=True)
def _tpu_interpreter(pallas_backend):
    if pallas_backend.interpreter == "plain":
        pytest.skip("manual DMAs and semaphores need TPU interpret mode (--pallas-interpret=tpu)")


def _inputs(dtype, seed=0, **dims):
    return pa.paged_attention_inputs(dims, dtype, np.random.default_rng(seed))


def assert_within_allowance(out, q, k_pages, v_pages, lengths, page_indices):
    """The op's error model, as the suite judges it: the default for the output dtype with
    reduction length the longest sequence, plus attention's logit allowance per sequence."""
    args = (q, k_pages, v_pages, lengths, page_indices)
    expected = pa.paged_attention_reference(*args)
    assert out.shape == expected.shape and out.dtype == q.dtype
    assert_allclose(out, expected, op="paged_attention", inputs=args)


@pytest.mark.parametrize(
    "dims, dtype",
    [
        # b=4 sequences of lengths 1, 8 (a page boundary), 9 and 32 (full), in random order.
        pytest.param(dict(b=4, h=2, g=2, d=16, pages=20, page_size=8, pages_per_sequence=4),
                     "float32", id="mha-f32"),
        pytest.param(dict(b=4, h=4, g=2, d=16, pages=20, page_size=16, pages_per_sequence=3),
                     "bfloat16", id="gqa2-bf16"),
        pytest.param(dict(b=3, h=4, g=1, d=8, pages=12, page_size=8, pages_per_sequence=4),
                     "float32", id="mqa-f32"),
        pytest.param(dict(b=1, h=1, g=1, d=1, pages=1, page_size=1, pages_per_sequence=1),
                     "float32", id="1-token"),
        # Ragged page size and head dim; fewer pages than table slots: pages shared.
        pytest.param(dict(b=2, h=3, g=3, d=5, pages=3, page_size=3, pages_per_sequence=2),
                     "float32", id="ragged-shared-pages"),
    ],
)
def test_paged_attention(dims, dtype):
    args = _inputs(dtype, seed=dims["b"] + dims["page_size"], **dims)
    out = jax.jit(pa.paged_attention)(*args)
    assert_within_allowance(out, *args)


def test_the_input_builder_stresses_lengths_and_pages():
    q, k_pages, v_pages, lengths, page_indices = _inputs(
        "float32", b=5, h=2, g=1, d=8, pages=30, page_size=8, pages_per_sequence=4)
    assert {1, 8, 9, 32} <= set(lengths.tolist()) and lengths.dtype == np.int32
    assert len(set(page_indices.ravel().tolist())) == page_indices.size  # a permutation
    assert (np.diff(page_indices, axis=1) != 1).any()  # not laid out in order


# --- the allowance is tight ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(bugs.paged_attention_stale_last_page, id="stale-last-page"),
        pytest.param(bugs.paged_attention_ignores_page_table, id="ignores-page-table"),
    ],
)
def test_seeded_bugs_fail_and_the_kernel_passes(bug):
    """Lengths of 2 pages and a half: the partial page's buffer last held page 0."""
    q, k_pages, v_pages, _, page_indices = _inputs(
        "float32", seed=5, b=2, h=2, g=1, d=16, pages=8, page_size=8, pages_per_sequence=4)
    lengths = np.array([20, 28], np.int32)
    args = (q, k_pages, v_pages, lengths, page_indices)
    assert_within_allowance(pa.paged_attention(*args), *args)
    with pytest.raises(AssertionError, match="Arrays are not close"):
        assert_within_allowance(bug(*args), *args)


# --- validation, oracle and cost ------------------------------------------------------------------


@pytest.mark.parametrize(
    "shapes, message",
    [
        ([(2, 3, 8), (2, 4, 8, 8), (2, 4, 8, 8), (2,), (2, 2)],
         "the number of query heads h=3 must be a multiple of the number of kv heads g=2"),
        ([(2, 4, 8), (2, 4, 8, 8), (2, 4, 8, 8), (3,), (2, 2)], "matching b, g and d"),
        ([(2, 4, 8), (2, 4, 8, 8), (2, 4, 8, 8), (2,), (2,)], "page_indices (b, pages_per"),
    ],
)
def test_validation(shapes, message):
    arrays = [np.zeros(shape, np.float32 if i < 3 else np.int32) for i, shape in enumerate(shapes)]
    with pytest.raises(ValueError) as error:
        pa.paged_attention(*arrays)
    assert message in str(error.value)


def test_oracle_reads_through_the_page_table():
    pages = np.arange(4.0).reshape(1, 2, 2, 1)  # page 0: tokens 0, 1; page 1: tokens 2, 3
    out = pa.paged_attention_reference(np.zeros((1, 1, 1)), pages, pages, np.array([3]),
                                       np.array([[1, 0]]))
    assert out[0, 0, 0] == pytest.approx((2 + 3 + 0) / 3)


def test_cost_model():
    cost = pa.paged_attention_cost(jax.ShapeDtypeStruct((2, 4, 16), np.float32),
                                   jax.ShapeDtypeStruct((2, 10, 8, 16), np.float32),
                                   jax.ShapeDtypeStruct((2, 10, 8, 16), np.float32),
                                   jax.ShapeDtypeStruct((2,), np.int32),
                                   jax.ShapeDtypeStruct((2, 3), np.int32))
    assert cost.flops == 2 * 4 * 24 * (4 * 16 + 4)
    assert cost.bytes_accessed == 4 * (2 * 2 * 4 * 16 + 2 * 2 * 2 * 24 * 16) + 4 * (2 + 6)
