"""Reshaped and bitcast refs (``ref.reshape(...)``, ``ref.bitcast(...)``) in JAX's TPU interpreter.

Part of the compatibility layer (see ``_compat.jax_internals``): every private JAX
internal used here is reached through ``_compat.jax_internals.private_attribute``, and the
fix is a context manager that puts JAX back as it was on exit. Tested at both
ends of the supported range in ``tests/test_interpreter_compat.py``.

The interpreter turns a ref's transforms into one index range and assumes each is
an indexer (``interpret/utils.py: to_range``), so a load, store or DMA through a
view stopped with "'ReshapeTransform' object has no attribute 'indices'". Here
the indexers before the first other transform select a *block* of the buffer, as
before, and the rest (the views) apply to that block with NumPy, in the semantics
of JAX's state discharge (``jax._src.state.discharge.transform_array``; a bitcast
that changes the bit width packs along the second-minor axis, row 2i in the low
half).

The views are run backwards to find which elements of the block an access
addresses; those are read or written, box by box, with the interpreter's own
``get`` / ``store`` / ``swap`` on exact index ranges, and a write never reads. So
the race detector sees exactly the elements the kernel touched: two cores writing
disjoint rows of one reshaped buffer do not race, two writing the same rows do,
and a DMA reading one page of a reshaped cache does not race with a write to
another page.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .interpreter_fixes import value_bits
from .jax_internals import JaxInternalsChanged, attributes_replaced, private_attribute

INTERPRETER_MODULE = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"
_UTILS = "jax._src.pallas.mosaic.interpret.utils"
_INDEXING = "jax._src.state.indexing"


def _split_at_first_view(transforms: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(the indexers that select a block of the buffer, the transforms applied to it)."""
    transforms = tuple(transforms or ())
    for position, transform in enumerate(transforms):
        if not hasattr(transform, "indices"):
            return transforms[:position], transforms[position:]
    return transforms, ()


def _bitcast(array: Any, dtype: Any) -> Any:
    """``array`` bitcast to ``dtype`` as Mosaic does: a width change packs the second-minor axis."""
    dtype = np.dtype(dtype)
    if _is_sub_byte(array.dtype) or _is_sub_byte(dtype):
        # NumPy holds a 4-bit value in a byte: the views below would pack bytes, not nibbles.
        raise NotImplementedError(f"a bitcast between {array.dtype} and {dtype} refs (a "
                                  "4-bit type) in the TPU interpreter")
    source_bits, target_bits = array.dtype.itemsize * 8, dtype.itemsize * 8
    array = np.ascontiguousarray(array)
    if source_bits == target_bits:
        return array.view(dtype)
    if array.ndim < 2:
        raise NotImplementedError("a bitcast that changes the bit width needs 2 dimensions")
    shape = list(array.shape)
    shape[-2] = shape[-2] * source_bits // target_bits
    if source_bits < target_bits:  # pack `ratio` rows into one
        ratio = target_bits // source_bits
        grouped = array.reshape(*array.shape[:-2], array.shape[-2] // ratio, ratio, -1)
        return np.ascontiguousarray(grouped.swapaxes(-1, -2)).view(dtype).reshape(shape)
    ratio = source_bits // target_bits  # unpack one row into `ratio`
    pieces = array.view(dtype).reshape(*array.shape, ratio)
    return np.ascontiguousarray(pieces.swapaxes(-1, -2)).reshape(shape)


def _is_sub_byte(dtype: Any) -> bool:
    numeric = jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)
    return bool(numeric) and value_bits(dtype) < 8


def _kind(transform: Any) -> str:
    if hasattr(transform, "indices"):
        return "index"
    name = type(transform).__name__
    if name in ("ReshapeTransform", "BitcastTransform"):
        return name
    raise NotImplementedError(f"the TPU interpreter cannot apply {transform!r} to a ref")


def _apply_views(views: tuple[Any, ...], block: Any, to_range: Any) -> Any:
    """What the kernel sees through ``views`` of ``block`` (a NumPy array)."""
    for transform in views:
        kind = _kind(transform)
        if kind == "index":
            block = block[to_range((transform,))]
        elif kind == "ReshapeTransform":
            block = block.reshape(tuple(transform.shape))
        else:
            block = _bitcast(block, transform.dtype)
    return block


def _write_through_views(views: tuple[Any, ...], block: Any, value: Any, to_range: Any) -> Any:
    """``block`` with ``value`` written through ``views`` (a new array; ``block`` is kept)."""
    if not views:
        return np.asarray(value, block.dtype).reshape(block.shape)
    transform, rest = views[0], views[1:]
    kind = _kind(transform)
    seen = _apply_views((transform,), block, to_range)
    written = _write_through_views(rest, np.array(seen), value, to_range)
    if kind == "index":
        block = block.copy()
        block[to_range((transform,))] = written
        return block
    if kind == "ReshapeTransform":
        return written.reshape(block.shape)
    return _bitcast(written, block.dtype).reshape(block.shape)


def _all_bits(shape: tuple[int, ...], dtype: Any) -> Any:
    unsigned = np.dtype(f"u{np.dtype(dtype).itemsize}")
    return np.full(shape, np.iinfo(unsigned).max, unsigned).view(dtype)


def dtype_bits(array: Any) -> Any:
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def _boxes(mask: Any) -> list[tuple[slice, ...]]:
    """The True elements of ``mask`` as disjoint boxes (one tuple of slices each), exactly.

    A mask that is one box (the usual access: a whole block, a page, a row range) is found
    from its bounding box at once; otherwise runs of equal rows along the first axis share
    their boxes.
    """
    if mask.ndim == 0:
        return [()] if bool(mask) else []
    if not mask.any():
        return []
    bounds = []
    for axis in range(mask.ndim):
        present = np.flatnonzero(mask.any(axis=tuple(a for a in range(mask.ndim) if a != axis)))
        bounds.append(slice(int(present[0]), int(present[-1]) + 1))
    box = tuple(bounds)
    if mask[box].all():
        return [box]
    boxes: list[tuple[slice, ...]] = []
    start, rows = 0, mask.shape[0]
    while start < rows:
        stop = start + 1
        while stop < rows and np.array_equal(mask[stop], mask[start]):
            stop += 1
        boxes.extend((slice(start, stop), *inner) for inner in _boxes(mask[start]))
        start = stop
    return boxes


# Which block elements an access through views addresses depends on the views and the
# block's shape and dtype alone: read once per geometry (a kernel reads the same page view
# at every grid step), not at every access.
_GEOMETRY_CACHE_SIZE = 1024


_read_boxes_seen: dict[tuple[Any, ...], tuple[tuple[slice, ...], ...]] = {}


def _read_boxes(views: tuple[Any, ...], block_shape: tuple[int, ...], dtype: Any,
                to_range: Any) -> tuple[tuple[slice, ...], ...]:
    """The boxes of a block of ``block_shape`` and ``dtype`` that a read through ``views``
    sees."""
    key = (_geometry(views), block_shape, dtype)
    boxes = _read_boxes_seen.get(key)
    if boxes is None:
        if len(_read_boxes_seen) >= _GEOMETRY_CACHE_SIZE:
            _read_boxes_seen.clear()
        block = np.zeros(block_shape, dtype)
        boxes = _read_boxes_seen[key] = tuple(_boxes(_addressed_by_read(views, block,
                                                                       to_range)))
    return boxes


def _geometry(views: tuple[Any, ...]) -> tuple[Any, ...]:
    """``views`` (transforms whose indices are ints) as a hashable key."""
    leaves, structure = jax.tree.flatten(views)
    return structure, tuple(leaves)


class _ViewWrite:
    """A value written through views of a block: which block elements it sets, to what."""

    def __init__(self, views: tuple[Any, ...], block_shape: tuple[int, ...], dtype: Any,
                 value: Any, mask: Any, to_range: Any) -> None:
        zeros = np.zeros(block_shape, dtype)
        view_shape, view_dtype = np.shape(value), np.asarray(value).dtype
        self.addressed = _written_elements(views, tuple(block_shape), np.dtype(dtype),
                                           tuple(view_shape), np.dtype(view_dtype), to_range)
        full = np.iinfo(np.dtype(f"u{np.dtype(dtype).itemsize}")).max
        self.values = _write_through_views(views, zeros, value, to_range)
        self.mask = None
        if mask is not None:
            unsigned = np.dtype(f"u{view_dtype.itemsize}")
            ones = np.where(np.asarray(mask, bool), np.iinfo(unsigned).max, 0).astype(
                unsigned).view(view_dtype)
            self.mask = dtype_bits(_write_through_views(views, zeros, ones, to_range)) == full
        self.views, self.to_range = views, to_range


_written_seen: dict[tuple[Any, ...], Any] = {}
_PARTIAL_WRITE = ("a write through a bitcast ref that sets part of a packed element (the "
                  "interpreter would have to read the rest of it)")


def _written_elements(views: tuple[Any, ...], block_shape: tuple[int, ...], dtype: Any,
                      view_shape: tuple[int, ...], view_dtype: Any, to_range: Any) -> Any:
    """Which elements of a block a write of a ``view_shape`` value through ``views`` sets,
    found by writing all-ones bits into zeros (an element with some but not all of its bits
    set is part of a packed word, which the write would have to read): once per geometry."""
    key = (_geometry(views), block_shape, dtype, view_shape, view_dtype)
    addressed = _written_seen.get(key)
    if addressed is None:
        if len(_written_seen) >= _GEOMETRY_CACHE_SIZE:
            _written_seen.clear()
        bits = dtype_bits(_write_through_views(views, np.zeros(block_shape, dtype),
                                               _all_bits(view_shape, view_dtype), to_range))
        full = np.iinfo(bits.dtype).max
        if ((bits != 0) & (bits != full)).any():
            raise NotImplementedError(_PARTIAL_WRITE)
        addressed = _written_seen[key] = bits == full
        addressed.setflags(write=False)
    return addressed


def _addressed_by_read(views: tuple[Any, ...], block: Any, to_range: Any) -> Any:
    """Which elements of ``block`` a read through ``views`` sees (a whole packed word for part)."""
    seen = _apply_views(views, block, to_range)
    marked = _write_through_views(views, np.zeros_like(block),
                                  _all_bits(seen.shape, seen.dtype), to_range)
    return dtype_bits(marked) != 0


# The common view is a chain of reshapes and bitcasts, then indexers (a page of a reshaped
# cache, a row of a scratch buffer seen as bytes): each access moves a few hundred bytes of
# a block that may be megabytes. Running the views over the whole block at every access
# made such kernels quadratic in their block size. Instead, which byte of the block each
# byte of the chain's view is, is found once per chain (by running the views over the
# bytes' own numbers), and each access indexes that map.
_BYTE_MAP_LIMIT = 16 << 20      # a block larger than this (bytes) takes the general path
_BYTE_MAPS_BUDGET = 256 << 20   # the maps kept at once (bytes of map), then cleared
_byte_maps: dict[tuple[Any, ...], Any] = {}
_accesses: dict[tuple[Any, ...], _ByteAccess | None] = {}


class _ByteAccess:
    """One access through views that selects a single box of the block: the box, and for
    every byte of the view (in C order, a value's bytes), its offset in the box's bytes."""

    def __init__(self, box: tuple[slice, ...], box_shape: tuple[int, ...], dtype: Any,
                 positions: Any, view_shape: tuple[int, ...], view_dtype: Any,
                 complete: bool) -> None:
        self.box, self.box_shape, self.dtype = box, box_shape, dtype
        self.positions, self.view_shape, self.view_dtype = positions, view_shape, view_dtype
        self.complete = complete  # every element of the box wholly written by the view

    def read(self, box_values: Any) -> Any:
        """What the kernel sees through the views, from the box's values."""
        raw = np.ascontiguousarray(np.asarray(box_values, self.dtype)).reshape(-1).view(np.uint8)
        return raw[self.positions].view(self.view_dtype).reshape(self.view_shape)

    def box_values(self, value: Any) -> Any:
        """The box's new values once ``value`` is written through the views."""
        if not self.complete:
            raise NotImplementedError(_PARTIAL_WRITE)
        raw = np.ascontiguousarray(np.asarray(value, self.view_dtype)).reshape(-1).view(np.uint8)
        box = np.empty(len(self.positions), np.uint8)
        box[self.positions] = raw
        return box.view(self.dtype).reshape(self.box_shape)


def _byte_map(chain: tuple[Any, ...], block_shape: tuple[int, ...], dtype: Any,
              to_range: Any) -> Any:
    """For each byte of what ``chain`` (reshapes and bitcasts) makes of a block, the block
    byte it is (shape: the view's, then its bytes); None where the general path must do."""
    key = (_geometry(chain), block_shape, dtype)
    if key in _byte_maps:
        return _byte_maps[key]
    size = int(np.prod(block_shape, dtype=np.int64)) * dtype.itemsize
    if size == 0 or size > _BYTE_MAP_LIMIT:
        return None
    numbers = np.arange(size, dtype=np.uint32)
    proxy = np.dtype(f"u{dtype.itemsize}")  # the same bytes, moved as _bitcast moves them
    byte_map = None
    for digit in range(max(1, (int(size - 1).bit_length() + 7) // 8)):
        digits = ((numbers >> (8 * digit)) & 0xFF).astype(np.uint8)
        seen = _apply_views(chain, digits.view(proxy).reshape(block_shape), to_range)
        if seen.ndim == 0:
            return None
        seen_bytes = np.ascontiguousarray(seen).view(np.uint8).reshape(
            *seen.shape, seen.dtype.itemsize)
        part = seen_bytes.astype(np.uint32) << np.uint32(8 * digit)
        byte_map = part if byte_map is None else byte_map | part
    byte_map.setflags(write=False)
    if sum(kept.nbytes for kept in _byte_maps.values()) > _BYTE_MAPS_BUDGET:
        _byte_maps.clear()
    _byte_maps[key] = byte_map
    return byte_map


def _byte_access(views: tuple[Any, ...], block_shape: tuple[int, ...], dtype: Any,
                 to_range: Any) -> _ByteAccess | None:
    """The access ``views`` (int indices) make of a block, when they are a chain of reshapes
    and bitcasts then indexers, and select one box of whole or packed elements; else None."""
    key = (_geometry(views), block_shape, dtype)
    if key in _accesses:
        return _accesses[key]
    if len(_accesses) >= _GEOMETRY_CACHE_SIZE:
        _accesses.clear()
    access = _accesses[key] = _new_byte_access(views, block_shape, dtype, to_range)
    return access


def _new_byte_access(views: tuple[Any, ...], block_shape: tuple[int, ...], dtype: Any,
                     to_range: Any) -> _ByteAccess | None:
    kinds = [_kind(transform) for transform in views]
    chain_length = next((n for n, kind in enumerate(kinds) if kind == "index"), len(kinds))
    chain, indexers = views[:chain_length], views[chain_length:]
    if any(kind != "index" for kind in kinds[chain_length:]):
        return None
    bitcasts = [np.dtype(t.dtype) for t in chain if _kind(t) == "BitcastTransform"]
    if _is_sub_byte(dtype) or any(_is_sub_byte(target) for target in bitcasts):
        return None  # the general path names the limit
    try:
        byte_map = _byte_map(chain, block_shape, dtype, to_range)
    except NotImplementedError:
        return None
    if byte_map is None:
        return None
    for transform in indexers:
        indices = to_range((transform,))
        if not all(isinstance(index, (int, np.integer, slice)) for index in indices):
            return None
        byte_map = byte_map[indices]
    if byte_map.size == 0:
        return None
    flat = byte_map.reshape(-1).astype(np.int64)
    elements = flat // dtype.itemsize
    present, counts = np.unique(elements, return_counts=True)
    corners = np.unravel_index(present, block_shape)
    low = [int(axis.min()) for axis in corners]
    box_shape = tuple(int(axis.max()) + 1 - start for axis, start in zip(corners, low))
    if int(np.prod(box_shape, dtype=np.int64)) != len(present):
        return None  # not one box: the general path splits it
    where = np.unravel_index(elements, block_shape)
    local = np.ravel_multi_index(tuple(axis - start for axis, start in zip(where, low)),
                                 box_shape)
    positions = local * dtype.itemsize + flat % dtype.itemsize
    return _ByteAccess(tuple(slice(start, start + n) for start, n in zip(low, box_shape)),
                       box_shape, dtype, positions, tuple(byte_map.shape[:-1]),
                       bitcasts[-1] if bitcasts else dtype,
                       bool((counts == dtype.itemsize).all()))


def _block_shape(buffer_shape: tuple[int, ...], rnge: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape a range of the buffer selects (an int index drops its axis)."""
    shape = []
    for index in rnge:
        if isinstance(index, slice):
            shape.append(len(range(index.start, index.stop, index.step or 1)))
    return (*shape, *buffer_shape[len(rnge):])


def _in_bounds_shape(buffer_shape: tuple[int, ...],
                     rnge: tuple[Any, ...]) -> tuple[int, ...] | None:
    """The shape of the part of a range inside the buffer (int indices dropped), or None when an
    index is out of bounds or a slice has a step (left to JAX)."""
    shape = []
    for size, index in zip(buffer_shape, (*rnge, *(slice(0, n) for n in
                                                    buffer_shape[len(rnge):]))):
        if isinstance(index, slice):
            if index.step not in (None, 1):
                return None
            shape.append(max(0, min(index.stop, size) - index.start))
        elif not 0 <= index < size:
            return None
    return tuple(shape)


def _wrongly_refused(mask: Any, in_bounds_shape: tuple[int, ...]) -> bool:
    """Whether JAX's masked-swap bounds check refuses ``mask`` though its True elements are all
    inside ``in_bounds_shape``.

    JAX (0.10 to 0.12, ``SharedMemory.swap_buffer_content``) marks the out-of-bounds part
    with ``in_bounds_mask[in_bounds_shape[i]:] = False`` for every axis i, which always
    slices the first axis: a masked store of rows 0:8 into an (8, 2, 128) block is
    refused because axis 1 has 2 elements. The fix upstream indexes axis i.
    """
    as_jax_checks = np.ones(mask.shape, bool)
    for size in in_bounds_shape:
        as_jax_checks[size:] = False
    in_bounds = np.zeros(mask.shape, bool)
    in_bounds[tuple(slice(0, size) for size in in_bounds_shape)] = True
    return bool((mask & ~as_jax_checks).any() and not (mask & ~in_bounds).any())


@contextlib.contextmanager
def reshaped_and_bitcast_refs() -> Iterator[bool]:
    """Loads, stores and DMAs from and to a reshaped or bitcast ref run in JAX's TPU interpreter.

    Yields False when the interpreter's ``get``, ``store`` and ``swap`` cannot be wrapped
    (JAX's behaviour then: it raises, and the plugin's fallback names the limitation).
    """
    try:
        module = private_attribute(INTERPRETER_MODULE)
        originals = {name: getattr(module, name) for name in ("get", "store", "swap")}
        raws = {name: function.__wrapped__ for name, function in originals.items()}
        wrap = module.fail_on_exception
        shared_memory = module._get_shared_memory
        space_names = module.TPU_MEMORY_SPACE_NAMES
        core_for_buffer = module._local_core_id_or_zero_if_hbm
        to_range = private_attribute(_UTILS).to_range
        indexing = private_attribute(_INDEXING)
        make_indexer, make_slice = indexing.NDIndexer.from_indices_shape, indexing.Slice
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    def buffer_of(device_id: Any, local_core_id: Any, memory_space: Any, buffer_id: Any) -> Any:
        space = space_names[int(memory_space)]
        key = (space, int(buffer_id), int(device_id), core_for_buffer(int(local_core_id), space))
        return shared_memory().mem[key]

    def box_indexer(box: tuple[slice, ...], block_shape: tuple[int, ...]) -> Any:
        """The indexer of ``box`` of a block, which the interpreter composes with the block's."""
        return make_indexer(tuple(make_slice(b.start, b.stop - b.start) for b in box),
                            block_shape)

    def view_write(device_id: Any, local_core_id: Any, memory_space: Any, buffer_id: Any,
                   block_transforms: tuple[Any, ...], views: tuple[Any, ...], value: Any,
                   mask: Any = None) -> tuple[_ViewWrite, list[tuple[Any, tuple[Any, ...]]]]:
        """The write, and per box of the block it sets (the mask's part of it, if masked):
        (the box, the transforms to it)."""
        buffer = buffer_of(device_id, local_core_id, memory_space, buffer_id)
        block_shape = _block_shape(tuple(buffer.logical_shape), to_range(block_transforms))
        write = _ViewWrite(views, block_shape, buffer.dtype, np.asarray(value), mask, to_range)
        written = write.addressed if write.mask is None else write.addressed & write.mask
        boxes = [(box, (*block_transforms, box_indexer(box, block_shape)))
                 for box in _boxes(written)]
        return write, boxes

    def box_access(device_id: Any, local_core_id: Any, memory_space: Any, buffer_id: Any,
                   block_transforms: tuple[Any, ...], views: tuple[Any, ...],
                   value: Any) -> tuple[_ByteAccess, tuple[Any, ...]] | None:
        """A write of ``value`` as one box of the block (the access, the transforms to the
        box), or None where the general path must do."""
        buffer = buffer_of(device_id, local_core_id, memory_space, buffer_id)
        block_shape = _block_shape(tuple(buffer.logical_shape), to_range(block_transforms))
        access = _byte_access(views, block_shape, np.dtype(buffer.dtype), to_range)
        if access is None or np.shape(value) != access.view_shape:
            return None
        return access, (*block_transforms, box_indexer(access.box, block_shape))

    def get(token: Any, device_id: Any, local_core_id: Any, memory_space: Any,
            buffer_id: Any, transforms: Any, *args: Any, **kwargs: Any) -> Any:
        block_transforms, views = _split_at_first_view(transforms)
        if not views:
            return raws["get"](token, device_id, local_core_id, memory_space, buffer_id,
                               transforms, *args, **kwargs)
        block_transforms, views = jax.tree.map(int, (block_transforms, views))
        buffer = buffer_of(device_id, local_core_id, memory_space, buffer_id)
        block_shape = _block_shape(tuple(buffer.logical_shape), to_range(block_transforms))
        access = _byte_access(views, block_shape, np.dtype(buffer.dtype), to_range)
        if access is not None:
            token, values = raws["get"](token, device_id, local_core_id, memory_space,
                                        buffer_id, (*block_transforms,
                                                    box_indexer(access.box, block_shape)),
                                        *args, **kwargs)
            return token, access.read(values)
        block = np.zeros(block_shape, buffer.dtype)
        for box in _read_boxes(views, block_shape, np.dtype(buffer.dtype), to_range):
            box_transforms = (*block_transforms, box_indexer(box, block_shape))
            token, block[box] = raws["get"](token, device_id, local_core_id, memory_space,
                                            buffer_id, box_transforms, *args, **kwargs)
        return token, _apply_views(views, block, to_range)

    def store(token: Any, device_id: Any, local_core_id: Any, memory_space: Any,
              buffer_id: Any, transforms: Any, val: Any, *args: Any, **kwargs: Any) -> Any:
        block_transforms, views = _split_at_first_view(transforms)
        if not views:
            return raws["store"](token, device_id, local_core_id, memory_space, buffer_id,
                                 transforms, val, *args, **kwargs)
        block_transforms, views = jax.tree.map(int, (block_transforms, views))
        fast = box_access(device_id, local_core_id, memory_space, buffer_id,
                          block_transforms, views, val)
        if fast is not None:
            access, box_transforms = fast
            return raws["store"](token, device_id, local_core_id, memory_space, buffer_id,
                                 box_transforms, access.box_values(val), *args, **kwargs)
        write, boxes = view_write(device_id, local_core_id, memory_space, buffer_id,
                                  block_transforms, views, val)
        for box, box_transforms in boxes:
            token = raws["store"](token, device_id, local_core_id, memory_space, buffer_id,
                                  box_transforms, write.values[box], *args, **kwargs)
        return token

    def masked_swap_by_boxes(token: Any, device_id: Any, local_core_id: Any,
                             memory_space: Any, buffer_id: Any, transforms: Any, val: Any,
                             mask: Any, *args: Any, **kwargs: Any) -> Any:
        """A masked store that JAX's bounds check would refuse though every masked element is
        in bounds, done as unmasked stores of the mask's boxes; None for any other swap."""
        transforms = jax.tree.map(int, tuple(transforms))
        rnge = to_range(transforms)
        buffer = buffer_of(device_id, local_core_id, memory_space, buffer_id)
        mask, val = np.asarray(mask, bool), np.asarray(val)
        in_bounds = _in_bounds_shape(tuple(buffer.logical_shape), rnge)
        if in_bounds is None or not _wrongly_refused(mask, in_bounds):
            return None
        block_shape = _block_shape(tuple(buffer.logical_shape), rnge)
        old = val.copy()  # JAX's masked swap returns the value where the mask is off
        for box in _boxes(mask):
            token, old[box] = raws["swap"](token, device_id, local_core_id, memory_space,
                                           buffer_id, (*transforms, box_indexer(box, block_shape)),
                                           val[box], None, *args, **kwargs)
        return token, old

    def swap(token: Any, device_id: Any, local_core_id: Any, memory_space: Any,
             buffer_id: Any, transforms: Any, val: Any, mask: Any, *args: Any,
             **kwargs: Any) -> Any:
        block_transforms, views = _split_at_first_view(transforms)
        if not views:
            done = None if mask is None else masked_swap_by_boxes(
                token, device_id, local_core_id, memory_space, buffer_id, transforms, val,
                mask, *args, **kwargs)
            if done is not None:
                return done
            return raws["swap"](token, device_id, local_core_id, memory_space, buffer_id,
                                transforms, val, mask, *args, **kwargs)
        block_transforms, views = jax.tree.map(int, (block_transforms, views))
        fast = None if mask is not None else box_access(
            device_id, local_core_id, memory_space, buffer_id, block_transforms, views, val)
        if fast is not None:
            access, box_transforms = fast
            token, old = raws["swap"](token, device_id, local_core_id, memory_space,
                                      buffer_id, box_transforms, access.box_values(val), None,
                                      *args, **kwargs)
            return token, access.read(old)
        write, boxes = view_write(device_id, local_core_id, memory_space, buffer_id,
                                  block_transforms, views, val, mask)
        # Each box is written whole (a masked store's boxes are its mask's), so no masked
        # swap of JAX's runs here. Where the mask is off, a masked swap returns the value.
        old = write.values.copy()
        for box, box_transforms in boxes:
            token, old[box] = raws["swap"](token, device_id, local_core_id, memory_space,
                                           buffer_id, box_transforms, write.values[box], None,
                                           *args, **kwargs)
        return token, _apply_views(views, old, write.to_range)

    replacements = {"get": get, "store": store, "swap": swap}
    for name, function in replacements.items():
        # The interpreter's own module, so its callbacks are recognised as its
        # (_compat.interpreter_fixes.interpreter_callbacks_on_host_arrays).
        function.__module__ = originals[name].__module__
    with attributes_replaced(module, {name: wrap(function)
                                      for name, function in replacements.items()}):
        yield True
