"""Error models of ops: the error a correct kernel of an op cannot avoid, as an extra atol.

The comparator's default tolerance covers rounding the output and a
reduction's accumulation. Some ops add an error of their own that scales with
their inputs rather than with the output; a correct kernel (and plain XLA)
reaches a few times the default tolerance without it. The conformance suite
and ``assert_allclose(..., op=NAME, inputs=...)`` both take the allowance from
here, so a user's own test of such a kernel gets the suite's verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import epsilon, matmul_epsilon

# How far a correct evaluation of the activation in the output dtype may be from the float64
# oracle, in units of eps(dtype) * max|x @ y|. jax.nn.gelu in float32 is off by up to 1.4 ulp
# of |z| (at z = 4.14) and jax.nn.silu by 1.2 (z = 8.69), measured over z in [-30, 30];
# near z = -4 the 1 + tanh of gelu cancels, and a result of -7e-5 is off by 1.5e-7.
_ACTIVATION_ULPS = {"gelu": 2.0, "silu": 2.0}


def _dtype_name(array: Any) -> str:
    return np.dtype(getattr(array, "dtype", np.float32)).name


def _float64(array: Any) -> np.ndarray:
    return np.asarray(np.asarray(array).astype(np.float32), np.float64)


def attention_allowance(q: Any, k: Any, v: Any, *,
                        matmul_precision: str = "float32") -> tuple[float, str]:
    """The extra atol of ``softmax(q @ k.T) @ v``: its logits' rounding, in base e or base 2.

    q is (..., s, d), k and v (..., t, d) with broadcastable leading axes; for
    a scaled kernel pass ``q * sm_scale``. With B = max sum |q||k| (the largest
    logit a rounding can touch) and u = eps32 / 2, in natural units:

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
    error times max|v|: ``(eps_acc + 2 * eps32) * B * max|v|``. Measured:
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
    q64, k64, v64 = _float64(q), _float64(k), _float64(v)
    logit_bound = float(np.max(np.abs(q64) @ np.swapaxes(np.abs(k64), -1, -2), initial=0.0))
    # bfloat16 inputs multiply exactly into float32 sums; only float32 inputs
    # on a backend whose dot rounds operands to bfloat16 (a TPU) lose more.
    # (a GPU's TensorFloat-32 likewise, with 10 mantissa bits instead of 7).
    accumulator = (matmul_precision if matmul_precision in ("bfloat16", "tensorfloat32")
                   and _dtype_name(q) == "float32" else "float32")
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
    name = np.dtype(dtype).name if dtype is not None else _dtype_name(x)
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


# How far past the default tolerance (in its units) a correct kernel of an op with an error
# model of its own has been seen to fail a bare comparison, per output dtype: float32
# attention with logits of magnitude 30 reaches about 750 (tests/test_error_models.py), a
# bfloat16 one a few units, its default being wide already. A miss beyond that is no rounding.
_ROUNDING_MARGIN = {"float32": 1000.0, "bfloat16": 10.0, "float16": 10.0}


def error_model_hint(worst_errors: Sequence[tuple[str, float]], *,
                     reduction_length_given: bool) -> str | None:
    """For a bare ``assert_allclose`` that failed: the keywords that add a known error model,
    when every failed output (``(dtype name, worst error in tolerance units)``) missed by a
    margin that rounding of such an op could explain; else None."""
    if not worst_errors or not all(
            worst <= _ROUNDING_MARGIN.get(dtype, 0.0) for dtype, worst in worst_errors):
        return None
    models = [
        'attention\'s logits: op="attention", inputs=(q, k, v) (q * sm_scale for a scaled '
        "kernel)",
        'an activation after a matmul: op="matmul_activation", inputs=(x, y), '
        'op_params={"activation": "gelu"} (or "silu")',
        'an RMS norm: op="rms_norm", inputs=(x, w), op_params={"eps": eps}',
    ]
    if not reduction_length_given:
        models.append("a long reduction: reduction_length=K, the number of terms summed")
    return ("pallas: a correct kernel misses the default tolerance by this much when its op "
            "rounds in ways the default does not cover; if this output is one of these, pass "
            "its error model to assert_allclose: " + "; ".join(models) + ".")
