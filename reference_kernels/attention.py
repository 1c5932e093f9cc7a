"""Flash attention forward on the TPU: online softmax over key/value blocks.

Contract ops (docs/contract.md section 2), all ``softmax(q @ k.T) @ v`` with no
scaling and no mask:

* ``attention(q, k, v)``: q ``(s, d)``, k and v ``(t, d)``; ``s != t`` allowed.
* ``mha(q, k, v)``: one attention per (batch, head), all ``(b, h, ., d)``;
  ``jax.vmap`` of ``attention`` over b and h.
* ``mqa(q, k, v)``: q ``(b, h, s, d)``, k and v ``(b, t, d)`` shared by every head:
  the head vmap leaves k and v unmapped, so they are not copied per head.

Tunable variant: ``flash_attention(q, k, v, *, block_q, block_kv)``. Multi-device:
``sharded_mha(q, k, v, *, mesh, axis_name)`` shards the batch with ``jax.shard_map``.
Each kernel sits next to its float64 NumPy oracle (``*_reference``) and its cost
model (``*_cost``).

The TPU idea: the ``(s, t)`` logits never exist in full. A grid step sees one
``(block_q, d)`` block of q and one ``(block_kv, d)`` block of k and v, and folds
that block into three float32 VMEM scratch buffers that persist across the kv
steps of a q block: the running row maximum ``m``, the running softmax
denominator ``l`` and the unnormalised output ``acc``. When a block raises the
maximum from ``m_prev`` to ``m_new``, everything accumulated so far was scaled
by ``exp(-m_prev)`` and is rescaled by ``exp(m_prev - m_new)``: the softmax is
computed online, in one pass over k and v, with VMEM use independent of ``t``.
The kv axis is the reduction, so it is the minormost ("arbitrary") grid axis
and the scratch is initialised at its first step; q blocks are independent
("parallel").

Sizes need not be multiples of the TPU tile. A block spanning a whole axis is
legal at any size, so an axis that fits one block is left alone; a longer one
is padded with zeros to a multiple of its block. Padded q rows are sliced away;
padded kv positions are masked to ``-inf`` before the softmax so that they get
zero weight. ``d`` is never split.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec

from pytest_pallas.ops.domains import supports

from ._tiling import (
    LANES,
    native_sublanes,
    output_struct,
    pad_to,
    resolve_block,
    round_up,
)
from .operand_checks import require_matching, require_one_float_dtype, require_ranks

__all__ = [
    "DEFAULT_BLOCK_KV",
    "DEFAULT_BLOCK_Q",
    "attention",
    "attention_cost",
    "attention_reference",
    "flash_attention",
    "mha",
    "mha_cost",
    "mha_reference",
    "mqa",
    "mqa_cost",
    "mqa_reference",
    "sharded_mha",
]

# Largest default blocks. A (256, 512) logits tile is 512 KiB of float32 and
# the double-buffered q, k and v blocks add about 1.3 MiB at d=128: a few MiB
# in all, well under 16 MiB (all of a v4's VMEM), while each k/v block fetched
# from HBM serves 256 query rows. Smaller problems get one block per axis (see
# _tiling.resolve_block), so small tests run in one grid step.
DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_KV = 512


# --- shared helpers -------------------------------------------------------------


def _check_attention_operands(q: Any, k: Any, v: Any) -> None:
    expects = "expected q (s, d), k (t, d) and v (t, d)"
    require_ranks(expects, (q, k, v), (2, 2, 2))
    require_matching(expects, (q, k, v), dims="d and t",
                     agree=q.shape[1] == k.shape[1] and k.shape[0] == v.shape[0])
    require_one_float_dtype("", q=q, k=k, v=v)


def _batch_index(batch_shape: tuple[int, ...], grid_indices: tuple[Any, ...]) -> tuple[Any, ...]:
    # A batch axis of size 1 is shared by every step of that grid axis: the
    # operand was not vmapped there (k and v across the heads of mqa), and is
    # read in place instead of broadcast.
    return tuple(index if size != 1 else 0 for size, index in zip(batch_shape, grid_indices))


# --- oracles ------------------------------------------------------------------------


def _float64(array: Any) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def _softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    logits = np.einsum("...sd,...td->...st", q, k)
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("...st,...td->...sd", weights, v)


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``softmax(q @ k.T) @ v`` in float64 NumPy, the softmax shifted by its row maximum.

    >>> attention_reference(np.zeros((1, 2)), np.zeros((3, 2)), np.arange(6.0).reshape(3, 2))
    array([[2., 3.]])
    """
    return _softmax_attention(_float64(q), _float64(k), _float64(v))


def mha_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Attention per (batch, head) in float64: q ``(b, h, s, d)``, k and v ``(b, h, t, d)``."""
    return _softmax_attention(_float64(q), _float64(k), _float64(v))


def mqa_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Multi-query attention in float64: q ``(b, h, s, d)``, k and v ``(b, t, d)`` for every
    head."""
    return _softmax_attention(_float64(q), _float64(k)[:, None], _float64(v)[:, None])


# --- cost models --------------------------------------------------------------------


def attention_cost(
    q: Any, k: Any, v: Any, *, block_q: int | None = None, block_kv: int | None = None
) -> pl.CostEstimate:
    """Flops, transcendentals and HBM bytes of attention (anything with ``.shape``/``.dtype``).

    Leading axes are batch axes (an axis of size 1 in k or v is shared). Without
    blocks, the bytes are the minimum (read q, k, v once, write the output once).
    With ``block_q``, k and v are read once per q block, as the kernel does; with
    ``block_kv``, the per-block rescaling's ``exp`` calls are counted too.
    """
    *q_batch, s, d = q.shape
    *k_batch, t, _ = k.shape
    *v_batch, _, dv = v.shape
    batch = math.prod(np.broadcast_shapes(tuple(q_batch), tuple(k_batch), tuple(v_batch)))
    itemsize = jnp.dtype(q.dtype).itemsize
    if block_q is None:
        kv_elements = math.prod(k_batch) * t * d + math.prod(v_batch) * t * dv
    else:
        kv_elements = batch * -(-s // block_q) * t * (d + dv)
    kv_blocks = 1 if block_kv is None else -(-t // block_kv)
    return pl.CostEstimate(
        # q @ k.T and p @ v, plus max, subtract, exp and sum over the logits.
        flops=batch * (2 * s * t * d + 2 * s * t * dv + 4 * s * t),
        transcendentals=batch * (s * t + s * kv_blocks),
        bytes_accessed=itemsize * (math.prod(q_batch) * s * d + kv_elements + batch * s * dv),
    )


def mha_cost(q: Any, k: Any, v: Any) -> pl.CostEstimate:
    """Cost of ``mha``: one attention per (batch, head)."""
    return attention_cost(q, k, v)


def mqa_cost(q: Any, k: Any, v: Any) -> pl.CostEstimate:
    """Cost of ``mqa``: k and v are read once per batch entry, not once per head."""
    return attention_cost(q, _with_head_axis(k), _with_head_axis(v))


def _with_head_axis(array: Any) -> jax.ShapeDtypeStruct:
    b, t, d = array.shape
    return jax.ShapeDtypeStruct((b, 1, t, d), array.dtype)


# --- the kernel ---------------------------------------------------------------------


def online_softmax_step(m_prev, l_prev, acc_prev, logits, v):
    """Fold one block of ``logits`` (float32, masked entries -inf) and its values ``v``
    into the online softmax's running maximum ``m``, denominator ``l`` and
    unnormalised output ``acc``; returns the new ``(m, l, acc)``.

    The flash, causal and paged attention kernels all take this step: the old
    partial sums are rescaled by ``exp(m_prev - m_new)`` (0 at the first step,
    where ``m_prev`` is -inf) before the block's own are added.
    """
    m_new = jnp.maximum(m_prev, logits.max(axis=1, keepdims=True))
    correction = jnp.exp(m_prev - m_new)
    p = jnp.exp(logits - m_new)
    l_new = correction * l_prev + p.sum(axis=1, keepdims=True)
    # p stays float32: rounding the weights to bfloat16 for a bfloat16 MXU pass
    # would add an error as large as the output's own rounding. So the products are
    # float32 too: at the default precision the chip rounds float32 operands to
    # bfloat16 (pytest_pallas.numerics), HIGHEST keeps them.
    acc_new = correction * acc_prev + jnp.dot(
        p, v.astype(jnp.float32), preferred_element_type=jnp.float32,
        precision=jax.lax.Precision.HIGHEST,
    )
    return m_new, l_new, acc_new


def _flash_attention_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
                            num_batch_axes: int, block_kv: int, kv_len: int,
                            num_kv_blocks: int):
    """One (..., q block, kv block) grid step of the online softmax.

    ``m_ref``, ``l_ref`` and ``acc_ref`` carry the running maximum, denominator
    and unnormalised output from one kv step to the next. They start as garbage
    (NaN in TPU interpret mode), hence the initialisation at the first kv step.
    """
    kv_index = pl.program_id(num_batch_axes + 1)

    @pl.when(kv_index == 0)
    def _initialise():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # Contract over d of both operands: q @ k.T without materialising k.T.
    logits = jax.lax.dot_general(
        q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    )
    if kv_len % block_kv:
        # Only the last kv block holds padding, and fewer than block_kv
        # columns of it, so every row keeps a finite maximum.
        column = kv_index * block_kv + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
        logits = jnp.where(column < kv_len, logits, -jnp.inf)

    m_ref[...], l_ref[...], acc_ref[...] = online_softmax_step(
        m_ref[...], l_ref[...], acc_ref[...], logits, v_ref[...])

    @pl.when(kv_index == num_kv_blocks - 1)
    def _write_back():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def _attention_pallas_call(q, k, v, *, block_q: int, block_kv: int, kv_len: int):
    """The kernel on padded operands with leading batch axes, each full or 1 (shared)."""
    *q_batch, s, d = q.shape
    *k_batch, t, _ = k.shape
    *v_batch, _, dv = v.shape
    nb = len(q_batch)
    batch = tuple(np.broadcast_shapes(tuple(q_batch), tuple(k_batch), tuple(v_batch)))
    grid = (*batch, s // block_q, t // block_kv)
    squeezed = (None,) * nb  # batch axes: one element per grid step, squeezed away in the kernel

    def q_index(*g):
        return (*_batch_index(tuple(q_batch), g[:nb]), g[nb], 0)

    def k_index(*g):
        return (*_batch_index(tuple(k_batch), g[:nb]), g[nb + 1], 0)

    def v_index(*g):
        return (*_batch_index(tuple(v_batch), g[:nb]), g[nb + 1], 0)

    def o_index(*g):
        return (*g[:nb], g[nb], 0)

    kernel = functools.partial(
        _flash_attention_kernel, num_batch_axes=nb, block_kv=block_kv, kv_len=kv_len,
        num_kv_blocks=grid[-1],
    )
    return pl.pallas_call(
        kernel,
        out_shape=output_struct((*batch, s, dv), q.dtype, q, k, v),
        grid=grid,
        in_specs=[
            pl.BlockSpec((*squeezed, block_q, d), q_index),
            pl.BlockSpec((*squeezed, block_kv, d), k_index),
            pl.BlockSpec((*squeezed, block_kv, dv), v_index),
        ],
        out_specs=pl.BlockSpec((*squeezed, block_q, dv), o_index),
        scratch_shapes=[
            pltpu.VMEM((block_q, 1), jnp.float32),  # m: running row maximum
            pltpu.VMEM((block_q, 1), jnp.float32),  # l: running softmax denominator
            pltpu.VMEM((block_q, dv), jnp.float32),  # acc: unnormalised output
        ],
        # Batch axes and q blocks are independent (a megacore chip splits them
        # across its two TensorCores); the kv axis carries m, l and acc.
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",) * (nb + 1) + ("arbitrary",)
        ),
        cost_estimate=attention_cost(q, k, v, block_q=block_q, block_kv=block_kv),
        name="flash_attention",
    )(q, k, v)


@functools.cache
def _attention_kernel_call(block_q: int, block_kv: int, kv_len: int):
    """The kernel as a function that ``jax.vmap`` turns into extra parallel grid axes.

    Pallas's own batching rule prepends a grid axis too, but leaves
    ``dimension_semantics`` one entry short, which JAX 0.10's TPU interpreter
    rejects (the Mosaic compiler pads it with "parallel"). This rule does what
    the compiler does: each vmapped axis becomes a leading "parallel" grid axis,
    and an operand that is not mapped (k and v across heads in mqa) gets a
    size-1 axis that every step reads, instead of a copy per head.
    """
    call = functools.partial(_attention_pallas_call, block_q=block_q, block_kv=block_kv,
                             kv_len=kv_len)

    @jax.custom_batching.custom_vmap
    def kernel_call(q, k, v):
        return call(q, k, v)

    @kernel_call.def_vmap
    def _batched(axis_size, in_batched, q, k, v):
        del axis_size
        q, k, v = (x if batched else x[None] for x, batched in zip((q, k, v), in_batched))
        return kernel_call(q, k, v), True

    return kernel_call


@functools.partial(jax.jit, static_argnames=("block_q", "block_kv"))
def _flash_attention(q, k, v, *, block_q: int, block_kv: int):
    (s, d), (t, dv) = q.shape, v.shape
    s_pad, t_pad = round_up(s, block_q), round_up(t, block_kv)
    # d is never split: every block spans it whole, which is legal for any d.
    q = pad_to(q, (s_pad, d))
    k = pad_to(k, (t_pad, d))
    v = pad_to(v, (t_pad, dv))
    out = _attention_kernel_call(block_q, block_kv, t)(q, k, v)
    return out[:s, :dv]


def resolve_attention_blocks(s: int, t: int, dtype: Any, block_q: int | None,
                             block_kv: int | None) -> tuple[int, int]:
    sublanes = native_sublanes(dtype)
    block_q = resolve_block("block_q", block_q, "s", s, sublanes,
                            f"TPU sublane tiling of {jnp.dtype(dtype).name}, the second-minor "
                            "dimension of q's block", cap=DEFAULT_BLOCK_Q)
    block_kv = resolve_block("block_kv", block_kv, "t", t, LANES,
                             "TPU lane tiling, the minor dimension of the (block_q, block_kv) "
                             "logits",
                             cap=DEFAULT_BLOCK_KV)
    if block_kv == 1:
        # One key per block: Mosaic (libtpu 0.0.42) fails to verify the bfloat16
        # q @ k.T with a single k row ("'vector.broadcast' op failed to verify").
        # Eight rows, seven of them padding that the kernel masks, compile.
        block_kv = 8
    return block_q, block_kv


def flash_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, block_q: int | None = None,
    block_kv: int | None = None,
) -> jax.Array:
    """``softmax(q @ k.T) @ v`` with a ``(q blocks, kv blocks)`` grid and chosen blocks.

    ``block_q`` must be a multiple of the sublane tiling (8 for float32, 16 for
    bfloat16) or equal ``s``; ``block_kv`` a multiple of 128 or equal ``t``;
    ``None`` picks a default (at most 256 and 512, one block per axis for small
    problems). Sizes need not divide the blocks.

    >>> q = jnp.zeros((100, 64)); k = v = jnp.ones((300, 64))
    >>> flash_attention(q, k, v, block_q=32, block_kv=128).shape
    (100, 64)
    """
    _check_attention_operands(q, k, v)
    block_q, block_kv = resolve_attention_blocks(q.shape[0], k.shape[0], q.dtype, block_q, block_kv)
    return _flash_attention(q, k, v, block_q=block_q, block_kv=block_kv)


@supports(blocks={"block_q": "s", "block_kv": ("t", 128)})
def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, block_q: int | None = None,
              block_kv: int | None = None) -> jax.Array:
    """``softmax(q @ k.T) @ v`` for q ``(s, d)``, k and v ``(t, d)``, float32 or bfloat16.

    >>> attention(jnp.zeros((1, 2)), jnp.zeros((3, 2)), jnp.arange(6.0).reshape(3, 2))
    Array([[2., 3.]], dtype=float32)
    """
    return flash_attention(q, k, v, block_q=block_q, block_kv=block_kv)


@supports(blocks={"block_q": "s", "block_kv": ("t", 128)})
def mha(q: jax.Array, k: jax.Array, v: jax.Array, *, block_q: int | None = None,
        block_kv: int | None = None) -> jax.Array:
    """Multi-head attention: q ``(b, h, s, d)``, k and v ``(b, h, t, d)``.

    ``jax.vmap`` over heads then batch: grid ``(b, h, q blocks, kv blocks)``.
    """
    expects = "expected q (b, h, s, d), k (b, h, t, d) and v (b, h, t, d)"
    require_ranks(expects, (q, k, v), (4, 4, 4))
    require_matching(expects, (q, k, v), agree=q.shape[:2] == k.shape[:2] == v.shape[:2])
    per_head = functools.partial(attention, block_q=block_q, block_kv=block_kv)
    return jax.vmap(jax.vmap(per_head))(q, k, v)


@supports(blocks={"block_q": "s", "block_kv": ("t", 128)})
def mqa(q: jax.Array, k: jax.Array, v: jax.Array, *, block_q: int | None = None,
        block_kv: int | None = None) -> jax.Array:
    """Multi-query attention: q ``(b, h, s, d)``, k and v ``(b, t, d)`` shared by the heads.

    The head vmap maps q only (``in_axes=(0, None, None)``): each head's grid
    steps read the same k and v blocks, which are never copied per head.
    """
    expects = "expected q (b, h, s, d), k (b, t, d) and v (b, t, d)"
    require_ranks(expects, (q, k, v), (4, 3, 3))
    require_matching(expects, (q, k, v), agree=q.shape[0] == k.shape[0] == v.shape[0])
    per_head = functools.partial(attention, block_q=block_q, block_kv=block_kv)
    per_batch = jax.vmap(per_head, in_axes=(0, None, None))
    return jax.vmap(per_batch)(q, k, v)


@functools.cache
def _sharded_mha(mesh: jax.sharding.Mesh, axis_name: str):
    spec = PartitionSpec(axis_name)
    # check_vma=False: JAX 0.10's plain interpreter (interpret=True) evaluates
    # the kernel body with the shard_map's varying-axis checks on, and rejects
    # a dot of a per-device block with a device-invariant constant. The kernel
    # itself declares its output's variance (output_struct), so it also runs
    # under a user's shard_map with the default check_vma=True.
    return jax.jit(jax.shard_map(mha, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                                 check_vma=False))


def sharded_mha(
    q: jax.Array, k: jax.Array, v: jax.Array, *, mesh: jax.sharding.Mesh, axis_name: str
) -> jax.Array:
    """``mha`` with the batch split over the devices of ``mesh`` along ``axis_name``.

    Inside ``jax.shard_map`` each device runs the kernel on its own batch
    entries: attention needs no communication between batch entries. A batch
    that does not divide by the number of devices is padded with zero entries
    (uniform attention, sliced away).

    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    >>> sharded_mha(*(jnp.ones((2, 1, 8, 8)),) * 3, mesh=mesh, axis_name="x").shape
    (2, 1, 8, 8)
    """
    if axis_name not in mesh.shape:
        raise ValueError(f"axis_name={axis_name!r} is not an axis of the mesh {dict(mesh.shape)}")
    if jnp.ndim(q) != 4:
        raise ValueError(f"expected q (b, h, s, d), got shape {jnp.shape(q)}")
    devices = mesh.shape[axis_name]
    b = q.shape[0]
    b_pad = round_up(b, devices)
    if b_pad != b:
        q, k, v = (pad_to(x, (b_pad, *x.shape[1:])) for x in (q, k, v))
    return _sharded_mha(mesh, axis_name)(q, k, v)[:b]
