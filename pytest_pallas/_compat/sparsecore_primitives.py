"""SparseCore's value primitives (``jax.experimental.pallas.tpu_sc``) on the CPU, where JAX
gives them no rule ("MLIR translation rule for primitive 'masked_sort' not found for platform
cpu"): each is its semantics in ``jax.numpy``, read from the primitive's docstring and its
Mosaic lowering in ``jax/_src/pallas/mosaic/sc_primitives.py`` (jax 0.10.2 to 0.12), and held
to JAX's own ``tpu_sparsecore_pallas_test.py`` where that test pins a value.

What neither pins is named where it is decided: a masked cumulative sum's lanes before the
first valid one pass ``x`` through, as the docstrings say of the masked maximum and minimum
(the three lower to one ``tpu.scan``; unchecked on the chip); ``pack``'s lane order within the
packed array is the docstring's (unchecked; unpacking what was packed round-trips either way).
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax.numpy as jnp
from jax import lax

from .jax_internals import cpu_lowerings

SC_PRIMITIVES = "jax._src.pallas.mosaic.sc_primitives"


def _bitcast(x: Any, *, dtype: Any) -> Any:
    """``plsc.bitcast``: the bytes of ``x`` read as ``dtype``, the minor dimension grown or
    shrunk by the ratio of the widths (what ``numpy.ndarray.view`` does, little-endian)."""
    old, new = jnp.dtype(x.dtype).itemsize, jnp.dtype(dtype).itemsize
    if old == new:
        return lax.bitcast_convert_type(x, dtype)
    if old > new:  # each element becomes old // new narrower ones, in the minor dimension
        narrow = lax.bitcast_convert_type(x, dtype)
        return narrow.reshape(*x.shape[:-1], x.shape[-1] * (old // new))
    grouped = x.reshape(*x.shape[:-1], x.shape[-1] // (new // old), new // old)
    return lax.bitcast_convert_type(grouped, dtype)


def _scan_count(x: Any, mask: Any) -> list:
    """``plsc.scan_count``: at each valid lane, how many valid lanes up to it (itself
    included) hold its value; and whether it is the last valid lane holding it. Lanes not
    valid count 0 and are no last occurrence."""
    same = (x[:, None] == x[None, :]) & mask[None, :] & mask[:, None]
    lanes = jnp.arange(x.shape[0])
    before = lanes[None, :] <= lanes[:, None]
    counts = jnp.sum(same & before, axis=1).astype(jnp.int32)
    last = mask & ~jnp.any(same & (lanes[None, :] > lanes[:, None]), axis=1)
    return [counts, last]


def _masked_scan(x: Any, mask: Any, *, combine: Any) -> Any:
    """A masked cumulative scan over the minor axis: each lane holds ``combine`` of the
    valid lanes up to it; a lane before the first valid one holds its own ``x``."""
    def step(carry: Any, lane: Any) -> Any:
        total, seen = carry
        value, valid = lane
        total = jnp.where(valid, jnp.where(seen, combine(total, value), value), total)
        seen = seen | valid
        return (total, seen), jnp.where(seen, total, value)

    start = (jnp.zeros((), x.dtype), jnp.zeros((), bool))
    _, out = lax.scan(step, start, (x, mask))
    return out


def _masked_cummax(x: Any, mask: Any) -> Any:
    return _masked_scan(x, mask, combine=jnp.maximum)


def _masked_cummin(x: Any, mask: Any) -> Any:
    return _masked_scan(x, mask, combine=jnp.minimum)


def _masked_cumsum(x: Any, mask: Any) -> Any:
    return _masked_scan(x, mask, combine=lambda a, b: a + b)


def _masked_sort(keys: Any, values: Any, *maybe_mask: Any, descending: bool) -> list:
    """``plsc.sort_key_val``: the valid lanes first, sorted by key (stably: equal keys keep
    their order, descending too), then the others in their order; with a mask, the mask of
    the result (its first ``count`` lanes)."""
    lanes = jnp.arange(keys.shape[0], dtype=jnp.int32)
    valid = maybe_mask[0] if maybe_mask else jnp.ones(keys.shape, bool)
    # The chip compares integers as the key's own type (signed int32 with its sign bit flipped
    # into an unsigned compare: the same order); descending reverses the key order alone.
    order_key = keys
    if descending:
        if jnp.issubdtype(keys.dtype, jnp.floating):
            order_key = -keys
        else:  # ~k reverses an integer order without overflow
            order_key = ~keys
    # The lanes not valid go last in their own order: one key for all of them.
    order_key = jnp.where(valid, order_key, jnp.zeros((), order_key.dtype))
    invalid = (~valid).astype(jnp.int32)
    _, _, sorted_lanes = lax.sort((invalid, order_key, lanes), num_keys=2, is_stable=True)
    out = [keys[sorted_lanes], values[sorted_lanes]]
    if maybe_mask:
        out.append(lanes < jnp.sum(valid.astype(jnp.int32)))
    return out


def _pack_format(format: Any) -> str:
    return getattr(format, "value", str(format))


def _narrowed(x: Any, dtype: Any) -> Any:
    """``x`` in the packed element type: a float rounded (to nearest even), an integer's low
    bits."""
    if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(dtype)
    bits = jnp.dtype(dtype).itemsize * 8
    low = lax.bitcast_convert_type(x, jnp.dtype(f"uint{x.dtype.itemsize * 8}"))
    low = (low & ((1 << bits) - 1)).astype(jnp.dtype(f"uint{bits}"))
    return lax.bitcast_convert_type(low, dtype)


def _packed_dtype(a: Any, preferred_element_type: Any) -> Any:
    if preferred_element_type is not None:
        return jnp.dtype(preferred_element_type)
    return jnp.dtype(jnp.bfloat16 if a.dtype == jnp.float32 else jnp.int16)


def _pack(a: Any, b: Any, *, format: Any, preferred_element_type: Any) -> Any:
    """``plsc.pack``: ``a`` and ``b`` narrowed, interleaved ``[a0, b0, a1, b1, ...]`` or
    compressed ``[a0, a1, ..., b0, b1, ...]`` (as an ``(n, 2)`` array), per the docstring."""
    dtype = _packed_dtype(a, preferred_element_type)
    a, b = _narrowed(a, dtype), _narrowed(b, dtype)
    if _pack_format(format) == "interleaved":
        return jnp.stack([a, b], axis=-1).reshape(2 * a.size)
    return jnp.concatenate([a, b]).reshape(a.size, 2)


def _unpack(ab: Any, *, format: Any, preferred_element_type: Any) -> list:
    """``plsc.unpack``: the two arrays ``pack`` made, widened (bfloat16 exactly, an integer
    sign-extended)."""
    if preferred_element_type is not None:
        dtype = jnp.dtype(preferred_element_type)
    else:
        dtype = jnp.dtype(jnp.float32 if ab.dtype == jnp.bfloat16 else jnp.int32)
    half = ab.size // 2
    if _pack_format(format) == "interleaved":
        pairs = ab.reshape(half, 2)
        a, b = pairs[:, 0], pairs[:, 1]
    else:
        flat = ab.reshape(ab.size)
        a, b = flat[:half], flat[half:]
    return [a.astype(dtype), b.astype(dtype)]


def _population_count(x: Any, *, reduce: int) -> Any:
    """``plsc.all_reduce_population_count``: how many lanes of ``x`` are set, in every lane
    of the result."""
    count = jnp.sum(x.astype(jnp.int32))
    return jnp.full((x.shape[0] // reduce,), count, jnp.int32)


def _first_set(x: Any, *, reduce: int) -> Any:
    """``plsc.all_reduce_ffs``: the index of ``x``'s first set lane (its size if none), in every
    lane of the result."""
    lanes = jnp.arange(x.shape[0], dtype=jnp.int32)
    first = jnp.min(jnp.where(x, lanes, x.shape[0])).astype(jnp.int32)
    return jnp.full((x.shape[0] // reduce,), first, jnp.int32)


# name in sc_primitives -> (implementation, whether it returns several results)
RULES = {
    "bitcast_p": (_bitcast, False),
    "scan_count_p": (_scan_count, True),
    "masked_cummax_p": (_masked_cummax, False),
    "masked_cummin_p": (_masked_cummin, False),
    "masked_cumsum_p": (_masked_cumsum, False),
    "masked_sort_p": (_masked_sort, True),
    "pack_p": (_pack, False),
    "unpack_p": (_unpack, True),
    "all_reduce_population_count_p": (_population_count, False),
    "all_reduce_ffs_p": (_first_set, False),
}


def sparsecore_values_on_the_cpu() -> contextlib.AbstractContextManager[bool]:
    """SparseCore's value primitives (:data:`RULES`) run on the CPU while the block runs."""
    return cpu_lowerings(SC_PRIMITIVES, RULES)
