"""Ragged and paged attention kernels pass one ``assert_allclose`` with their own inputs.

JAX's ``ops.tpu.ragged_paged_attention`` (every JAX of the supported range ships it) and
tpu-inference's ragged paged attention v3 (the 2026 corpus: skipped where tpu-inference is
not installed, ``bash .ci/install-corpus-2026``), run through the plugin's interpreter as
the corpus runs them, are judged against float64 references with
``op="ragged_paged_attention", inputs=<the kernel's arguments>``: one call for the whole
output. The same kernels with a bug planted in their source (an off-by-one in the causal
offset of a prefill chunk, a page index read from the next sequence's table, a running
sum not rescaled when the row maximum grows) still fail it, each by at least
``_PLANTED_MARGIN`` times the tolerance (docs/comparator.md lists the measured ratios).
A bare comparison of the correct kernel fails, and its hint names this model.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytest_pallas import assert_allclose

from .corpus import _f64, _normal
from .tpu_inference_corpus import V3_DONATION

# The models' margins are measured against float32 products (docs/comparator.md); with the
# chip's numbers (bfloat16 operands) the same kernels pass the wider bfloat16 model.
pytestmark = [pytest.mark.pallas, pytest.mark.usefixtures("float32_products")]

# A planted bug must miss the model's tolerance by at least this much: far past any
# rounding (a correct kernel stays below 1), so no bug hides in the widened tolerance.
_PLANTED_MARGIN = 10.0


def _worst_error(failure: BaseException) -> float:
    found = re.findall(r"Worst error: ([0-9.e+-]+|inf) x tolerance", str(failure))
    assert found, str(failure)
    return max(float(value) for value in found)


def _with_planted_bug(module: types.ModuleType, bug: str, old: str, new: str):
    """A copy of ``module`` with the one occurrence of ``old`` in its source replaced."""
    source = inspect.getsource(module)
    if source.count(old) != 1:
        raise AssertionError(f"{module.__name__} no longer has this line exactly once, so the "
                             f"planted bug {bug!r} cannot be placed; update it: {old!r}")
    name = f"{module.__name__}_with_{bug}"
    planted = types.ModuleType(name)
    planted.__file__ = module.__file__
    sys.modules[name] = planted   # dataclasses and enums look their module up
    exec(compile(source.replace(old, new), f"{module.__file__} ({bug})", "exec"),
         planted.__dict__)
    return planted


def _ragged_reference(queries, k_of, v_of, kv_lens, cu_q_lens, sequences, scale, *,
                      sliding_window=None, soft_cap=None):
    """float64 causal attention of each sequence's query rows over its first kv_len keys
    (its queries are the last q_len of them; with a window, the last ``sliding_window``
    keys up to their own); ``k_of(s)``, ``v_of(s)``: sequence s's keys and values
    (keys, kv_heads, d)."""
    queries = _f64(queries)
    heads = queries.shape[1]
    out = np.zeros((int(cu_q_lens[sequences]), heads, queries.shape[2]))
    for s in range(sequences):
        start, end, n = int(cu_q_lens[s]), int(cu_q_lens[s + 1]), int(kv_lens[s])
        k, v = k_of(s)[:n], v_of(s)[:n]
        group = heads // k.shape[1]
        position = n - (end - start) + np.arange(end - start)[:, None]
        for head in range(heads):
            logits = scale * queries[start:end, head] @ k[:, head // group].T
            if soft_cap is not None:
                logits = soft_cap * np.tanh(logits / soft_cap)
            visible = np.arange(n)[None, :] <= position
            if sliding_window is not None:
                visible &= np.arange(n)[None, :] > position - sliding_window
            logits = np.where(visible, logits, -np.inf)
            weights = np.exp(logits - logits.max(-1, keepdims=True))
            out[start:end, head] = weights / weights.sum(-1, keepdims=True) @ v[:, head // group]
    return out


# --- JAX's ragged paged attention -------------------------------------------------------

# Three sequences: a decode (1 new token of 100), a prefill chunk (5 of 18) and a long
# chunk (64 of 130); 4 query heads on 2 kv heads, d = 128, float32, pages of 16 tokens.
# sm_scale 1, the kernel's default: logits of a few tens, where a bare comparison misses.
JAX_Q_LENS, JAX_KV_LENS = (1, 5, 64), (100, 18, 130)
HEADS, KV_HEADS, D, PAGE = 4, 2, 128, 16
JAX_PAGES_PER_SEQ, JAX_PAGES, JAX_TOKENS = 16, 64, 80
JAX_SCALE = 1.0


def _jax_args():
    """(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs) as the kernel takes them:
    a padded batch of 80 tokens and 4 page-table rows, num_seqs = 3."""
    q = _normal(360, (JAX_TOKENS, HEADS, D))
    kv_pages = _normal(361, (JAX_PAGES, PAGE, 2 * KV_HEADS, D))   # k0 v0 k1 v1
    rows = len(JAX_Q_LENS) + 1
    pages = np.random.default_rng(362).permutation(JAX_PAGES)[:rows * JAX_PAGES_PER_SEQ]
    return (q, kv_pages, jnp.asarray([*JAX_KV_LENS, 0], jnp.int32),
            jnp.asarray(pages.reshape(rows, JAX_PAGES_PER_SEQ), jnp.int32),
            jnp.asarray(np.cumsum([0, *JAX_Q_LENS, 0]), jnp.int32),
            jnp.asarray([len(JAX_Q_LENS)], jnp.int32))


def _jax_reference(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **options):
    pages = _f64(kv_pages)
    sequence = [pages[np.asarray(page_indices[s])].reshape(-1, 2 * KV_HEADS, D)
                for s in range(int(num_seqs[0]))]
    return _ragged_reference(q, lambda s: sequence[s][:, 0::2], lambda s: sequence[s][:, 1::2],
                             kv_lens, cu_q_lens, int(num_seqs[0]), JAX_SCALE, **options)


def _jax_module():
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel

    return kernel


def _jax_kernel(module, **options):
    def call(*args):
        out = module.ragged_paged_attention(*args, sm_scale=JAX_SCALE, num_kv_pages_per_block=4,
                                            num_queries_per_block=16, **options)
        return out[:sum(JAX_Q_LENS)]   # the rows past the last sequence are padding
    return call


# Each planted bug: (its name, the line of JAX's kernel, the line with the bug).
JAX_BUGS = [
    # A query row of a prefill chunk (q_len > 1) placed one position early: it no longer
    # sees its own key. Decode rows stay right.
    ("causal_offset_off_by_one", "(kv_len - q_len)\n          + q_len_start",
     "(kv_len - q_len - jnp.where(q_len > 1, 1, 0))\n          + q_len_start"),
    # The second page of every sequence taken from the next sequence's page table.
    ("page_of_next_sequence", "pages_hbm_ref.at[page_indices_ref[seq_id, page_idx]]",
     "pages_hbm_ref.at[page_indices_ref[seq_id + (page_idx == 1).astype(jnp.int32), "
     "page_idx]]"),
    # The running sum and output kept unscaled when a later kv block raises the maximum.
    ("missing_rescale", "alpha = jnp.exp(m_prev - m_next)", "alpha = jnp.ones_like(m_prev)"),
]


def _jax_model_keywords(args):
    return {"op": "ragged_paged_attention", "inputs": args, "op_params": {"sm_scale": JAX_SCALE}}


def test_jax_ragged_paged_attention_passes_one_call_with_its_own_inputs():
    args = _jax_args()
    out, expected = _jax_kernel(_jax_module())(*args), _jax_reference(*args)
    assert assert_allclose(out, expected, **_jax_model_keywords(args)) <= 1.0


# A window shorter than every chunk's keys (so blocks of keys are skipped) and a soft cap
# below the largest logits (so it bends them): the kernel's own options, the model's too.
OPTIONS = {"sliding_window": 24, "soft_cap": 20.0}


def test_with_a_sliding_window_and_a_soft_cap_it_passes_one_call():
    args = _jax_args()
    out = _jax_kernel(_jax_module(), **OPTIONS)(*args)
    expected = _jax_reference(*args, **OPTIONS)
    keywords = _jax_model_keywords(args)
    keywords["op_params"].update(OPTIONS)
    assert assert_allclose(out, expected, **keywords) <= 1.0


def test_a_bare_comparison_of_it_fails_and_the_hint_names_the_ragged_model():
    # The hint names the kernels this test traced: an earlier test's call of the same jitted
    # kernel on this worker would serve it from JAX's cache, untraced.
    jax.clear_caches()
    args = _jax_args()
    out, expected = _jax_kernel(_jax_module())(*args), _jax_reference(*args)
    with pytest.raises(AssertionError) as failure:
        assert_allclose(out, expected, reduction_length=max(JAX_KV_LENS))
    message = str(failure.value)
    assert _worst_error(failure.value) > 1.0
    hint = message.splitlines()[-1]
    assert hint.endswith('op="ragged_paged_attention", inputs=(q, kv_pages, kv_lens, '
                         'page_indices, cu_q_lens, num_seqs), op_params={"sm_scale": sm_scale}')
    assert 'op="attention"' not in message


@pytest.mark.parametrize("bug, old, new", JAX_BUGS, ids=[bug for bug, *_ in JAX_BUGS])
def test_a_planted_bug_in_jax_ragged_paged_attention_still_fails(bug, old, new):
    args = _jax_args()
    kernel = _jax_kernel(_with_planted_bug(_jax_module(), bug, old, new))
    with pytest.raises(AssertionError) as failure:
        assert_allclose(kernel(*args), _jax_reference(*args), **_jax_model_keywords(args))
    assert _worst_error(failure.value) >= _PLANTED_MARGIN


# --- tpu-inference's ragged paged attention v3 -------------------------------------------

# Four sequences as vLLM batches them: two decodes (1 new token of 70 and of 33), then two
# chunked prefills (9 new of 40, 24 new of 100); 8 query heads on 2 kv heads, d = 128,
# float32, pages of 16 tokens, 8 pages a sequence. The distribution (2, 2, 4): sequences 0
# and 1 decode-only, 2 and 3 mixed.
V3_Q_LENS, V3_KV_LENS = (1, 1, 9, 24), (70, 33, 40, 100)
V3_HEADS, V3_PAGES_PER_SEQ, V3_PAGES, V3_TOKENS = 8, 8, 40, 40
V3_SCALE = 1.0


def _v3_installed() -> bool:
    return importlib.util.find_spec("tpu_inference") is not None


needs_tpu_inference = pytest.mark.skipif(
    not _v3_installed(), reason="tpu-inference is not installed: bash .ci/install-corpus-2026 "
                                "(Python >= 3.12; docs/corpus.md)")


def _v3_module():
    from .tpu_inference_corpus import load

    return load("kernels.ragged_paged_attention.v3.kernel")


def _v3_args():
    """(queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens, distribution)."""
    queries = _normal(370, (V3_TOKENS, V3_HEADS, D))
    keys, values = (_normal(371 + i, (V3_TOKENS, KV_HEADS, D)) for i in range(2))
    kv_cache = _normal(373, (V3_PAGES, PAGE, 2 * KV_HEADS, 1, D))   # float32: packing 1
    sequences = len(V3_Q_LENS)
    pages = np.random.default_rng(374).permutation(V3_PAGES)[:sequences * V3_PAGES_PER_SEQ]
    return (queries, keys, values, kv_cache, jnp.asarray(V3_KV_LENS, jnp.int32),
            jnp.asarray(pages, jnp.int32), jnp.asarray(np.cumsum([0, *V3_Q_LENS]), jnp.int32),
            jnp.asarray([2, 2, sequences], jnp.int32))


def _v3_reference(queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens,
                  distribution):
    """Each sequence's new keys and values written at kv_len - q_len ... of its pages
    (heads interleaved k0 v0 k1 v1), then causal attention over its kv_len keys."""
    cache, keys, values = _f64(kv_cache), _f64(keys), _f64(values)
    sequence = []
    for s in range(int(distribution[-1])):
        start, end, n = int(cu_q_lens[s]), int(cu_q_lens[s + 1]), int(kv_lens[s])
        pages = np.asarray(page_indices[s * V3_PAGES_PER_SEQ:(s + 1) * V3_PAGES_PER_SEQ])
        kv = cache[pages].reshape(-1, 2 * KV_HEADS, D)
        kv[n - (end - start):n, 0::2] = keys[start:end]
        kv[n - (end - start):n, 1::2] = values[start:end]
        sequence.append(kv)
    return _ragged_reference(queries, lambda s: sequence[s][:, 0::2],
                             lambda s: sequence[s][:, 1::2], kv_lens, cu_q_lens,
                             int(distribution[-1]), V3_SCALE)


def _v3_kernel(module):
    def call(queries, keys, values, kv_cache, *metadata):
        # The kernel donates the new tokens and the cache (vLLM's update in place): copies.
        queries, keys, values, kv_cache = (jnp.copy(a) for a in (queries, keys, values,
                                                                   kv_cache))
        out, _ = module.ragged_paged_attention(
            queries, keys, values, kv_cache, *metadata, sm_scale=V3_SCALE,
            d_block_sizes=(1, 128, 1, 128), m_block_sizes=(16, 128, 16, 64))
        return out[:sum(V3_Q_LENS)]
    return call


V3_BUGS = [
    # Every query block of a prefill chunk placed one position early (decode rows have no
    # causal mask in v3).
    ("causal_offset_off_by_one", "processed_q_len = kv_q_gap + bq_idx * actual_bq_sz",
     "processed_q_len = kv_q_gap - 1 + bq_idx * actual_bq_sz"),
    # The second page fetched from the cache taken from the next sequence's page table.
    ("page_of_next_sequence",
     "cache_hbm_ref.at[pl.ds(\n"
     "                        page_indices_ref[page_idx] * page_size, sz)]",
     "cache_hbm_ref.at[pl.ds(\n                        page_indices_ref[jnp.minimum(page_idx + "
     "(pages_per_seq if i == 1 else 0), num_page_indices - 1)] * page_size, sz)]"),
    # The output accumulator not rescaled when a later kv chunk raises the row maximum.
    ("missing_rescale",
     "o_ref[...] = broadcast_minor(exp_m_diff, o_prev.shape) * o_prev + pv",
     "o_ref[...] = o_prev + pv"),
]


def _v3_model_keywords(args):
    return {"op": "ragged_paged_attention", "inputs": args, "op_params": {"sm_scale": V3_SCALE}}


@needs_tpu_inference
@V3_DONATION
def test_tpu_inference_ragged_paged_attention_v3_passes_one_call_with_its_own_inputs():
    jax.clear_caches()   # traced in this test, for the hint (as above)
    args = _v3_args()
    out, expected = _v3_kernel(_v3_module())(*args), _v3_reference(*args)
    assert assert_allclose(out, expected, **_v3_model_keywords(args)) <= 1.0
    with pytest.raises(AssertionError) as failure:
        assert_allclose(out, expected, reduction_length=max(V3_KV_LENS))
    assert _worst_error(failure.value) > 1.0
    assert str(failure.value).splitlines()[-1].endswith(
        'op="ragged_paged_attention", inputs=(queries, keys, values, kv_cache, kv_lens, '
        'page_indices, cu_q_lens, distribution), op_params={"sm_scale": sm_scale}')


@needs_tpu_inference
@V3_DONATION
@pytest.mark.parametrize("bug, old, new", V3_BUGS, ids=[bug for bug, *_ in V3_BUGS])
def test_a_planted_bug_in_tpu_inference_v3_still_fails(bug, old, new):
    args = _v3_args()
    kernel = _v3_kernel(_with_planted_bug(_v3_module(), bug, old, new))
    with pytest.raises(AssertionError) as failure:
        assert_allclose(kernel(*args), _v3_reference(*args), **_v3_model_keywords(args))
    assert _worst_error(failure.value) >= _PLANTED_MARGIN


# --- paged decode attention (the suite's op, JAX's paged_attention) ---------------------

def _paged_args():
    """The suite's paged_attention: 4 sequences of lengths 1, 16, 17 and 64 (pages of 16,
    4 a sequence), 4 query heads on 2 kv heads, float32, unscaled logits of a few tens."""
    from pytest_pallas.reference_kernels.paged_attention import paged_attention_inputs

    dims = {"b": 4, "h": 4, "g": 2, "d": D, "pages": 16, "page_size": PAGE,
            "pages_per_sequence": 4}
    q, k_pages, v_pages, lengths, page_indices = paged_attention_inputs(
        dims, "float32", np.random.default_rng(380))
    return (jnp.asarray(q) * 2, jnp.asarray(k_pages), jnp.asarray(v_pages),
            jnp.asarray(lengths), jnp.asarray(page_indices))


def test_the_suite_paged_attention_passes_one_call_with_its_own_inputs():
    from pytest_pallas.reference_kernels.paged_attention import (
        paged_attention,
        paged_attention_reference,
    )

    args = _paged_args()
    out, expected = paged_attention(*args), paged_attention_reference(*args)
    assert assert_allclose(out, expected, op="paged_attention", inputs=args) <= 1.0
    # Its reduction length is the longest sequence's, read from lengths.
    from pytest_pallas.ops.error_models import paged_attention_model

    assert paged_attention_model(args).reduction_length == int(np.max(args[3]))


def test_a_paged_attention_with_the_wrong_page_fails_the_paged_model():
    from pytest_pallas.reference_kernels.paged_attention import (
        paged_attention,
        paged_attention_reference,
    )

    args = _paged_args()
    q, k_pages, v_pages, lengths, page_indices = args
    # The longest sequence (the capacity, 64 tokens) reads its second page from the next
    # sequence's table.
    longest = int(np.argmax(lengths))
    wrong = np.asarray(page_indices).copy()
    wrong[longest, 1] = wrong[(longest + 1) % len(wrong), 1]
    out = paged_attention(q, k_pages, v_pages, lengths, jnp.asarray(wrong))
    with pytest.raises(AssertionError) as failure:
        assert_allclose(out, paged_attention_reference(*args), op="paged_attention",
                        inputs=args)
    assert _worst_error(failure.value) >= _PLANTED_MARGIN


# --- the model's derivation, without a kernel ----------------------------------------------

def test_the_ragged_model_grows_with_the_visible_keys_only():
    # A key no query sees (past kv_len, or outside the window) does not widen the model.
    args = list(_jax_args())
    base = _ragged_model(args)
    pages = np.asarray(args[1]).copy()
    table = np.asarray(args[3])
    # Token 120 of sequence 0 (kv_len 100) is past its length: make its key huge.
    page, offset = table[0, 120 // PAGE], 120 % PAGE
    pages[page, offset] = 1e3
    args[1] = jnp.asarray(pages)
    assert _ragged_model(args).atol == base.atol
    windowed = _ragged_model(_jax_args(), sliding_window=8)
    assert windowed.reduction_length == 8 and windowed.atol <= base.atol
    assert base.reduction_length == max(JAX_KV_LENS)


def _ragged_model(args, **params):
    from pytest_pallas.ops.error_models import ragged_paged_attention_model

    return ragged_paged_attention_model(args, params={"sm_scale": JAX_SCALE, **params})


def test_a_wrong_number_of_inputs_names_both_layouts():
    with pytest.raises(ValueError, match=r"inputs=\(q, kv_pages.*inputs=\(queries, keys"):
        assert_allclose(np.zeros(1), np.zeros(1), op="ragged_paged_attention",
                        inputs=(np.zeros(1),) * 3)
    with pytest.raises(ValueError, match="op_params sm_scale, soft_cap"):
        assert_allclose(np.zeros(1), np.zeros(1), op="ragged_paged_attention",
                        inputs=_jax_args(), op_params={"scale": 1.0})

