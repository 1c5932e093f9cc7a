"""Error models of ops: the error a correct kernel of an op cannot avoid, as an extra atol.

The comparator's default tolerance covers rounding the output and a
reduction's accumulation. Some ops add an error of their own that scales with
their inputs rather than with the output; a correct kernel (and plain XLA)
reaches a few times the default tolerance without it. Each op's model has one
home, here: the op's record names it (``ops/builtins.py``), and the conformance
suite and ``assert_allclose(..., op=NAME, inputs=...)`` both judge by the record
(``Operation.error_model``), so a user's own test of such a kernel gets the suite's
verdict. Every attention op (dense, grouped, paged, ragged) takes attention's model
(``attention_allowance``); the paged ones per sequence, reading a kernel's own arguments
(page tables, kv lengths, cumulative query lengths), which size the reduction length too.
Ragged paged attention has no conformance record: its model is the comparator's alone
(``COMPARATOR_MODELS``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..dtypes import dot_rounding, epsilon, matmul_epsilon

# How far a correct evaluation of the activation in the output dtype may be from the float64
# oracle, in units of eps(dtype) * max|x @ y|. jax.nn.gelu in float32 is off by up to 1.4 ulp
# of |z| (at z = 4.14) and jax.nn.silu by 1.2 (z = 8.69), measured over z in [-30, 30];
# near z = -4 the 1 + tanh of gelu cancels, and a result of -7e-5 is off by 1.5e-7.
_ACTIVATION_ULPS = {"gelu": 2.0, "silu": 2.0}


def name_of_dtype(array: Any) -> str:
    return np.dtype(getattr(array, "dtype", np.float32)).name


def _float64(array: Any) -> np.ndarray:
    return np.asarray(np.asarray(array).astype(np.float32), np.float64)


def attention_allowance(q: Any, k: Any, v: Any, *, matmul_precision: str = "float32",
                        sm_scale: float = 1.0) -> tuple[float, str]:
    """The extra atol of ``softmax(sm_scale * q @ k.T) @ v``: its logits' rounding, in base e
    or base 2.

    q is (..., s, d), k and v (..., t, d) with broadcastable leading axes (a mask
    only narrows the bound: it is ignored). With B = max sum |sm_scale * q||k| (the
    largest logit a rounding can touch) and u = eps32 / 2, in natural units:

    * each logit is a d-term dot rounded to the accumulator: an error of
      ``eps_acc * B`` (the model of a dot product's rounding, not the worst
      case of a d-term sum);
    * a kernel that exponentiates in base 2 rounds more, in float32 whatever
      the inputs' dtype (the scaling is elementwise, not on the MXU). Scaling
      after the dot (``exp2(s * log2(e) - m2)``) rounds each logit by u * B;
      scaling q before it, as tokamax's TPU flash attention does (``q *=
      LOG2E``), rounds each element of q by u, which moves a logit by u * B
      too, and makes the dot inexact even where the base-e one is exact
      (integer q and k: the dot's term above then counts). The constant
      log2(e) rounded to float32 moves a logit by u * B more, and ``s2 - m2``
      (up to 2 B apart) rounds by 2u * B: ``4u * B = 2 * eps32 * B`` in all.

    Softmax turns logit errors e into weight errors w * (e - mean_w e), so the
    output moves by ``sum_j w_j (e_j - mean_w e) v_j``, at most the logit
    error times max|v| (the weighted mean distance of errors within +-delta from
    their mean is at most delta): ``(eps_acc + 2 * eps32) * B * max|v|``. Measured:
    tokamax's kernel, and the same online softmax written in base 2 in
    tests/test_exp2_attention.py, reach 0.51 of the tolerance on mha's offset
    sweep case (1.5 with the base-e term alone: the scaled q's roundings, at
    partial sums near -256 * log2(e)). A missing rescale, a missing max
    subtraction, exp2 of logits not scaled by log2(e) or a dropped mask
    still fail: in float32 by 1,700 to 22,000 times the tolerance or with
    non-finite outputs, in bfloat16 by 3.4 to 18 times (tests/test_compare.py,
    tests/test_exp2_attention.py).

    Returns ``(atol, reason)``.

    >>> import numpy as np
    >>> q = np.ones((4, 8), np.float32)
    >>> attention_allowance(q, q, q)[0] > 0
    True
    """
    q64, k64, v64 = _float64(q) * abs(float(sm_scale)), _float64(k), _float64(v)
    logit_bound = float(np.max(np.abs(q64) @ np.swapaxes(np.abs(k64), -1, -2), initial=0.0))
    accumulator = dot_rounding(matmul_precision, name_of_dtype(q))
    logit_error = (matmul_epsilon(accumulator) + 2 * epsilon("float32")) * logit_bound
    extra = logit_error * float(np.max(np.abs(v64), initial=0.0))
    return extra, (f"logits rounded in {accumulator} and scaled to base 2 in float32 "
                   f"(max sum |q||k| = {logit_bound:.3g}) add {extra:.3g}")


def activation_allowance(x: Any, y: Any, *, activation: str | None,
                         dtype: Any = None) -> tuple[float, str]:
    """The extra atol of ``activation(x @ y)``: gelu and silu rounded in the output dtype.

    The default tolerance scales with max|output|; an activation's rounding
    scales with its input z = x @ y instead, and gelu and silu shrink large
    negative z to tiny outputs whose absolute error stays about eps * |z|.
    Without this term plain XLA's ``jax.nn.gelu`` fails the float32 tolerance
    (1.27 times it, for z = -4); a wrong or missing activation is still off
    by far more than 2 ulp of |z|. Returns ``(atol, reason)``.
    """
    ulps = _ACTIVATION_ULPS.get(activation or "")
    if not ulps:
        return 0.0, ""
    name = np.dtype(dtype).name if dtype is not None else name_of_dtype(x)
    bound = float(np.max(np.abs(_float64(x) @ _float64(y)), initial=0.0))
    extra = ulps * epsilon(name) * bound
    return extra, (f"{activation} evaluated in {name} (max |x @ y| = {bound:.3g}) "
                   f"adds {extra:.3g}")


# How far the reciprocal square root and the two products of rms_norm, all in float32, may
# move an output past its own rounding (the default tolerance's one ulp), in units of
# eps(float32) * max|output|: XLA's CPU lax.rsqrt is off by up to 2.0 ulp (2 million
# inputs from 1e-17 to 1e17; 1.7 when compiled at LLVM's -O3, 2.0 at -O0, as the suite
# compiles), and x * rsqrt(x * x + eps) * w reaches 3.0 ulp of its result.
_RMS_NORM_ULPS = 2.0


def rms_norm_allowance(x: Any, w: Any, *, eps: float) -> tuple[float, str]:
    """The extra atol of ``x / sqrt(mean(x**2, -1) + eps) * w`` computed in float32.

    The default tolerance grows with the reduction length ``cols`` (the sum of squares)
    but, at ``cols = 1`` or a few, it is about one ulp, and rsqrt and the products round
    more: a correct float32 kernel missed it by 1.02 times on a row of one column. The
    term is ``2 * eps32 * max|output|``, in float32 whatever x's dtype (the kernel
    computes in float32; a bfloat16 output's own rounding is far above it). A kernel that
    drops eps is still off by far more on small rows (``x / |x|``: 4 ulp at |x| = 1,
    400 at 0.1). Returns ``(atol, reason)``.
    """
    x64, w64 = _float64(x), _float64(w)
    output = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w64
    bound = float(np.max(np.abs(output), initial=0.0))
    if not np.isfinite(bound):
        return 0.0, ""
    extra = _RMS_NORM_ULPS * epsilon("float32") * bound
    return extra, (f"rsqrt and two products in float32 (max |output| = {bound:.3g}) "
                   f"add {extra:.3g}")


# --- paged and ragged paged attention: the attention model per sequence ----------------------
#
# Both take their keys and values through page tables and attend per sequence, so a dense
# ``op="attention", inputs=(q, k, v)`` does not fit their arguments. These models read the
# arguments as the kernels are called, cut them into sequences, and apply attention's
# derivation (``attention_allowance``) to each sequence over the keys its queries see:
#
# * the logit bound B_s is max sum_d |q_id * sm_scale| |k_jd| over sequence s's query
#   tokens i and the keys j visible to them (within kv_lens[s], causal, in the window), and
#   the logit error (eps_acc + 2 eps32) B_s as for dense attention;
# * a soft cap c * tanh(logit / c) does not grow that error (its slope is at most 1) but
#   adds its own rounding: logit / c rounds by u B_s, tanh by at most 1 ulp of its result
#   (<= eps32 * min(B_s, c) once times c) and the product by u min(B_s, c), u = eps32 / 2:
#   eps32 * (B_s / 2 + 3 / 2 * min(B_s, c)) in all;
# * the output moves by at most the logit error times max |v| over the visible values.
#
# The extra atol is the worst sequence's, and the comparator's reduction length (its
# eps_acc * (1 + log2 L) term, the sums over keys of softmax and of P @ V) is the most keys
# one query row sees: min(kv_len, sliding_window) at the longest sequence. Nothing else is
# added: no factor was tuned on a kernel's output.


@dataclasses.dataclass(frozen=True)
class ErrorModel:
    """What an op's error model adds to the comparator's default: ``atol`` (an absolute
    error a correct kernel may carry beyond it, ``why`` says where from), the
    ``reduction_length`` the default's accumulation term is sized by, the
    ``matmul_precision`` that term is judged at and whether the op compares bit for bit
    (``exact``); None: the caller's."""

    atol: float
    why: str
    reduction_length: int | None = None
    matmul_precision: str | None = None
    exact: bool | None = None


@dataclasses.dataclass(frozen=True)
class _Sequence:
    """One sequence of a paged or ragged call, in float64: q (tokens, heads, d) already
    scaled by sm_scale, k and v (keys, heads, d) with the kv heads repeated for their query
    heads, and ``visible[i, j]`` when query token i sees key j."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    visible: np.ndarray


# The op_params each paged or ragged model reads; anything else is a usage error.
_PAGED_PARAMS = ("sm_scale", "soft_cap", "sliding_window", "k_scale", "v_scale")


def _paged_params(op_name: str, params: dict[str, Any] | None) -> dict[str, Any]:
    params = dict(params or {})
    unknown = sorted(set(params) - set(_PAGED_PARAMS))
    if unknown:
        raise ValueError(f"op={op_name!r} takes op_params {', '.join(_PAGED_PARAMS)} (the "
                         f"kernel's keyword arguments of those names), not {', '.join(unknown)}")
    window = params.get("sliding_window")
    if window is not None and int(window) <= 0:
        raise ValueError(f"op={op_name!r}: sliding_window={window} must be positive (or None)")
    return params


def _repeat_heads(kv: np.ndarray, heads: int) -> np.ndarray:
    """(keys, kv_heads, d) -> (keys, heads, d): query head j reads kv head j // (heads // g)."""
    groups = kv.shape[1]
    if heads % groups:
        raise ValueError(f"{heads} query heads are not a multiple of {groups} kv heads")
    return np.repeat(kv, heads // groups, axis=1)


def _causal_visible(q_len: int, kv_len: int, window: int | None) -> np.ndarray:
    """Query token i of a chunk of q_len ending at kv_len sits at kv_len - q_len + i and sees
    the keys at or before it (the last ``window`` of them with a sliding window)."""
    position = kv_len - q_len + np.arange(q_len)[:, None]
    key = np.arange(kv_len)[None, :]
    visible = key <= position
    if window is not None:
        visible &= key > position - int(window)
    return visible


def _ragged_sequence(queries: np.ndarray, k: np.ndarray, v: np.ndarray, q_start: int,
                     q_end: int, kv_len: int, params: dict[str, Any]) -> _Sequence:
    scale = float(params.get("sm_scale") or 1.0) * float(params.get("k_scale") or 1.0)
    q = queries[q_start:q_end] * scale
    k = _repeat_heads(k[:kv_len], q.shape[1])
    v = _repeat_heads(v[:kv_len], q.shape[1]) * float(params.get("v_scale") or 1.0)
    if q_end - q_start > kv_len:
        raise ValueError(f"a sequence has {q_end - q_start} query tokens but a kv length of "
                         f"{kv_len}: its queries are the last of its keys, so kv_len >= q_len")
    return _Sequence(q, k, v, _causal_visible(q_end - q_start, kv_len,
                                              params.get("sliding_window")))


def _jax_ragged_sequences(inputs: Sequence[Any], params: dict[str, Any]):
    """JAX's ``ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens,
    num_seqs)``: kv_pages (pages, page_size, 2 * kv_heads, d) with K and V interleaved
    along the combined head axis (k0 v0 k1 v1 ...), page_indices (max_num_seqs,
    pages_per_seq)."""
    queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs = inputs
    queries, kv_pages = _float64(queries), _float64(kv_pages)
    kv_lens, page_indices = np.asarray(kv_lens), np.asarray(page_indices)
    cu_q_lens = np.asarray(cu_q_lens)
    if kv_pages.ndim != 4 or kv_pages.shape[2] % 2 or page_indices.ndim != 2:
        raise ValueError(
            "op='ragged_paged_attention' with 6 inputs reads JAX's layout: q (tokens, heads, d), "
            "kv_pages (pages, page_size, 2 * kv_heads, d), kv_lens, page_indices (seqs, "
            f"pages_per_seq), cu_q_lens, num_seqs; got kv_pages {kv_pages.shape} and "
            f"page_indices {page_indices.shape}")
    d = kv_pages.shape[-1]
    for s in range(int(np.asarray(num_seqs).reshape(-1)[0])):
        kv = kv_pages[page_indices[s]].reshape(-1, kv_pages.shape[2], d)
        yield _ragged_sequence(queries, kv[:, 0::2], kv[:, 1::2], int(cu_q_lens[s]),
                               int(cu_q_lens[s + 1]), int(kv_lens[s]), params)


def _tpu_inference_ragged_sequences(inputs: Sequence[Any], params: dict[str, Any]):
    """tpu-inference's ragged paged attention v3, ``(queries, keys, values, kv_cache,
    kv_lens, page_indices, cu_q_lens, distribution)``: kv_cache (pages, page_size,
    2 * kv_heads // packing, packing, d padded to 128) holds K and V interleaved along its
    combined head axis, as ``merge_kv`` packs them; page_indices is flat (max_num_seqs *
    pages_per_seq); the call first writes each sequence's new keys and values (its q_len
    tokens of ``keys``, ``values``) at kv_len - q_len ..., then attends over the cache."""
    queries, keys, values, kv_cache, kv_lens, page_indices, cu_q_lens, distribution = inputs
    queries, keys, values = _float64(queries), _float64(keys), _float64(values)
    kv_cache = _float64(kv_cache)
    kv_lens, page_indices = np.asarray(kv_lens), np.asarray(page_indices).reshape(-1)
    cu_q_lens = np.asarray(cu_q_lens)
    if kv_cache.ndim != 5 or keys.ndim != 3 or values.shape != keys.shape:
        raise ValueError(
            "op='ragged_paged_attention' with 8 inputs reads tpu-inference's v3 layout: "
            "queries (tokens, heads, d), keys and values (tokens, kv_heads, d), kv_cache "
            "(pages, page_size, 2 * kv_heads // packing, packing, d), kv_lens, page_indices, "
            f"cu_q_lens, distribution; got kv_cache {kv_cache.shape} and keys {keys.shape}")
    pages, page_size = kv_cache.shape[:2]
    combined, cache_d = kv_cache.shape[2] * kv_cache.shape[3], kv_cache.shape[4]
    kv_heads, d = keys.shape[1], keys.shape[2]
    pages_per_seq = page_indices.size // kv_lens.size
    for s in range(int(np.asarray(distribution).reshape(-1)[-1])):
        q_start, q_end, kv_len = int(cu_q_lens[s]), int(cu_q_lens[s + 1]), int(kv_lens[s])
        used = page_indices[s * pages_per_seq:s * pages_per_seq + -(-kv_len // page_size)]
        kv = kv_cache[used].reshape(-1, combined, cache_d)[:, :2 * kv_heads, :d].copy()
        kv[kv_len - (q_end - q_start):kv_len, 0::2] = keys[q_start:q_end]
        kv[kv_len - (q_end - q_start):kv_len, 1::2] = values[q_start:q_end]
        yield _ragged_sequence(queries, kv[:, 0::2], kv[:, 1::2], q_start, q_end, kv_len,
                               params)


def _paged_sequences(inputs: Sequence[Any], params: dict[str, Any]):
    """``paged_attention(q, k_pages, v_pages, lengths, page_indices)``, the suite's op and
    JAX's ``ops.tpu.paged_attention``: one query token per sequence, q (b, heads, d),
    k_pages and v_pages (kv_heads, pages, page_size, d), page_indices (b, pages_per_seq)."""
    q, k_pages, v_pages, lengths, page_indices = inputs
    q, k_pages, v_pages = _float64(q), _float64(k_pages), _float64(v_pages)
    page_indices = np.asarray(page_indices)
    if q.ndim != 3 or k_pages.ndim != 4 or page_indices.ndim != 2:
        raise ValueError(
            "op='paged_attention' reads q (b, heads, d), k_pages and v_pages (kv_heads, pages, "
            f"page_size, d), lengths (b,), page_indices (b, pages_per_seq); got q {q.shape}, "
            f"k_pages {k_pages.shape}, page_indices {page_indices.shape}")
    if params.get("sliding_window") is not None:
        raise ValueError("op='paged_attention' has no sliding window (one query token per "
                         "sequence sees its whole length)")
    g, d = k_pages.shape[0], k_pages.shape[-1]
    for i, length in enumerate(np.asarray(lengths).reshape(-1).tolist()):
        k = np.swapaxes(k_pages[:, page_indices[i]].reshape(g, -1, d), 0, 1)
        v = np.swapaxes(v_pages[:, page_indices[i]].reshape(g, -1, d), 0, 1)
        yield _ragged_sequence(q[i:i + 1], k, v, 0, 1, int(length), params)


def _per_sequence_attention(op_name: str, sequences: Iterator[_Sequence], *, dtype: str,
                            matmul_precision: str, soft_cap: float | None) -> ErrorModel:
    """``attention_allowance``'s derivation per sequence (the comment above); the worst one."""
    accumulator = dot_rounding(matmul_precision, dtype)
    eps32 = epsilon("float32")
    worst, worst_bound, longest, count = 0.0, 0.0, 0, 0
    for sequence in sequences:
        count += 1
        if not sequence.visible.any():
            continue
        # sum_d |q_id| |k_jd| over the visible pairs only, one head at a time (a long
        # prefill's tokens x keys is large enough; times the heads it need not be).
        bound = max(float(np.max(np.where(
            sequence.visible, np.abs(sequence.q[:, head]) @ np.abs(sequence.k[:, head]).T, 0.0),
            initial=0.0)) for head in range(sequence.q.shape[1]))
        seen = sequence.visible.any(axis=0)
        value = float(np.max(np.abs(sequence.v[seen]), initial=0.0))
        logit_error = (matmul_epsilon(accumulator) + 2 * eps32) * bound
        if soft_cap is not None:
            logit_error += eps32 * (bound / 2 + 1.5 * min(bound, abs(float(soft_cap))))
        worst = max(worst, logit_error * value)
        worst_bound = max(worst_bound, bound)
        longest = max(longest, int(sequence.visible.sum(axis=1).max()))
    why = (f"{op_name}: logits rounded in {accumulator} and scaled to base 2 in float32 over "
           f"each of {count} sequences' visible keys (max sum |q||k| = {worst_bound:.3g}"
           f"{', soft cap' if soft_cap is not None else ''}) add {worst:.3g}")
    return ErrorModel(worst, why, longest or None)


def paged_attention_model(inputs: Sequence[Any], *, matmul_precision: str = "float32",
                          params: dict[str, Any] | None = None) -> ErrorModel:
    """The error model of a paged decode attention called as
    ``paged_attention(q, k_pages, v_pages, lengths, page_indices)`` (the suite's op,
    JAX's ``ops.tpu.paged_attention``): attention's per sequence, over its first
    ``lengths[i]`` tokens; reduction length max(lengths). ``params``: ``sm_scale``
    (default 1: the suite's and JAX's kernels take q already scaled), ``soft_cap``
    (JAX's ``attn_logits_soft_cap``), ``k_scale``, ``v_scale``.

    >>> import numpy as np
    >>> q = np.ones((1, 2, 4), np.float32); pages = np.ones((1, 2, 2, 4), np.float32)
    >>> paged_attention_model((q, pages, pages, np.array([3]), np.array([[1, 0]]))).reduction_length
    3
    """
    if len(inputs) != 5:
        raise ValueError("op='paged_attention' needs inputs=(q, k_pages, v_pages, lengths, "
                         f"page_indices), the kernel's arguments; got {len(inputs)} inputs")
    params = _paged_params("paged_attention", params)
    return _per_sequence_attention("paged_attention", _paged_sequences(inputs, params),
                                   dtype=name_of_dtype(inputs[0]),
                                   matmul_precision=matmul_precision,
                                   soft_cap=params.get("soft_cap"))


def ragged_paged_attention_model(inputs: Sequence[Any], *, matmul_precision: str = "float32",
                                 params: dict[str, Any] | None = None) -> ErrorModel:
    """The error model of a ragged paged attention, its inputs as the kernel is called:

    * JAX's ``ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens,
      num_seqs)`` (6 inputs);
    * tpu-inference's v3 ``ragged_paged_attention(queries, keys, values, kv_cache, kv_lens,
      page_indices, cu_q_lens, distribution)`` (8 inputs; the new keys and values are
      written into the cache first, as the kernel does).

    Every sequence's query tokens (rows cu_q_lens[s] to cu_q_lens[s + 1] of q, token-major)
    attend causally over its first kv_lens[s] keys, the queries being the last q_len of
    them; query head j reads kv head j // (heads // kv_heads). ``params``: the kernel's
    ``sm_scale``, ``sliding_window``, ``soft_cap``, ``k_scale``, ``v_scale``. The model is
    attention's (``attention_allowance``) per sequence over its visible keys, the worst
    sequence's; the reduction length is the most keys a query row sees.
    """
    params = _paged_params("ragged_paged_attention", params)
    if len(inputs) == 6:
        sequences = _jax_ragged_sequences(inputs, params)
    elif len(inputs) == 8:
        sequences = _tpu_inference_ragged_sequences(inputs, params)
    else:
        raise ValueError(
            "op='ragged_paged_attention' needs the kernel's arguments: inputs=(q, kv_pages, "
            "kv_lens, page_indices, cu_q_lens, num_seqs) for JAX's kernel, or inputs=(queries, "
            "keys, values, kv_cache, kv_lens, page_indices, cu_q_lens, distribution) for "
            f"tpu-inference's v3; got {len(inputs)} inputs")
    return _per_sequence_attention("ragged_paged_attention", sequences,
                                   dtype=name_of_dtype(inputs[0]),
                                   matmul_precision=matmul_precision,
                                   soft_cap=params.get("soft_cap"))


# The comparator's own models: ops whose arguments no conformance record describes.
COMPARATOR_MODELS = {
    "ragged_paged_attention": ragged_paged_attention_model,
}


# How far past the default tolerance (in its units) a correct kernel of an op with an error
# model of its own has been seen to fail a bare comparison, per output dtype: float32
# attention with logits of magnitude 30 reaches about 750 (tests/test_error_models.py), a
# bfloat16 one a few units, its default being wide already. A miss beyond that is no rounding.
_ROUNDING_MARGIN = {"float32": 1000.0, "bfloat16": 10.0, "float16": 10.0}


# The keywords of each error model, as a user pastes them into the failing call.
_PAGED_KEYWORDS = 'op="paged_attention", inputs=(q, k_pages, v_pages, lengths, page_indices)'
_JAX_RAGGED_KEYWORDS = ('op="ragged_paged_attention", inputs=(q, kv_pages, kv_lens, '
                        'page_indices, cu_q_lens, num_seqs), op_params={"sm_scale": sm_scale}')
_V3_RAGGED_KEYWORDS = ('op="ragged_paged_attention", inputs=(queries, keys, values, kv_cache, '
                       'kv_lens, page_indices, cu_q_lens, distribution), '
                       'op_params={"sm_scale": sm_scale}')

# Kernels recognised by their title (the pallas_call's name, else its body's): JAX's ragged
# paged attention, tpu-inference's v3 (named "RPAd-...", "RPAp-...", "RPAm-..." by its
# case), the suite's paged_attention and JAX's paged_flash_attention_kernel.
_V3_RAGGED_KERNEL = re.compile(r"\bRPA[dpm]-")
_RAGGED_KERNEL = re.compile(r"ragged_paged_attention", re.I)
_PAGED_KERNEL = re.compile(r"paged_(?:flash_)?attention", re.I)


def _fitting_model(kernels: Sequence[str]) -> tuple[str, str] | None:
    """(what the kernel is, the keywords of its model) when a traced kernel names a paged
    or ragged attention, the most recent one first; else None."""
    for kernel in reversed(list(kernels)):
        if _V3_RAGGED_KERNEL.search(kernel):
            return (f"kernel {kernel} is tpu-inference's ragged paged attention (v3)",
                    _V3_RAGGED_KEYWORDS)
        if _RAGGED_KERNEL.search(kernel):
            return f"kernel {kernel} is a ragged paged attention", _JAX_RAGGED_KEYWORDS
        if _PAGED_KERNEL.search(kernel):
            return f"kernel {kernel} is a paged attention", _PAGED_KEYWORDS
    return None


def error_model_hint(worst_errors: Sequence[tuple[str, float]], *,
                     reduction_length_given: bool,
                     kernels: Sequence[str] = (),
                     shapes: Sequence[tuple[int, ...]] = ()) -> str | None:
    """For a bare ``assert_allclose`` that failed: the keywords that add a known error model,
    when every failed output (``(dtype name, worst error in tolerance units)``) missed by a
    margin that rounding of such an op could explain; else None.

    ``kernels``: the titles of the kernels the test traced; ``shapes``: those of the failed
    outputs. When a kernel is a paged or ragged attention and a failed output has the
    rank of its output ((b, heads, d) or (tokens, heads, d)), the hint gives that model's
    keywords alone, on one line to paste; else every model, each with the layout of the
    output it fits.
    """
    if not worst_errors or not all(
            worst <= _ROUNDING_MARGIN.get(dtype, 0.0) for dtype, worst in worst_errors):
        return None
    lead = ("pallas: a correct kernel misses the default tolerance by this much when its op "
            "rounds in ways the default does not cover")
    fitting = _fitting_model(kernels) if any(len(shape) == 3 for shape in shapes) else None
    if fitting is not None:
        what, keywords = fitting
        return (f"{lead}; {what}: pass its error model, its arguments as the kernel takes "
                f"them, to the one assert_allclose of its whole output: {keywords}")
    models = [
        'dense attention, output (..., s, d): op="attention", inputs=(q, k, v) (q * sm_scale '
        "for a scaled kernel)",
        f"paged decode attention, output (b, heads, d): {_PAGED_KEYWORDS}",
        f"ragged paged attention, token-major output (tokens, heads, d): {_JAX_RAGGED_KEYWORDS}"
        f" (tpu-inference's v3: inputs=(queries, keys, values, kv_cache, kv_lens, "
        "page_indices, cu_q_lens, distribution))",
        'an activation after a matmul: op="matmul_activation", inputs=(x, y), '
        'op_params={"activation": "gelu"} (or "silu")',
        'an RMS norm: op="rms_norm", inputs=(x, w), op_params={"eps": eps}',
    ]
    if not reduction_length_given:
        models.append("a long reduction: reduction_length=K, the number of terms summed")
    return (f"{lead}; if this output is one of these, pass its error model to "
            "assert_allclose:\n" + "\n".join(f"  {model}" for model in models))
