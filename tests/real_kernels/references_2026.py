"""float64 references the 2026 corpus shares: attention with sinks and windows, and its VJP.

Every function takes JAX or NumPy arrays and computes in float64 NumPy, so a
kernel's float32 result is judged against the exact answer, not against
another float32 computation.
"""

from __future__ import annotations

import numpy as np

from .corpus import _f64


def softmax64(logits: np.ndarray, sinks: np.ndarray | None = None) -> np.ndarray:
    """softmax over the last axis; a sink is one more logit per head with no value."""
    top = logits.max(-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks[..., None, None])
    weights = np.exp(logits - top)
    denominator = weights.sum(-1, keepdims=True)
    if sinks is not None:
        denominator = denominator + np.exp(sinks[..., None, None] - top)
    return weights / denominator


def attention_weights64(q, k, *, mask=None, scale=1.0, sinks=None) -> np.ndarray:
    """float64 softmax(scale * q k^T, masked) over (..., s, t); k may lack q's head axis."""
    q, k = _f64(q), _f64(k)
    logits = scale * np.einsum("...sd,...td->...st", q, k)
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    return softmax64(logits, None if sinks is None else _f64(sinks))


def attention_forward64(q, k, v, *, mask=None, scale=1.0, sinks=None) -> np.ndarray:
    weights = attention_weights64(q, k, mask=mask, scale=scale, sinks=sinks)
    return np.einsum("...st,...td->...sd", weights, _f64(v))


def attention_vjp64(q, k, v, d_out, *, mask=None, scale=1.0, sinks=None,
                    shared_kv: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of attention at (q, k, v) for the cotangent ``d_out``, in float64.

    ``shared_kv``: k and v are (t, d) shared by every head of q (h, s, d), MQA,
    so their gradients sum over the heads.
    """
    q, k, v, d_out = _f64(q), _f64(k), _f64(v), _f64(d_out)
    p = attention_weights64(q, k, mask=mask, scale=scale, sinks=sinks)
    dp = np.einsum("...sd,...td->...st", d_out, v)
    # A sink has no value, so it adds nothing to dp; its weight is only in p's denominator.
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = scale * np.einsum("...st,...td->...sd", ds, k)
    dk = scale * np.einsum("...st,...sd->...td", ds, q)
    dv = np.einsum("...st,...sd->...td", p, d_out)
    if shared_kv:
        dk, dv = dk.sum(0), dv.sum(0)
    return dq, dk, dv


def causal_mask(s: int, t: int) -> np.ndarray:
    return np.tril(np.ones((s, t), bool))


def local_mask(s: int, t: int, left: int, right: int) -> np.ndarray:
    """Key j visible from query i when i - left <= j <= i + right."""
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    return (j >= i - left) & (j <= i + right)
