"""Flash attention with a causal mask, a softmax scale and grouped key/value heads.

Contract op (docs/contract.md section 2, version 0.2):

* ``flash_attention(q, k, v, *, causal, sm_scale)``: ``softmax(sm_scale * q @ k.T
  + mask) @ v`` per (batch, head). q is ``(b, h, s, d)``, k and v ``(b, g, t, d)``
  with h a multiple of g: g = h is multi-head attention (MHA), 1 < g < h
  grouped-query attention (GQA), g = 1 multi-query attention (MQA). With
  ``causal=True`` query i does not see key j > i.

Tunable variant: ``flash_attention_blocked(..., block_q=, block_kv=)``. Beside the
kernel: its float64 oracle ``flash_attention_reference``, its cost model
``flash_attention_cost`` and an input builder ``flash_attention_inputs`` (which
keeps h a multiple of g).

The TPU ideas, on top of the online softmax of ``attention.py`` (running maximum
``m``, denominator ``l`` and unnormalised output ``acc`` in float32 VMEM scratch,
rescaled by ``exp(m_prev - m_new)`` when a kv block raises the maximum):

* **Grouped heads cost no copies.** The grid is ``(b, h, q blocks, kv blocks)``;
  the index map of k and v sends query head ``i`` to kv head ``i // (h // g)``,
  so the ``h // g`` query heads of a group read the same k and v blocks from
  HBM and k and v are never repeated to h heads.
* **Causal block skipping.** Under the mask, a kv block whose first key comes
  after the q block's last query contributes nothing. Its step does no work
  (``pl.when``), and its index map clamps the kv block index to the last block
  the q block needs: consecutive grid steps asking for the same block make the
  pipeline skip the copy, so the skipped blocks cost neither MXU time nor HBM
  bandwidth. About half the (s, t) plane is never touched when s = t.
* **Masking inside the online softmax.** In a block that straddles the
  diagonal, masked logits are set to ``-inf`` before the running maximum is
  taken, so they get weight ``exp(-inf) = 0``. Every row keeps a finite maximum
  because key 0 is visible to every query and kv block 0 is processed first.
* **The scale is applied to the float32 logits**, not to q: scaling a bfloat16
  q would round ``sm_scale * q`` to bfloat16 before the dot product.

Sizes need not be multiples of the TPU tile: an axis that fits one block is one
block; a longer one is padded with zeros to a multiple of its block, padded keys
are masked and padded queries sliced away.

The error a correct kernel may carry is attention's error model
(``pytest_pallas.ops.error_models.attention_allowance``, derived there, not tuned),
which the conformance suite and ``assert_allclose(out, expected, op="flash_attention",
inputs=(q, k, v), op_params={"sm_scale": sm_scale})`` both judge by: the logits'
rounding, ``(eps_acc + 2 * eps32) * sm_scale * max_ij sum_d |q_id k_jd| * max|v|``
(the dot's rounding, and a base-2 kernel's scaling), beyond the comparator's default
tolerance for the output dtype with reduction length t (exp, the t-term sums of the
denominator and of ``p @ v``, the output's rounding). A bfloat16 accumulator (an
error of 2**-9 relative per kv block) is far over it for float32.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas.ops.domains import supports

from ._tiling import output_struct, pad_to, round_up
from .attention import (
    DEFAULT_BLOCK_KV,
    DEFAULT_BLOCK_Q,
    online_softmax_step,
    resolve_attention_blocks,
)
from .operand_checks import (
    require_head_groups,
    require_matching,
    require_one_float_dtype,
    require_ranks,
)

__all__ = [
    "DEFAULT_BLOCK_KV",
    "DEFAULT_BLOCK_Q",
    "flash_attention",
    "flash_attention_blocked",
    "flash_attention_cost",
    "flash_attention_inputs",
    "flash_attention_reference",
]

# --- operands ----------------------------------------------------------------------------


def _check_operands(q: Any, k: Any, v: Any) -> tuple[int, int]:
    """Validate the shapes; return (h, g)."""
    expects = "flash_attention expects q (b, h, s, d), k (b, g, t, d) and v (b, g, t, d)"
    require_ranks(expects, (q, k, v), (4, 4, 4))
    (b, h, _, d), (bk, g, t, dk) = q.shape, k.shape
    require_matching(expects, (q, k, v), dims="b, g, t and d",
                     agree=b == bk == v.shape[0] and g == v.shape[1] and t == v.shape[2]
                     and d == dk)
    require_head_groups("flash_attention", h, g,
                        hint=" (g = h: MHA, 1 < g < h: GQA, g = 1: MQA)")
    require_one_float_dtype("", q=q, k=k, v=v)
    return h, g


def _static_params(causal: Any, sm_scale: Any) -> tuple[bool, float]:
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"flash_attention: causal must be True or False, got {causal!r}")
    try:
        scale = float(sm_scale)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise TypeError(
            f"flash_attention: sm_scale must be a Python float known when tracing (it is baked "
            f"into the kernel), got {sm_scale!r}"
        ) from None
    return bool(causal), scale


# --- the oracle ----------------------------------------------------------------------------


def _float64(array: Any) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def _grouped(q: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """k or v ``(b, g, t, d)`` repeated to the h query heads: head i reads kv head i // (h//g)."""
    return np.repeat(kv, q.shape[1] // kv.shape[1], axis=1)


def flash_attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool,
                              sm_scale: float) -> np.ndarray:
    """``softmax(sm_scale * q @ k.T + mask) @ v`` per (batch, head), in float64 NumPy.

    q ``(b, h, s, d)``, k and v ``(b, g, t, d)``; query head i uses kv head
    ``i // (h // g)``. ``causal`` masks key j for query i when j > i.

    >>> q = np.zeros((1, 2, 2, 1)); kv = np.arange(2.0).reshape(1, 1, 2, 1)
    >>> flash_attention_reference(q, kv, kv, causal=True, sm_scale=1.0)[0, :, :, 0]
    array([[0. , 0.5],
           [0. , 0.5]])
    """
    q, k, v = _float64(q), _grouped(q, _float64(k)), _grouped(q, _float64(v))
    logits = sm_scale * np.einsum("bhsd,bhtd->bhst", q, k)
    if causal:
        s, t = logits.shape[-2:]
        logits = np.where(np.arange(t)[None, :] > np.arange(s)[:, None], -np.inf, logits)
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("bhst,bhtd->bhsd", weights, v)


def flash_attention_inputs(dims: dict[str, int], dtype: str, rng: np.random.Generator
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q, k, v)`` for dimensions ``b, h, g, s, t, d`` in ``dtype``.

    The one structure of the op: h must be a multiple of g, so a drawn g that
    does not divide h becomes the largest divisor of h below it (g = 1, MQA,
    always qualifies). Values are standard normal; q is scaled by a random
    power of ten between 0.1 and 10 so that the softmax ranges from nearly
    uniform to nearly one-hot.
    """
    b, h, g, s, t, d = (int(dims[name]) for name in ("b", "h", "g", "s", "t", "d"))
    g = max(divisor for divisor in range(1, min(g, h) + 1) if h % divisor == 0)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    q = rng.standard_normal((b, h, s, d)) * 10.0 ** rng.uniform(-1, 1)
    k = rng.standard_normal((b, g, t, d))
    v = rng.standard_normal((b, g, t, d))
    return q.astype(np_dtype), k.astype(np_dtype), v.astype(np_dtype)


# --- the cost model ----------------------------------------------------------------------------


def _visible_pairs(s: int, t: int, causal: bool) -> int:
    """How many (query, key) pairs the mask lets through."""
    if not causal:
        return s * t
    # Query i sees keys 0 .. min(i, t - 1).
    return sum(min(i + 1, t) for i in range(s))


def _visited_kv_blocks(s: int, t: int, block_q: int, block_kv: int, causal: bool) -> int:
    """kv blocks the kernel computes on, summed over the q blocks (padding included)."""
    num_q, num_kv = -(-s // block_q), -(-t // block_kv)
    if not causal:
        return num_q * num_kv
    return sum(min(num_kv, (qb * block_q + block_q - 1) // block_kv + 1) for qb in range(num_q))


def flash_attention_cost(q: Any, k: Any, v: Any, *, causal: bool = False, sm_scale: float = 1.0,
                         block_q: int | None = None, block_kv: int | None = None
                         ) -> pl.CostEstimate:
    """Flops, transcendentals and HBM bytes of ``flash_attention`` (anything with shape/dtype).

    Without blocks: the least work (only the (query, key) pairs the mask lets
    through) and the least traffic (q, k, v read once, the output written once).
    With blocks: what the kernel does, whole blocks on and below the diagonal,
    k and v read once per q block for each kv block it visits.
    """
    del sm_scale
    b, h, s, d = q.shape
    _, g, t, dv = v.shape
    itemsize = jnp.dtype(q.dtype).itemsize
    if block_q is None or block_kv is None:
        pairs = _visible_pairs(s, t, causal)
        kv_rows = g * t
        transcendentals = b * h * pairs
    else:
        blocks = _visited_kv_blocks(s, t, block_q, block_kv, causal)
        pairs = blocks * block_q * block_kv
        # Each query head reads its kv blocks (the heads of a group read the same
        # blocks, but in separate grid steps, so each is a separate copy).
        kv_rows = h * blocks * block_kv
        transcendentals = b * h * (pairs + blocks * block_q)  # exp of logits and of the rescale
    return pl.CostEstimate(
        # q @ k.T and p @ v, plus scale, max, subtract, exp and sum over the logits.
        flops=b * h * (2 * pairs * d + 2 * pairs * dv + 5 * pairs),
        transcendentals=transcendentals,
        bytes_accessed=itemsize * b * (h * s * d + kv_rows * (d + dv) + h * s * dv),
    )


# --- the kernel --------------------------------------------------------------------------------


def _last_kv_block(q_block: Any, block_q: int, block_kv: int) -> Any:
    """The last kv block holding a key that a query of q block ``q_block`` may see.

    ``lax.div`` (truncating) rather than ``//``: equal on these non-negative
    indices, and jnp's floor division lowers through a sign test that Mosaic
    lowers only knowing the chip.
    """
    return jax.lax.div(q_block * block_q + block_q - 1, block_kv)


def _flash_attention_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
                            causal: bool, sm_scale: float, block_q: int, block_kv: int,
                            kv_len: int, num_kv_blocks: int):
    """One (batch, head, q block, kv block) grid step; m, l and acc carry across kv steps."""
    q_block, kv_block = pl.program_id(2), pl.program_id(3)

    @pl.when(kv_block == 0)
    def _initialise():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def _fold_block():
        logits = jax.lax.dot_general(
            q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
        ) * sm_scale
        column = kv_block * block_kv + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        visible = None
        if kv_len % block_kv:
            visible = column < kv_len  # zero-padded keys past t
        if causal:
            row = q_block * block_q + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 0)
            below_diagonal = column <= row
            visible = below_diagonal if visible is None else visible & below_diagonal
        if visible is not None:
            logits = jnp.where(visible, logits, -jnp.inf)

        m_ref[...], l_ref[...], acc_ref[...] = online_softmax_step(
            m_ref[...], l_ref[...], acc_ref[...], logits, v_ref[...])

    if causal:
        # Blocks wholly above the diagonal: no work (and no copy, see the index maps).
        pl.when(kv_block <= _last_kv_block(q_block, block_q, block_kv))(_fold_block)
    else:
        _fold_block()

    @pl.when(kv_block == num_kv_blocks - 1)
    def _write_back():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def _flash_attention_call(q, k, v, *, causal: bool, sm_scale: float, block_q: int,
                          block_kv: int, kv_len: int):
    """The kernel on padded q ``(b, h, s_pad, d)``, k and v ``(b, g, t_pad, d)``."""
    b, h, s, d = q.shape
    _, g, t, dv = v.shape
    heads_per_group = h // g
    num_q, num_kv = s // block_q, t // block_kv

    def kv_index(bi, hi, qi, ki):
        if causal:
            # A skipped block asks for the block of the previous step: no new copy.
            ki = jnp.minimum(ki, _last_kv_block(qi, block_q, block_kv))
        return bi, jax.lax.div(hi, heads_per_group), ki, 0

    def q_index(bi, hi, qi, ki):
        return bi, hi, qi, 0

    kernel = functools.partial(
        _flash_attention_kernel, causal=causal, sm_scale=sm_scale, block_q=block_q,
        block_kv=block_kv, kv_len=kv_len, num_kv_blocks=num_kv,
    )
    return pl.pallas_call(
        kernel,
        out_shape=output_struct((b, h, s, dv), q.dtype, q, k, v),
        grid=(b, h, num_q, num_kv),
        in_specs=[
            pl.BlockSpec((None, None, block_q, d), q_index),
            pl.BlockSpec((None, None, block_kv, d), kv_index),
            pl.BlockSpec((None, None, block_kv, dv), kv_index),
        ],
        out_specs=pl.BlockSpec((None, None, block_q, dv), q_index),
        scratch_shapes=[
            pltpu.VMEM((block_q, 1), jnp.float32),  # m: running row maximum
            pltpu.VMEM((block_q, 1), jnp.float32),  # l: running softmax denominator
            pltpu.VMEM((block_q, dv), jnp.float32),  # acc: unnormalised output
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        cost_estimate=flash_attention_cost(q, k, v, causal=causal, block_q=block_q,
                                           block_kv=block_kv),
        name="flash_attention_causal" if causal else "flash_attention",
    )(q, k, v)


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale", "block_q", "block_kv"))
def _flash_attention(q, k, v, *, causal: bool, sm_scale: float, block_q: int, block_kv: int):
    b, h, s, d = q.shape
    _, g, t, dv = v.shape
    s_pad, t_pad = round_up(s, block_q), round_up(t, block_kv)
    q = pad_to(q, (b, h, s_pad, d))
    k = pad_to(k, (b, g, t_pad, d))
    v = pad_to(v, (b, g, t_pad, dv))
    out = _flash_attention_call(q, k, v, causal=causal, sm_scale=sm_scale, block_q=block_q,
                                block_kv=block_kv, kv_len=t)
    return out[:, :, :s]


def flash_attention_blocked(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
                            sm_scale: float, block_q: int | None = None,
                            block_kv: int | None = None) -> jax.Array:
    """``flash_attention`` with chosen blocks.

    ``block_q`` must be a multiple of the sublane tiling (8 for float32, 16 for
    bfloat16) or equal s; ``block_kv`` a multiple of 128 or equal t; ``None``
    picks a default (at most 256 and 512). Sizes need not divide the blocks.

    >>> q = jnp.zeros((1, 4, 100, 64)); kv = jnp.ones((1, 2, 100, 64))
    >>> flash_attention_blocked(q, kv, kv, causal=True, sm_scale=0.125,
    ...                         block_q=32, block_kv=128).shape
    (1, 4, 100, 64)
    """
    _check_operands(q, k, v)
    causal, sm_scale = _static_params(causal, sm_scale)
    block_q, block_kv = resolve_attention_blocks(q.shape[2], k.shape[2], q.dtype, block_q, block_kv)
    return _flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, block_q=block_q,
                            block_kv=block_kv)


@supports(blocks={"block_q": "s", "block_kv": ("t", 128)})
def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
                    sm_scale: float, block_q: int | None = None,
                    block_kv: int | None = None) -> jax.Array:
    """``softmax(sm_scale * q @ k.T + mask) @ v`` per (batch, head), MHA, GQA or MQA.

    q ``(b, h, s, d)``, k and v ``(b, g, t, d)``, h a multiple of g, all float32
    or all bfloat16; the output is ``(b, h, s, d)`` in q's dtype. ``causal=True``
    hides key j from query i when j > i. Needs no particular sizes.

    >>> q = jnp.zeros((1, 2, 3, 8)); kv = jnp.ones((1, 1, 3, 8))
    >>> flash_attention(q, kv, kv, causal=True, sm_scale=8 ** -0.5).shape
    (1, 2, 3, 8)
    """
    return flash_attention_blocked(q, k, v, causal=causal, sm_scale=sm_scale, block_q=block_q,
                                   block_kv=block_kv)
