"""The GPU kernels JAX ships in ``jax.experimental.pallas.ops.gpu``, in a Pallas test on the CPU.

Written as a GPU author writes them (no ``interpret=``): the plugin runs the Triton ones in
the plain interpreter and the Mosaic GPU ones in JAX's GPU interpreter, and compares each
against a float64 NumPy reference. Every verdict is a pass, or a skip naming the limit of
JAX's interpreters (the plugin's one-line skip, asserted here: never a JAX-internal crash
presented as the kernel's failure). Nothing here was run on a GPU.
"""

from __future__ import annotations

import pkgutil
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("absl", reason="jax.experimental.pallas.mosaic_gpu imports absl-py")

from pytest_pallas import assert_allclose  # noqa: E402

pytestmark = [
    pytest.mark.pallas,
    # jax 0.12 deprecates its Triton kernels' modules (softmax, the norms, attention, decode
    # and paged attention) in favour of tokamax's; they still ship, and still pass here.
    pytest.mark.filterwarnings(
        r"ignore:jax\.experimental\.pallas\.ops\.gpu\.\w+ is deprecated:DeprecationWarning"),
]


def _normal(key, shape, dtype=jnp.float32, scale=1.0):
    return (jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale).astype(dtype)


def _f64(x):
    return np.asarray(x).astype(np.float64)


def _softmax64(x, axis=-1):
    x = _f64(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _attention64(q, k, v, *, causal=False, sm_scale=1.0):
    # (batch, seq, heads, dim), JAX's mha layout.
    logits = np.einsum("bqhd,bkhd->bhqk", _f64(q), _f64(k)) * sm_scale
    if causal:
        s, t = logits.shape[-2:]
        logits = np.where(np.tril(np.ones((s, t), bool)), logits, -np.inf)
    return np.einsum("bhqk,bkhd->bqhd", _softmax64(logits), _f64(v))


# --- Triton kernels: the plain interpreter ----------------------------------------------


def test_triton_softmax():
    from jax.experimental.pallas.ops.gpu import softmax

    x = _normal(0, (16, 256), scale=10.0)
    assert_allclose(softmax.softmax(x, axis=-1), _softmax64(x), reduction_length=256)


@pytest.mark.parametrize("which", ["rms_norm", "layer_norm"])
def test_triton_norms(which):
    import importlib

    module = importlib.import_module(f"jax.experimental.pallas.ops.gpu.{which}")
    x = _normal(1, (2, 4, 256))
    weight, bias = _normal(2, (256,)), _normal(3, (256,))
    x64, eps = _f64(x), 1e-5
    if which == "rms_norm":
        scaled = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps)
    else:
        centred = x64 - x64.mean(-1, keepdims=True)
        scaled = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps)
    expected = scaled * _f64(weight) + _f64(bias)
    assert_allclose(getattr(module, which)(x, weight, bias), expected, reduction_length=256)


@pytest.mark.parametrize("causal", [False, True])
def test_triton_mha(causal):
    from jax.experimental.pallas.ops.gpu import attention

    q, k, v = (_normal(i, (1, 128, 2, 64)) for i in (4, 5, 6))
    out = attention.mha(q, k, v, segment_ids=None, causal=causal,
                        block_sizes=attention.BlockSizes(block_q=64, block_k=64))
    assert_allclose(out, _attention64(q, k, v, causal=causal), reduction_length=128,
                    op="mha", inputs=(q, k, v))


def test_triton_decode_attention_mqa():
    from jax.experimental.pallas.ops.gpu import decode_attention

    q = _normal(7, (2, 16, 64))  # (batch, heads, dim)
    k, v = _normal(8, (2, 256, 64)), _normal(9, (2, 256, 64))  # (batch, seq, dim)
    out = decode_attention.mqa(q, k, v, sm_scale=1.0, block_k=64, k_splits=4)
    logits = np.einsum("bhd,btd->bht", _f64(q), _f64(k))
    expected = np.einsum("bht,btd->bhd", _softmax64(logits), _f64(v))
    # The logits are rounded to float32 before the softmax: the contract's mqa error model
    # (q as (batch, heads, 1, dim)), which the comparator's hint names on a miss.
    assert_allclose(out[:, :, None], expected[:, :, None], reduction_length=256, op="mqa",
                    inputs=(q[:, :, None], k, v))


def test_triton_paged_attention():
    from jax.experimental.pallas.ops.gpu import paged_attention

    batch, heads, kv_heads, dim, page, pages_per_seq = 2, 16, 2, 64, 16, 8
    total_pages = batch * pages_per_seq
    q = _normal(10, (batch, heads, dim))
    k_pages = _normal(11, (kv_heads, total_pages, page, dim))
    v_pages = _normal(12, (kv_heads, total_pages, page, dim))
    block_tables = jnp.arange(total_pages, dtype=jnp.int32).reshape(batch, pages_per_seq)
    lengths = jnp.array([page * pages_per_seq, page * 3 + 5], jnp.int32)
    out = paged_attention.paged_attention(q, k_pages, v_pages, block_tables, lengths,
                                          pages_per_compute_block=4, k_splits=2)
    expected = np.zeros((batch, heads, dim))
    per_kv = heads // kv_heads
    # Each q head's keys and values laid out densely, (batch, heads, seq, dim): the error
    # model's inputs (its bound over every key is at least the bound over the unmasked ones).
    dense_k = np.zeros((batch, heads, page * pages_per_seq, dim))
    dense_v = np.zeros_like(dense_k)
    for b in range(batch):
        pages = np.asarray(block_tables[b])
        n = int(lengths[b])
        keys = _f64(k_pages)[:, pages].reshape(kv_heads, -1, dim)
        values = _f64(v_pages)[:, pages].reshape(kv_heads, -1, dim)
        for h in range(heads):
            dense_k[b, h], dense_v[b, h] = keys[h // per_kv], values[h // per_kv]
            logits = keys[h // per_kv, :n] @ _f64(q)[b, h]
            expected[b, h] = _softmax64(logits) @ values[h // per_kv, :n]
    # The logits are rounded to float32 before the softmax: the mha error model.
    assert_allclose(out[:, :, None], expected[:, :, None], reduction_length=page * pages_per_seq,
                    op="mha", inputs=(q[:, :, None], dense_k, dense_v))


# --- Mosaic GPU kernels: JAX's GPU interpreter ---------------------------------------------


def test_mosaic_gpu_hopper_matmul():
    # Three warpgroups, TMA, WGMMA and an SM loop (nd_loop); on the CPU the SM count is the
    # stand-in device's core count, so one simulated SM walks every tile.
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    a, b = _normal(13, (256, 128), jnp.float16), _normal(14, (128, 256), jnp.float16)
    config = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    assert_allclose(hm.matmul(a, b, None, config), _f64(a) @ _f64(b), reduction_length=128)


def test_mosaic_gpu_ragged_dot():
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as rd

    lhs, rhs = _normal(15, (256, 128), jnp.float16), _normal(16, (2, 128, 128), jnp.float16)
    sizes = (100, 156)
    out = rd.ragged_dot(lhs, rhs, group_sizes=jnp.array(sizes, jnp.int32), block_m=64,
                        block_n=64, block_k=64, max_concurrent_steps=2, grid_block_n=1)
    expected = np.concatenate([_f64(lhs)[:100] @ _f64(rhs)[0], _f64(lhs)[100:] @ _f64(rhs)[1]])
    assert_allclose(out, expected, reduction_length=128)


def _jaxlib_has_cuda() -> bool:
    """Whether a JAX CUDA plugin (``jax_cuda12_plugin``, ``jax_cuda13_plugin``, ...) is
    installed, whose libraries answer JAX's CUDA version queries, with or without a GPU."""
    return any(re.fullmatch(r"jax_cuda\d+_plugin", module.name)
               for module in pkgutil.iter_modules())


def test_mosaic_gpu_attention_skips_naming_jaxs_limit(pytester):
    """JAX's Mosaic GPU attention asks jaxlib's CUDA libraries for their version before it
    builds a kernel (``assert cuda_versions is not None``): a CPU-only jaxlib has none. With
    JAX's CUDA plugin installed (a GPU workstation's JAX kept on the CPU) it gets further,
    to a primitive JAX's GPU interpreter does not run. Either way the plugin skips it with
    one line naming JAX's limit, at the test's own line, not an AssertionError inside JAX."""
    pytester.makepyfile(textwrap.dedent(
        """
        import jax.numpy as jnp, pytest
        from jax.experimental.pallas.ops.gpu import attention_mgpu as am

        pytestmark = pytest.mark.pallas

        def test_attention():
            q = jnp.ones((1, 128, 2, 64), jnp.float16)
            kv = jnp.ones((1, 128, 1, 64), jnp.float16)
            am.attention(q, kv, kv, am.TuningConfig(block_q=64, block_kv=64,
                                                    max_concurrent_steps=2))
        """))
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist", "-rs")
    result.assert_outcomes(skipped=1)
    if _jaxlib_has_cuda():
        limit = ("Mosaic GPU kernel * cannot run in JAX's GPU interpreter: *"
                 "A limit of JAX's interpreters, not a bug of the kernel; run it with "
                 "--pallas-gpu on a GPU.")
    else:
        limit = ("JAX's GPU kernel module attention_mgpu.py needs a GPU build of jaxlib*"
                 "assert cuda_versions is not None*run it with --pallas-gpu on a GPU.")
    result.stdout.fnmatch_lines([f"SKIPPED ?1? test_*.py:6: pallas: {limit}"])
