"""The real-kernel corpus: every kernel JAX 0.10.2 ships in ``jax.experimental.pallas.ops.tpu``.

Each ``Case`` is a kernel nobody on this project wrote, called the way its own
tests call it, at sizes small enough for the CPU, with a float64 NumPy
reference of what it should compute. The tests in this directory run each one
through the plugin's checks; a verdict other than pass must be a real defect,
proved by the float64 reference or by the race detector.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel call: ``kernel(*args())`` should equal ``reference(*args())`` (float64)."""

    name: str
    kernel: Callable[..., Any]
    args: Callable[[], tuple]
    reference: Callable[..., np.ndarray]
    reduction_length: int = 1   # the comparator's L (t for attention, k for matmul)
    devices: int = 1            # simulated devices the call needs
    # Attention's error model (``assert_allclose(op="attention", inputs=(q, k, v))``):
    # the q, k, v whose logits the kernel computes, from the call's arguments.
    attention_inputs: Callable[..., tuple] | None = None
    # A real defect of the kernel, proved in test_defects.py: which checks it fails
    # ("values", "uninitialized_reads", ...) and why. Those run as strict xfails.
    defect: str | None = None
    defect_fails: tuple[str, ...] = ()
    # A defect that shows only when the interpreter's device threads interleave a certain
    # way (a race): the checks it fails run the kernel this many times, so that one lucky
    # schedule cannot turn its strict xfail into a pass.
    defect_runs: int = 1
    # The distribution the kernel ships in, when it is not JAX (skipped when absent).
    package: str | None = None
    # A limitation of JAX's interpreters (not of the kernel) that stops some of its runs
    # today; the plugin skips those runs with one line naming it (docs/corpus.md).
    interpreter_gap: str | None = None
    # A megacore kernel (its grid split across the chip's TensorCores) runs only on a
    # stand-in chip with that many (--pallas-chip=v5p); on fewer it waits forever.
    min_tensor_cores: int = 1
    # The VMEM (MiB) the kernel asks for (its vmem_limit_bytes): on a stand-in chip with
    # less, the plugin rightly reports [vmem-footprint], so its runs skip there, naming it.
    vmem_limit_mib: int = 0
    # A relative tolerance the kernel's documented rounding needs beyond the comparator's
    # default (say why where the case sets it).
    rtol: float | None = None
    # The comparator's matmul precision, where the case is judged against float32 products
    # rather than the run's (the chip's bfloat16 under --pallas-numerics=chip).
    matmul_precision: str | None = None
    # Its value runs take long on the CPU: they run with PALLAS_REAL_KERNELS=full only (the
    # tox env), and CI's fast subset keeps its check_kernel.
    slow: bool = False

    def comparison(self, args: tuple) -> dict:
        """``assert_allclose`` keywords for this case's output."""
        extra = {}
        if self.attention_inputs is not None:
            extra = {"op": "attention", "inputs": self.attention_inputs(*args)}
        if self.rtol is not None:
            extra["rtol"] = self.rtol
        if self.matmul_precision is not None:
            extra["matmul_precision"] = self.matmul_precision
        return {"reduction_length": self.reduction_length, **extra}


def _normal(seed: int, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


def _f64(x) -> np.ndarray:
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def attention64(q, k, v, *, mask=None, scale=1.0) -> np.ndarray:
    """float64 softmax(scale * q k^T, masked) v over the last two axes."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    logits = scale * np.einsum("...sd,...td->...st", q, k)
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    logits = logits - logits.max(-1, keepdims=True)
    weights = np.exp(logits)
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("...st,...td->...sd", weights, v)


# --- flash attention ----------------------------------------------------------------------

def _flash(**kwargs):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    blocks = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
    return functools.partial(fa.flash_attention, block_sizes=blocks, **kwargs)


def _flash_args():
    b, h, s, d = 1, 2, 256, 128
    return tuple(_normal(i, (b, h, s, d)) for i in range(3))


def _segment_ids():
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    ids = jnp.asarray(np.repeat([[0, 1, 1, 2]], 64, axis=1).reshape(1, 256), jnp.int32)
    return fa.SegmentIds(q=ids, kv=ids)


def _flash_segment_args():
    return (*_flash_args(), _segment_ids())


def _flash_segment(q, k, v, segment_ids):
    return _flash(causal=False)(q, k, v, segment_ids=segment_ids)


def _segment_mask(segment_ids):
    q, kv = np.asarray(segment_ids.q), np.asarray(segment_ids.kv)
    return (q[:, None, :, None] == kv[:, None, None, :])


def _causal_mask(s, t):
    return np.tril(np.ones((s, t), bool))


# --- splash attention ---------------------------------------------------------------------

def _splash_causal(q, k, v):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    heads, s, _ = q.shape
    mask = sm.MultiHeadMask([sm.CausalMask((s, s)) for _ in range(heads)])
    blocks = sk.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128)
    kernel = sk.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1)
    return kernel(q, k, v)


def _splash_args():
    h, s, d = 2, 256, 128
    return tuple(_normal(10 + i, (h, s, d)) for i in range(3))


# --- paged attention ----------------------------------------------------------------------

PAGE_SIZE, PAGES_PER_SEQUENCE, TOTAL_PAGES = 16, 8, 32


def _paged_args(dtype=jnp.float32):
    b, h, g, d = 2, 4, 2, 128
    q = _normal(20, (b, h, d), dtype)
    k_pages = _normal(21, (g, TOTAL_PAGES, PAGE_SIZE, d), dtype)
    v_pages = _normal(22, (g, TOTAL_PAGES, PAGE_SIZE, d), dtype)
    lengths = jnp.asarray([37, 128], jnp.int32)
    pages = np.random.default_rng(23).permutation(TOTAL_PAGES)[: b * PAGES_PER_SEQUENCE]
    page_indices = jnp.asarray(pages.reshape(b, PAGES_PER_SEQUENCE), jnp.int32)
    return q, k_pages, v_pages, lengths, page_indices


def _paged(q, k_pages, v_pages, lengths, page_indices):
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    return paged_attention(q, k_pages, v_pages, lengths, page_indices,
                           pages_per_compute_block=4)


def _paged_attention_inputs(q, k_pages, v_pages, lengths, page_indices):
    d = q.shape[-1]
    return q.reshape(-1, d), k_pages.reshape(-1, d), v_pages.reshape(-1, d)


def _ragged_attention_inputs(q, kv_pages, *rest):
    d = q.shape[-1]
    return q.reshape(-1, d), kv_pages.reshape(-1, d), kv_pages.reshape(-1, d)


def _paged_reference(q, k_pages, v_pages, lengths, page_indices):
    q, k_pages, v_pages = _f64(q), _f64(k_pages), _f64(v_pages)
    b, h, d = q.shape
    g = k_pages.shape[0]
    out = np.zeros((b, h, d))
    for i in range(b):
        n = int(lengths[i])
        pages = np.asarray(page_indices[i])
        k = k_pages[:, pages].reshape(g, -1, d)[:, :n]
        v = v_pages[:, pages].reshape(g, -1, d)[:, :n]
        for head in range(h):
            group = head // (h // g)
            out[i, head] = attention64(q[i, head][None], k[group], v[group])[0]
    return out


# --- ragged paged attention ---------------------------------------------------------------

def _ragged_args():
    # Two sequences: a prefill of 16 queries over 40 tokens and a decode of 1 over 70.
    q_lens, kv_lens = [16, 1], [40, 70]
    heads, kv_heads, d, page_size, pages_per_seq, total_pages = 4, 2, 128, 16, 8, 32
    q = _normal(30, (sum(q_lens), heads, d))
    kv_pages = _normal(31, (total_pages, page_size, 2 * kv_heads, d))
    page_indices = np.random.default_rng(32).permutation(total_pages)[: 2 * pages_per_seq]
    return (q, kv_pages, jnp.asarray(kv_lens, jnp.int32),
            jnp.asarray(page_indices.reshape(2, pages_per_seq), jnp.int32),
            jnp.asarray(np.cumsum([0, *q_lens]), jnp.int32), jnp.asarray([2], jnp.int32))


def _ragged(*args):
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    return ragged_paged_attention(*args, num_kv_pages_per_block=2, num_queries_per_block=8)


def _ragged_reference(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
    q, kv_pages = _f64(q), _f64(kv_pages)
    heads, d = q.shape[1:]
    kv_heads = kv_pages.shape[2] // 2
    out = np.zeros_like(q)
    for i in range(int(num_seqs[0])):
        start, end = int(cu_q_lens[i]), int(cu_q_lens[i + 1])
        n, q_len = int(kv_lens[i]), end - start
        kv = kv_pages[np.asarray(page_indices[i])].reshape(-1, 2 * kv_heads, d)[:n]
        k, v = kv[:, 0::2], kv[:, 1::2]          # keys and values interleaved by head
        # query j of this sequence sits at position n - q_len + j: causal within the sequence
        mask = np.arange(n)[None, :] <= (n - q_len + np.arange(q_len))[:, None]
        for head in range(heads):
            group = head // (heads // kv_heads)
            out[start:end, head] = attention64(q[start:end, head], k[:, group], v[:, group],
                                               mask=mask)
    return out


# --- grouped matmul (megablox) ------------------------------------------------------------

def _gmm_args(k=256):
    m, n, g = 256, 256, 4
    lhs = _normal(40, (m, k))
    rhs = _normal(41, (g, k, n))
    return lhs, rhs, jnp.asarray([100, 0, 28, 128], jnp.int32)


def _gmm(lhs, rhs, group_sizes):
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    return gmm(lhs, rhs, group_sizes, tiling=(128, 128, 128))


def grouped_matmul64(lhs, rhs, group_sizes) -> np.ndarray:
    """Rows of lhs in consecutive groups, group g's rows times rhs[g], in float64."""
    lhs, rhs = _f64(lhs), _f64(rhs)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for group, size in enumerate(np.asarray(group_sizes)):
        out[start:start + size] = lhs[start:start + size] @ rhs[group]
        start += size
    return out


# --- matmul -------------------------------------------------------------------------------

def _matmul(x, y):
    from jax.experimental.pallas.ops.tpu.matmul import matmul

    return matmul(x, y, block_shape=(128, 128), block_k=128)


# --- all_gather ---------------------------------------------------------------------------

def _all_gather(devices: int):
    def call(x):
        from jax.experimental.pallas.ops.tpu.all_gather import all_gather

        mesh = jax.make_mesh((devices,), ("x",), devices=jax.devices()[:devices])
        x = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
        return jax.jit(functools.partial(all_gather, mesh=mesh, axis_name="x"))(x)
    call.__name__ = f"all_gather_{devices}_devices"
    return call


def _all_gather_args(devices: int):
    return lambda: (_normal(50, (devices * 8, 128)),)


PAGED_ATTENTION_DEFECT = (
    "JAX's paged_attention rounds float32 keys and values to bfloat16 "
    "(_maybe_dequantize(x, dtype=jnp.bfloat16)): 254 x the float32 tolerance from the float64 "
    "reference, 0.05 x from the same reference with K and V rounded to bfloat16 (test_defects.py)")
ALL_GATHER_DEFECT = (
    "JAX's all_gather reuses one receive semaphore per direction across the steps of its ring, "
    "so on 4 devices a wait is satisfied by another step's copy and rows are read before they "
    "arrive: NaN rows in the NaN-poisoned interpreter, data-race under --pallas-detect-races "
    "(test_defects.py)")

CASES = [
    Case("flash_attention", _flash(causal=False), _flash_args,
         lambda q, k, v: attention64(q, k, v), reduction_length=256,
         attention_inputs=lambda q, k, v: (q, k, v)),
    Case("flash_attention_causal", _flash(causal=True), _flash_args,
         lambda q, k, v: attention64(q, k, v, mask=_causal_mask(256, 256)), reduction_length=256,
         attention_inputs=lambda q, k, v: (q, k, v)),
    Case("flash_attention_segment_ids", _flash_segment, _flash_segment_args,
         lambda q, k, v, ids: attention64(q, k, v, mask=_segment_mask(ids)), reduction_length=256,
         attention_inputs=lambda q, k, v, ids: (q, k, v)),
    Case("splash_attention_causal", _splash_causal, _splash_args,
         lambda q, k, v: attention64(q, k, v, mask=_causal_mask(256, 256)), reduction_length=256,
         attention_inputs=lambda q, k, v: (q, k, v)),
    Case("paged_attention", _paged, _paged_args, _paged_reference, reduction_length=128,
         attention_inputs=_paged_attention_inputs,
         # Its defect is float32 inputs computed as bfloat16 ones: seen against float32
         # products. The chip's default-precision float32 dot rounds them too.
         matmul_precision="float32",
         defect=PAGED_ATTENTION_DEFECT, defect_fails=("values", "uninitialized_reads")),
    # slow: it ran in no interpreter before (JAX's masked-store check), and its values take
    # 8 s on the CPU, so they run with the full corpus, not in every test run.
    Case("ragged_paged_attention", _ragged, _ragged_args, _ragged_reference, reduction_length=70,
         attention_inputs=_ragged_attention_inputs, slow=True),
    Case("gmm", _gmm, _gmm_args, grouped_matmul64, reduction_length=256),
    Case("matmul", _matmul, lambda: (_normal(60, (256, 384)), _normal(61, (384, 256))),
         lambda x, y: _f64(x) @ _f64(y), reduction_length=384),
    Case("all_gather_2_devices", _all_gather(2), _all_gather_args(2), _f64, devices=2),
    # One full `pytest -n 2` run (--pallas-seed=1560899001) saw no sign of its race: three runs.
    Case("all_gather_4_devices", _all_gather(4), _all_gather_args(4), _f64, devices=4,
         defect=ALL_GATHER_DEFECT, defect_fails=("values", "uninitialized_reads"),
         defect_runs=3),
]

BY_NAME = {case.name: case for case in CASES}
