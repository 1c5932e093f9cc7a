"""tokamax 0.0.17's Pallas TPU kernels in the 2026 corpus (newest leg: it needs jax >= 0.11.1).

Installed with ``pip install --no-deps tokamax==0.0.17`` plus the five small
packages its kernel modules import (constraints/corpus-2026.txt): tokamax's
``__init__`` loads its autotuner, profiler (xprof) and quantization library
(qwix, which needs flax), none of which a kernel runs. ``load`` imports a kernel
module with tokamax's ``__init__`` left unrun; splash attention's ``base``
module (the op wrapper, which pulls in the autotuner) is a stand-in holding the
four names the kernel takes from it, all of them from splash's own ``reference``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from .corpus import Case, _normal, grouped_matmul64
from .kernel_modules import load_kernel_module
from .references_2026 import (
    attention_forward64,
    attention_vjp64,
    causal_mask,
    local_mask,
)

SKIP_INIT = ("tokamax", "tokamax._src")
SPLASH = "tokamax._src.ops.experimental.tpu.splash_attention"


def load(module: str):
    """``tokamax._src.<module>`` without tokamax's ``__init__``."""
    return load_kernel_module(f"tokamax._src.{module}", skip_init=SKIP_INIT)


@functools.cache
def _splash():
    reference = load_kernel_module(f"{SPLASH}.reference", skip_init=SKIP_INIT)
    base = {name: getattr(reference, name) for name in (
        "DEFAULT_MASK_VALUE", "SegmentIds", "SplashCustomReturnType", "SplashResidualsType")}
    kernel = load_kernel_module(f"{SPLASH}.splash_attention_kernel", skip_init=SKIP_INIT,
                                stand_ins={f"{SPLASH}.base": base})
    return kernel, load_kernel_module(f"{SPLASH}.splash_attention_mask", skip_init=SKIP_INIT)


# --- splash attention ---------------------------------------------------------------------

HEADS, S, D, BLOCK = 2, 256, 128, 128
LOCAL_WINDOW = (64, 0)   # 64 keys back, none ahead


def _config(**kwargs):
    kernel, _ = _splash()
    square = dict(block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK, block_q_dkv=BLOCK,
                  block_kv_dkv=BLOCK, block_kv_dkv_compute=BLOCK)
    return kernel.SplashConfig(**square, **kwargs)


def _causal_diagonal_skip():
    kernel, masks = _splash()
    config = _config(qk_diag_skip=True, sv_diag_skip=True, qk_diag_grid=2)
    return kernel.make_splash_mha_single_device(masks.CausalMask((S, S)), config=config)


def _local_mqa():
    kernel, masks = _splash()
    mask = masks.LocalMask((S, S), window_size=LOCAL_WINDOW, offset=0)
    return kernel.make_splash_mqa_single_device(mask, config=_config())


def _splash_causal_forward(q, k, v):
    return _causal_diagonal_skip()(q, k, v)


def _splash_causal_backward(q, k, v, d_out):
    return jax.vjp(_causal_diagonal_skip(), q, k, v)[1](d_out)


def _splash_local_mqa_backward(q, k, v, d_out):
    return jax.vjp(_local_mqa(), q, k, v)[1](d_out)


def _mha_args():
    return tuple(_normal(200 + i, (HEADS, S, D)) for i in range(3))


# Splash takes no softmax scale: its callers pass q already scaled by 1/sqrt(d), and so do
# the backward cases (the forward ones keep unit logits' scale and the error model's term).
def _scaled_q(seed):
    return _normal(seed, (HEADS, S, D)) / np.sqrt(D).astype(np.float32)


def _mha_backward_args():
    return (_scaled_q(200), _normal(201, (HEADS, S, D)), _normal(202, (HEADS, S, D)),
            _normal(203, (HEADS, S, D)))


def _mqa_backward_args():
    return (_scaled_q(210), _normal(211, (S, D)), _normal(212, (S, D)),
            _normal(213, (HEADS, S, D)))


LOCAL_MASK = local_mask(S, S, *LOCAL_WINDOW)


# --- grouped matmul v2 --------------------------------------------------------------------

def _gmm_v2_args():
    m, k, n, groups = 256, 256, 256, 4
    return (_normal(220, (m, k)), _normal(221, (groups, k, n)),
            jnp.asarray([100, 0, 28, 128], jnp.int32))


def _gmm_v2(lhs, rhs, group_sizes):
    return load("ops.gmm_v2.gmm_v2").gmm_v2(lhs, rhs, group_sizes)


# --- router top-k -------------------------------------------------------------------------

ROWS, EXPERTS, TOP_K = 40, 32, 4


def _router_scores():
    # Distinct scores (a permutation per row) and 40 rows in blocks of 16: a ragged last block.
    rng = np.random.default_rng(230)
    scores = np.stack([rng.permutation(EXPERTS) for _ in range(ROWS)]).astype(np.float32)
    return (jnp.asarray(scores * 0.25 - 3.0),)


def _router_top_k(scores):
    return load("ops.router_topk.pallas_mosaic_tpu_kernel").select(scores, TOP_K,
                                                                   block_rows=16)


def _router_top_k_reference(scores):
    scores = np.asarray(scores)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :TOP_K]
    return np.take_along_axis(scores, order, axis=1), order.astype(np.int32)


TOKAMAX_2026_CASES = [dataclasses.replace(case, package="tokamax") for case in [
    Case("tokamax_splash_causal_diagonal_skip", _splash_causal_forward, _mha_args,
         lambda q, k, v: attention_forward64(q, k, v, mask=causal_mask(S, S)),
         reduction_length=S, attention_inputs=lambda q, k, v: (q, k, v)),
    Case("tokamax_splash_causal_diagonal_skip_backward", _splash_causal_backward,
         _mha_backward_args,
         lambda q, k, v, d_out: attention_vjp64(q, k, v, d_out, mask=causal_mask(S, S)),
         reduction_length=S),
    Case("tokamax_splash_local_mqa_backward", _splash_local_mqa_backward, _mqa_backward_args,
         lambda q, k, v, d_out: attention_vjp64(q, k, v, d_out, mask=LOCAL_MASK,
                                                shared_kv=True),
         reduction_length=S),
    Case("tokamax_gmm_v2", _gmm_v2, _gmm_v2_args, grouped_matmul64, reduction_length=256),
    Case("tokamax_router_top_k", _router_top_k, _router_scores, _router_top_k_reference),
]]
