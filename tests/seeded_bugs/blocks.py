"""Kernels with a seeded bug in their multi-block code, which declare their block keywords.

Each kernel here takes whole dimensions in one block by default, as the reference
kernels do (up to 512), so on the suite's sizes its grid takes one step and the bug
stays hidden, unless the suite picks small blocks through the kernel's
``@supports(blocks=...)`` declaration. ``undeclared`` holds the same kernels without
the declaration (the suite then calls them with their default blocks), for measuring
what the declaration buys:

    pytest --pallas-conformance --pallas-impl matmul=seeded_bugs.blocks:matmul_k_steps_overwrite
    pytest --pallas-conformance \\
        --pallas-impl matmul=seeded_bugs.blocks:undeclared.matmul_k_steps_overwrite
"""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

try:
    from pytest_pallas.ops.domains import supports
except ImportError:  # a suite before block declarations (benchmarks/miss_rates.py's before
    # column runs the ``undeclared`` kernels there): the module must still load
    def supports(**_declaration):
        return lambda function: function

_LANES = 128
_DEFAULT_CAP = 512  # the reference kernels' largest default block


def _default(block: int | None, size: int) -> int:
    return block if block is not None else (size if size <= _DEFAULT_CAP else _DEFAULT_CAP)


def _pad_to(array: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    if array.shape == shape:
        return array
    return jnp.pad(array, [(0, target - size) for size, target in zip(array.shape, shape)])


# --- matmul: the k accumulation ------------------------------------------------------------


def _matmul_overwrite_kernel(x_ref, y_ref, o_ref, acc_ref):
    k = pl.program_id(0)

    @pl.when(k == 0)
    def _initialise():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # BUG: "=" where "+=" belongs: each k step replaces the partial sum of the ones before.
    acc_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(0) - 1)
    def _write_back():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _matmul_k_steps_overwrite(x, y, *, block_k=None):
    """``x @ y`` over k blocks (m and n whole), whose accumulator keeps only the last block.

    Bug: ``acc = dot(...)`` instead of ``acc += dot(...)``. Right whenever k fits one
    block, as it does for every k up to 512 with the default block.

    Models: a typo in the one line of a matmul kernel that matters across k steps.
    """
    (m, k), n = x.shape, y.shape[1]
    block_k = _default(block_k, k)
    k_pad = -(-k // block_k) * block_k
    x, y = _pad_to(x, (m, k_pad)), _pad_to(y, (k_pad, n))
    return pl.pallas_call(
        _matmul_overwrite_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(k_pad // block_k,),
        in_specs=[pl.BlockSpec((m, block_k), lambda k: (0, k)),
                  pl.BlockSpec((block_k, n), lambda k: (k, 0))],
        out_specs=pl.BlockSpec((m, n), lambda k: (0, 0)),
        scratch_shapes=[pltpu.VMEM((m, n), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(x, y)


# --- attention: the online softmax across kv blocks -----------------------------------------


def _no_rescale_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, block_kv: int,
                       kv_len: int):
    kv = pl.program_id(0)

    @pl.when(kv == 0)
    def _initialise():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    logits = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    column = kv * block_kv + lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    logits = jnp.where(column < kv_len, logits, -jnp.inf)
    m_new = jnp.maximum(m_ref[...], logits.max(axis=1, keepdims=True))
    p = jnp.exp(logits - m_new)
    # BUG: l and acc are not multiplied by exp(m_prev - m_new) before this block is added.
    l_ref[...] = l_ref[...] + p.sum(axis=1, keepdims=True)
    acc_ref[...] = acc_ref[...] + jnp.dot(p, v_ref[...].astype(jnp.float32),
                                          preferred_element_type=jnp.float32)
    m_ref[...] = m_new

    @pl.when(kv == pl.num_programs(0) - 1)
    def _write_back():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def _attention_kv_blocks_missing_rescale(q, k, v, *, block_kv=None):
    """``softmax(q @ k.T) @ v`` over kv blocks (q whole), missing the online rescale.

    Bug: when a kv block raises a row's running maximum, the sum and output so far
    are not rescaled by ``exp(m_prev - m_new)``. Right whenever t fits one block, as
    it does for every t up to 512 with the default block.

    Models: the flash attention bug of the reference kernel's own online softmax.
    """
    (s, d), t = q.shape, k.shape[0]
    block_kv = _default(block_kv, t)
    t_pad = -(-t // block_kv) * block_kv
    k, v = _pad_to(k, (t_pad, d)), _pad_to(v, (t_pad, d))
    kernel = functools.partial(_no_rescale_kernel, block_kv=block_kv, kv_len=t)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((s, d), q.dtype),
        grid=(t_pad // block_kv,),
        in_specs=[pl.BlockSpec((s, d), lambda j: (0, 0)),
                  pl.BlockSpec((block_kv, d), lambda j: (j, 0)),
                  pl.BlockSpec((block_kv, d), lambda j: (j, 0))],
        out_specs=pl.BlockSpec((s, d), lambda j: (0, 0)),
        scratch_shapes=[pltpu.VMEM((s, 1), jnp.float32), pltpu.VMEM((s, 1), jnp.float32),
                        pltpu.VMEM((s, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(q, k, v)


# --- rms_norm: a ragged last row block ------------------------------------------------------


def _rms_norm_kernel(x_ref, w_ref, o_ref, *, eps: float):
    x = x_ref[...].astype(jnp.float32)
    scale = lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    o_ref[...] = (x * scale * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _rms_norm_ragged_rows_dropped(x, w, *, eps, block_rows=None):
    """``rms_norm`` over row blocks whose grid is ``rows // block_rows`` (floor).

    Bug: a ragged last row block is never visited, so its rows are never written.
    Right whenever the block divides the rows, as the default block (all rows) does.

    Models: sizing a grid with floor division.
    """
    rows, cols = x.shape
    block_rows = _default(block_rows, rows)
    spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(_rms_norm_kernel, eps=float(eps)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // block_rows,),
        in_specs=[spec, pl.BlockSpec((1, cols), lambda i: (0, 0))],
        out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x, w.reshape(1, cols))


def _declared(function, **blocks):
    """``function`` with its block keywords declared (a wrapper: ``undeclared`` keeps the
    plain function)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)

    return supports(blocks=blocks)(wrapper)


matmul_k_steps_overwrite = _declared(_matmul_k_steps_overwrite, block_k="k")
attention_kv_blocks_missing_rescale = _declared(_attention_kv_blocks_missing_rescale,
                                                block_kv=("t", _LANES))
rms_norm_ragged_rows_dropped = _declared(_rms_norm_ragged_rows_dropped, block_rows="rows")

# The same kernels without the declaration: the suite calls them with their default blocks.
undeclared = types.SimpleNamespace(
    matmul_k_steps_overwrite=_matmul_k_steps_overwrite,
    attention_kv_blocks_missing_rescale=_attention_kv_blocks_missing_rescale,
    rms_norm_ragged_rows_dropped=_rms_norm_ragged_rows_dropped,
)
