"""The SparseCore's indexed and adding copies in JAX's TPU interpreter: a DMA from
``x_hbm.at[indices]`` (a gather: row ``k`` of the destination is row ``indices[k]`` of the
source), to ``o_hbm.at[indices]`` (a scatter), with ``plsc.Indices(..., ignored_value=v)``
(rows whose index is ``v`` are left alone), and ``pltpu.sync_copy(..., add=True)`` (the
destination adds the source).

JAX's interpreter (0.10.2 to 0.12) reads an index ref as its buffer's id, an integer, and
ignores ``add``: such a kernel computed wrong values there. Here such a copy runs whole when
it starts (a schedule the chip may take: its result is defined at the wait), row by row with
the interpreter's own reads and writes, and then signals its semaphores with the bytes of its
whole view, which is what the wait counts. An adding copy adds under the interpreter's lock,
so that the subcores adding into one VMEM_SHARED buffer at once lose nothing, as the chip's
adding DMAs do; the race detector does not see its write.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from .jax_internals import private_attribute

INTERPRETER = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"


@dataclasses.dataclass(frozen=True)
class CopyPlan:
    """How one ``dma_start`` of a SparseCore kernel runs here, read from its equation.

    ``side`` is 0 when the source is indexed (a gather), 1 when the destination is (a
    scatter), None for a plain adding copy; the index is entry ``entry`` of transform
    ``transform`` of that side; the other side's rows are along ``axis`` of its view, of
    ``shape``; a wait for the whole copy counts ``nbytes``.
    """

    add: bool
    side: int | None
    transform: int
    entry: int
    axis: int
    shape: tuple[int, ...]
    ignored: int | None
    nbytes: int
    limit: str | None = None


def _index_shape(index: Any) -> tuple[int, ...]:
    """The shape of an index as unflattened from an equation's variables: an array's or a
    ref's (a variable's aval), a ref view's, ``plsc.Indices``' values'."""
    if hasattr(index, "values") and hasattr(index, "ignored_value"):
        return _index_shape(index.values)
    aval = getattr(index, "aval", None)
    shape = getattr(aval, "shape", None) if aval is not None else getattr(index, "shape", ())
    return tuple(shape or ())


def _indexed_entry(transforms: tuple) -> tuple[int, int] | None:
    """(transform, entry) of an index of more than a scalar among ``transforms`` (as
    unflattened from an equation's variables), or None."""
    indexing = private_attribute("jax._src.state.indexing")
    found = None
    for position, transform in enumerate(transforms):
        if not isinstance(transform, indexing.NDIndexer):
            continue
        for entry, index in enumerate(transform.indices):
            if not isinstance(index, indexing.Slice) and _index_shape(index):
                found = (position, entry)
    return found


def plan_copy(eqn: Any) -> CopyPlan | None:
    """The :class:`CopyPlan` of a ``dma_start`` equation, or None for a copy JAX's
    interpreter runs as the chip does (not indexed by an array or a ref, not adding)."""
    state = private_attribute("jax._src.state")
    indexing = private_attribute("jax._src.state.indexing")
    primitives = private_attribute("jax._src.pallas.mosaic.primitives")
    src, dst, _, _, device_id = eqn.params["tree"].unflatten(eqn.invars)
    _, src_transforms = primitives._get_ref_and_transforms(src)
    src_ref, _ = primitives._get_ref_and_transforms(src)
    dst_ref, dst_transforms = primitives._get_ref_and_transforms(dst)
    found = [_indexed_entry(tuple(src_transforms)), _indexed_entry(tuple(dst_transforms))]
    add = bool(eqn.params.get("add", False))
    if not add and found == [None, None]:
        return None
    limit = None
    if device_id is not None:
        limit = "an indexed or adding copy to another device"
    if found[0] is not None and found[1] is not None:
        return None  # JAX refuses it (only the source ref can be indexed): as JAX runs it
    side = 0 if found[0] is not None else (1 if found[1] is not None else None)
    transform = entry = axis = 0
    ignored = None
    shape: tuple[int, ...] = ()
    source = state.transform_type(tuple(src_transforms), src_ref.aval)
    nbytes = math.prod(source.shape) * source.dtype.itemsize
    if side is not None:
        transforms = (src_transforms, dst_transforms)[side]
        transform, entry = found[side]
        if transform != len(transforms) - 1:
            limit = "a view (reshape, bitcast) after the index of an indexed copy"
        indexer = transforms[transform]
        axis = sum(isinstance(i, indexing.Slice) for i in indexer.indices[:entry])
        ignored = getattr(indexer.indices[entry], "ignored_value", None)
        other_ref, other_transforms = ((dst_ref, dst_transforms) if side == 0
                                       else (src_ref, src_transforms))
        other = state.transform_type(tuple(other_transforms), other_ref.aval)
        shape = tuple(other.shape)
        nbytes = math.prod(other.shape) * other.dtype.itemsize
    if add:
        views = [t for t in dst_transforms if not hasattr(t, "indices")]
        if views:
            limit = "an adding copy into a view (reshape, bitcast) of a ref"
    return CopyPlan(add, side, transform, entry, axis, shape, ignored, nbytes, limit)


def _row_indexer(shape: tuple[int, ...], axis: int, row: int) -> Any:
    indexing = private_attribute("jax._src.state.indexing")
    return indexing.NDIndexer.from_indices_shape(
        tuple(slice(None) for _ in range(axis)) + (row,), shape)


def _with_entry(transforms: tuple, transform: int, entry: int, value: Any) -> tuple:
    indexer = transforms[transform]
    indices = list(indexer.indices)
    indices[entry] = value
    changed = dataclasses.replace(indexer, indices=tuple(indices), int_indexer_shape=())
    return (*transforms[:transform], changed, *transforms[transform + 1:])


def copy_rows(token: Any, device_id: Any, local_core_id: Any, src_space: Any, src_id: Any,
              src_transforms: Any, dst_space: Any, dst_id: Any, dst_transforms: Any,
              dst_sem: Any, src_sem: Any, *, plan: CopyPlan, source_info: Any = None) -> Any:
    """Run the copy ``plan`` describes, whole, and signal its semaphores (a callback of the
    interpreter's, its operands as the interpreter's ``dma_start`` gets them, the index
    entry holding the index values)."""
    interpreter = private_attribute(INTERPRETER)
    utils = private_attribute("jax._src.pallas.mosaic.interpret.utils")
    shared = interpreter._get_shared_memory()
    device, core = int(device_id), int(local_core_id)
    src_transforms = tuple(jax.tree.map(np.asarray, tuple(src_transforms)))
    dst_transforms = tuple(jax.tree.map(np.asarray, tuple(dst_transforms)))

    def scalars(transforms: tuple) -> tuple:
        return tuple(jax.tree.map(int, transforms))

    if plan.side is None:
        rows = [(scalars(src_transforms), scalars(dst_transforms))]
    else:
        indexed = (src_transforms, dst_transforms)[plan.side]
        values = np.asarray(indexed[plan.transform].indices[plan.entry]).reshape(-1)
        rows = []
        for row, value in enumerate(values.tolist()):
            if plan.ignored is not None and value == plan.ignored:
                continue
            this = scalars(_with_entry(indexed, plan.transform, plan.entry, int(value)))
            other = (dst_transforms, src_transforms)[plan.side]
            other = (*scalars(other), _row_indexer(plan.shape, plan.axis, row))
            rows.append((this, other) if plan.side == 0 else (other, this))
    names = interpreter.TPU_MEMORY_SPACE_NAMES
    for src_row, dst_row in rows:
        # The callback's own token: JAX's error handler reads it (int(token)) when an
        # access fails, and a None there hid the access's own error behind a TypeError.
        token, data = interpreter.get(token, device, core, src_space, src_id, src_row,
                                      source_info=source_info)
        data = np.asarray(data)
        if not plan.add:
            token = interpreter.store(token, device, core, dst_space, dst_id, dst_row, data,
                                      source_info=source_info)
            continue
        space = names[int(dst_space)]
        key = (space, int(dst_id), device, interpreter._local_core_id_or_zero_if_hbm(core, space))
        where = utils.to_range(dst_row)
        with shared.lock:
            buffer = shared.mem[key]
            buffer[where] = buffer[where] + data
    # What the wait counts: the bytes of the whole view, rows left alone included.
    global_core = shared.get_global_core_id(device, core)
    ids = (None if src_sem is None else int(np.asarray(src_sem)), int(np.asarray(dst_sem)))
    semaphores, clock = shared.get_semaphores_and_increment_clock(ids, global_core)
    for semaphore in semaphores:
        if semaphore is not None:
            semaphore.signal(plan.nbytes, global_core, clock)
    return token

