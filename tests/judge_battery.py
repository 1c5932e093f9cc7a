"""Implementations that game a checker, one per class of exploit, and honest kernels.

The cheats are the exploit classes kernel-grading harnesses met (KernelBench, gpu-mode's
reference kernels, KernelArena, robust-kbench, PallasBench): each must fail under
``--pallas-judge`` with a line naming its class (tests/test_judge.py). The honest kernels,
layout work around the kernel included, must pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from pytest_pallas.reference_kernels.matmul import batched_matmul as reference_batched_matmul
from pytest_pallas.reference_kernels.matmul import matmul as reference_matmul
from pytest_pallas.reference_kernels.softmax import softmax as reference_softmax


def _copy_kernel(source_ref, out_ref):
    out_ref[...] = source_ref[...]


def pallas_copy(x: jax.Array) -> jax.Array:
    """A Pallas kernel that copies ``x`` (the whole array as one block)."""
    return pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _fill_kernel(x_ref, out_ref):
    del x_ref  # read by nobody: the output ignores the input
    out_ref[...] = jnp.ones(out_ref.shape, out_ref.dtype)


# --- the cheats ------------------------------------------------------------------------------

def no_kernel_matmul(x, y):
    """No kernel at all: the op in XLA."""
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def no_kernel_softmax(x):
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def copies_xla_matmul(x, y):
    """A kernel that only copies the product XLA computed outside it."""
    return pallas_copy(jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype))


def copies_xla_softmax(x):
    return pallas_copy(jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype))


def host_matmul(x, y):
    """The product computed on the host through ``jax.pure_callback``, then copied by a kernel."""
    def on_host(a, b):
        return (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(a.dtype)

    out = jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype)
    return pallas_copy(jax.pure_callback(on_host, out, x, y))


_calls = [0]
RIGHT_CALLS = 40


def first_calls_matmul(x, y):
    """Right only on its first 40 calls, then zeros: a checker that calls it fewer times
    passes it."""
    _calls[0] += 1
    result = reference_matmul(x, y)
    return result if _calls[0] <= RIGHT_CALLS else pallas_copy(jnp.zeros_like(result))


_by_shape: dict = {}


def shape_cached_matmul(x, y):
    """Remembers its result by the inputs' shapes: the second call of a shape replays it."""
    key = (x.shape, y.shape, str(x.dtype))
    if key not in _by_shape:
        _by_shape[key] = reference_matmul(x, y)
    return _by_shape[key]


def bfloat16_inside_matmul(x, y):
    """float32 inputs multiplied in bfloat16 inside the kernel."""
    if x.dtype == jnp.float32:
        return reference_matmul(x.astype(jnp.bfloat16), y.astype(jnp.bfloat16)).astype(x.dtype)
    return reference_matmul(x, y)


def constant_matmul(x, y):
    """A kernel whose output ignores its inputs."""
    return pl.pallas_call(_fill_kernel, out_shape=jax.ShapeDtypeStruct(
        (x.shape[0], y.shape[1]), x.dtype))(x)


class _Lazy:
    """A result that computes when read (``__array__``), not a ``jax.Array``."""

    def __init__(self, compute):
        self._compute = compute

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._compute(), dtype=dtype)


def lazy_matmul(x, y):
    """Returns an object that computes when converted, not a ``jax.Array``."""
    return _Lazy(lambda: reference_matmul(x, y))


def aligned_only_matmul(x, y):
    """Right on shapes of whole 128-tiles, zeros elsewhere: tuned to a benchmark's shapes."""
    if all(n % 128 == 0 for n in (*x.shape, y.shape[1])):
        return reference_matmul(x, y)
    return pallas_copy(jnp.zeros((x.shape[0], y.shape[1]), x.dtype))


# --- honest kernels with layout work around them ------------------------------------------------

def padded_matmul(x, y):
    """Pads every dimension to a multiple of 128, runs the kernel, slices the result."""
    def up(n):
        return -(-n // 128) * 128

    m, k = x.shape
    n = y.shape[1]
    xp = jnp.pad(x, ((0, up(m) - m), (0, up(k) - k)))
    yp = jnp.pad(y, ((0, up(k) - k), (0, up(n) - n)))
    return reference_matmul(xp, yp)[:m, :n]


def reshaped_matmul(x, y):
    """Reshapes to a batch of one, casts to float32, runs the batched kernel, casts back."""
    out = reference_batched_matmul(x[None].astype(jnp.float32), y[None].astype(jnp.float32))
    return out.reshape(x.shape[0], y.shape[1]).astype(x.dtype)


def padded_softmax(x):
    """Softmax with the rows padded to a multiple of 8 around the kernel."""
    rows = x.shape[0]
    padded = jnp.pad(x, ((0, -rows % 8), (0, 0)))
    return reference_softmax(padded)[:rows]


# Which check each cheat meets, in the words of its one-line reason.
CHEATS = {
    "no_kernel_matmul": ("matmul", "[judge: no-kernel]"),
    "no_kernel_softmax": ("softmax", "[judge: no-kernel]"),
    "copies_xla_matmul": ("matmul", "[judge: outside-kernels]"),
    "copies_xla_softmax": ("softmax", "[judge: outside-kernels]"),
    "host_matmul": ("matmul", "[judge: host-callback]"),
    "first_calls_matmul": ("matmul", "[judge: state]"),
    "shape_cached_matmul": ("matmul", "[judge: state]"),
    "bfloat16_inside_matmul": ("matmul", "Arrays are not close"),
    "constant_matmul": ("matmul", "Arrays are not close"),
    "lazy_matmul": ("matmul", "not a valid JAX type"),
    "aligned_only_matmul": ("matmul", "Arrays are not close"),
}
HONEST = {
    "reference_matmul": "matmul",
    "reference_softmax": "softmax",
    "padded_matmul": "matmul",
    "reshaped_matmul": "matmul",
    "padded_softmax": "softmax",
}
