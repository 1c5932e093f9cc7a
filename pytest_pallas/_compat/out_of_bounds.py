"""Out-of-bounds reads in JAX's TPU interpreter as the chip does them: a stop where the chip
halts the kernel, poison where it reads whatever memory lies there, and a record of each.

What the chip checks is read from libtpu's own code (``CHIP_BOUNDS_CHECKS``): compiled for a
chip, each load, store and DMA of a kernel either has a ``BoundsCheck`` before it (a
``shalt.err`` that stops the kernel when the access leaves its buffer) or none. JAX's
interpreter raises at every out-of-bounds read (``out_of_bounds_reads="raise"``, its
default), or poisons every one (``"uninitialized"``); :func:`reads_as_the_chip_reads` keeps
the stop for the reads the chip checks and poisons the others, and
:func:`unchecked_reads_recorded` lists the poisoned reads, so that a test whose result used
one can say which read it was. Part of the compatibility layer: every private JAX internal
here is reached through ``jax_internals.private_attribute``, and the fix yields False where
the interpreter moved (JAX's behaviour then: every such read stops).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

import jax

from . import tpu_interpreter
from .jax_internals import JaxInternalsChanged, attributes_replaced, private_attribute
from .recordings import Recordings

_INTERPRETER = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"
_SHARED_MEMORY = "jax._src.pallas.mosaic.interpret.shared_memory"
_UTILS = "jax._src.pallas.mosaic.interpret.utils"
_SOURCE_INFO = "jax._src.source_info_util"

LIBTPU_READ = ("libtpu 0.0.42.1 (jax 0.10.2)", "libtpu 0.0.50.1 (jax 0.12.0.1)")
# The chips whose code was read; the facts were the same for each, in both versions.
CHIPS_READ = ("v4", "v5e", "v5p", "v6e", "7x")
_SOURCE = (f"{' and '.join(LIBTPU_READ)}, *-post-bounds-check.txt of the kernel compiled for "
           f"{', '.join(CHIPS_READ)} (benchmarks/bounds_checks.py prints it, "
           "tests/test_out_of_bounds.py reads it again)")


@dataclasses.dataclass(frozen=True)
class BoundsCheck:
    """Whether the chip checks one kind of access at a dynamic index, and what it compiles to.

    ``kind`` is ``"load"`` or ``"store"`` (in the kernel's body), ``"dma"`` (an async copy)
    or ``"block"`` (the copy of a BlockSpec's block by Pallas's pipeline); ``source`` and
    ``destination`` the memory spaces, as the interpreter names them ("smem", "vmem",
    "hbm"). ``halts``: libtpu emits a ``BoundsCheck`` that stops the kernel when the access
    leaves its buffer (with Mosaic's default ``disable_bounds_checks=False``; ``True``
    removes every one); else the chip reads or writes whatever memory lies there.
    """

    access: str
    kind: str
    source: str
    destination: str
    instruction: str  # what libtpu compiles it to: "sld [smem]", "dma.hbm_to_vmem", ...
    halts: bool
    source_of_fact: str = _SOURCE


CHIP_BOUNDS_CHECKS: dict[str, BoundsCheck] = {row.access: row for row in (
    BoundsCheck("SMEM scalar load", "load", "smem", "", "sld [smem]", False),
    BoundsCheck("SMEM scalar store", "store", "", "smem", "sst [smem]", False),
    BoundsCheck("VMEM vector load", "load", "vmem", "", "vld [vmem]", False),
    BoundsCheck("VMEM vector store", "store", "", "vmem", "vst [vmem]", False),
    BoundsCheck("DMA HBM to VMEM, HBM offset", "dma", "hbm", "vmem", "dma.hbm_to_vmem", True),
    BoundsCheck("DMA HBM to VMEM, VMEM offset", "dma", "hbm", "vmem", "dma.hbm_to_vmem", True),
    BoundsCheck("DMA VMEM to HBM, HBM offset", "dma", "vmem", "hbm", "dma.vmem_to_hbm", True),
    BoundsCheck("DMA VMEM to HBM, VMEM offset", "dma", "vmem", "hbm", "dma.vmem_to_hbm", True),
    BoundsCheck("DMA HBM to SMEM, HBM offset", "dma", "hbm", "smem", "dma.hbm_to_smem", True),
    # Mosaic compiles a copy within VMEM to a loop of vector loads and stores, not a DMA.
    BoundsCheck("DMA VMEM to VMEM, source offset", "dma", "vmem", "vmem", "vld [vmem]", False),
    BoundsCheck("BlockSpec block index from scalar prefetch", "block", "hbm", "vmem",
                "dma.hbm_to_vmem", True),
)}


@functools.cache
def chip_halts(kind: str, source: str, destination: str = "") -> bool:
    """Whether the chip stops a kernel whose read of this kind leaves its buffer. A pl.ANY
    operand counts as HBM; a read the table does not list is taken as checked (a stop, as
    JAX's interpreter does)."""
    source = "hbm" if source == "any" else source
    destination = "hbm" if destination == "any" else destination
    for row in CHIP_BOUNDS_CHECKS.values():
        if row.kind == kind and row.source == source and row.destination in ("", destination):
            return row.halts
    return True


@dataclasses.dataclass(frozen=True)
class UncheckedRead:
    """A read past a buffer that the chip does not check, which the interpreter poisoned."""

    kernel: str  # the running kernel, as the interpreter names it ("body at kernels.py:12")
    how: str  # "load" (in the kernel's body) or "DMA"
    space: str  # the buffer's memory space, "SMEM", "VMEM"
    index: str  # the read's index, "[16]", "[24:32, 0:128]"
    shape: tuple[int, ...] | None  # the buffer's shape, None when unknown
    where: str  # the read's line, "kernels.py:14 (gather)"; "" when unknown

    def describe(self) -> str:
        """``kernel 'gather at k.py:8' loaded [16] of a (16,) SMEM buffer (k.py:11 (body))``."""
        shape = f" {self.shape}" if self.shape is not None else ""
        verb = "loaded" if self.how == "load" else "copied (a DMA)"
        where = f" ({self.where})" if self.where else ""
        return f"kernel {self.kernel!r} {verb} {self.index} of a{shape} {self.space} buffer{where}"


_UNCHECKED_READS: Recordings[UncheckedRead] = Recordings()


def unchecked_reads_recorded() -> contextlib.AbstractContextManager[list[UncheckedRead]]:
    """Collect an :class:`UncheckedRead` for each read :func:`reads_as_the_chip_reads` poisons
    (or a kernel's own ``out_of_bounds_reads="uninitialized"`` does) while the block runs."""
    return _UNCHECKED_READS.recorded()


class _Reading(threading.local):
    """The read the interpreter is doing on this thread: each simulated core is a thread."""

    access: dict[str, Any] | None = None
    dma_destination: str | None = None


_READING = _Reading()


@contextlib.contextmanager
def reads_as_the_chip_reads() -> Iterator[bool]:
    """An out-of-bounds read in JAX's TPU interpreter stops the kernel where the chip halts it
    (a DMA, a BlockSpec's block) and reads poison where the chip has no check (a load from
    SMEM or VMEM in the kernel's body, a copy within VMEM); ``CHIP_BOUNDS_CHECKS`` says which.

    The interpreter's ``get`` asks its shared memory's ``out_of_bounds_reads`` only once it
    found the read out of bounds; within this block that question is answered per read:
    "uninitialized" (the interpreter's poison: NaN, an integer's fill) for a read the chip
    does not check, the kernel's own setting for the others. Each poisoned read is recorded
    (:func:`unchecked_reads_recorded`). Yields False where the interpreter moved.
    """
    try:
        module = private_attribute(_INTERPRETER)
        original, original_swap = module.get, module.swap
        raw = original.__wrapped__
        original_swap.__wrapped__  # noqa: B018  # the swap without its error handler
        module.fail_on_exception  # noqa: B018
        dma_class = module.DMA
        original_execute_read = dma_class.execute_read
        space_names = module.TPU_MEMORY_SPACE_NAMES
        shared_memory_class = private_attribute(_SHARED_MEMORY, "SharedMemory")
        if "out_of_bounds_reads" not in {f.name for f in
                                         dataclasses.fields(shared_memory_class)}:
            raise AttributeError("SharedMemory has no out_of_bounds_reads")
        if "out_of_bounds_reads" in vars(shared_memory_class):
            raise AttributeError("SharedMemory.out_of_bounds_reads is already replaced")
    except (JaxInternalsChanged, AttributeError, TypeError):
        yield False
        return

    def asked(self: Any) -> Any:
        own = self.__dict__.get("out_of_bounds_reads", "raise")
        access = _READING.access
        if access is None:  # not a read of a TPU kernel's (the GPU interpreter's, say)
            return own
        if own == "raise" and chip_halts(*access["read"]):
            return own
        access["poisoned"] = True
        return "uninitialized"

    def set_own(self: Any, value: Any) -> None:
        self.__dict__["out_of_bounds_reads"] = value

    def as_the_chip(reader: Any) -> Any:
        def get(token: Any, device_id: Any, local_core_id: Any, memory_space: Any,
                buffer_id: Any, transforms: Any, *args: Any, **kwargs: Any) -> Any:
            space = space_names.get(int(memory_space), "")
            if kwargs.get("input_name") is not None:
                kind, destination = "block", "vmem"
            elif kwargs.get("src_device_id") is not None:  # a DMA's read of its source
                kind, destination = "dma", _READING.dma_destination or ""
            elif kwargs.get("source_info") is not None:
                kind, destination = "load", ""
            else:  # the interpreter's own copy of an output: in bounds by construction
                return reader(token, device_id, local_core_id, memory_space, buffer_id,
                              transforms, *args, **kwargs)
            access = {"read": (kind, space, destination), "poisoned": False}
            outer, _READING.access = _READING.access, access
            try:
                result = reader(token, device_id, local_core_id, memory_space, buffer_id,
                                transforms, *args, **kwargs)
            finally:
                _READING.access = outer
            if access["poisoned"]:
                _record(module, kind, space, device_id, local_core_id, buffer_id, transforms,
                        kwargs.get("source_info"))
            return result

        return get

    def execute_read(self: Any) -> Any:
        outer = _READING.dma_destination
        _READING.dma_destination = space_names.get(int(self.dst_memory_space), "")
        try:
            return original_execute_read(self)
        finally:
            _READING.dma_destination = outer

    def named(swapper: Any) -> Any:
        @functools.wraps(swapper)  # the interpreter's module: its callbacks get NumPy arrays
        def swap(token: Any, device_id: Any, local_core_id: Any, memory_space: Any,
                 buffer_id: Any, transforms: Any, val: Any, mask: Any, *args: Any,
                 **kwargs: Any) -> Any:
            try:
                return swapper(token, device_id, local_core_id, memory_space, buffer_id,
                               transforms, val, mask, *args, **kwargs)
            except AssertionError:
                # JAX's swap asserts that an unmasked store is whole in bounds: a store
                # partly past its buffer is the kernel's, and named as a whole one is.
                space = space_names.get(int(memory_space), "")
                held = _buffer_shape(module, space, device_id, local_core_id, buffer_id,
                                     held=True)
                if held is None or not _past(transforms, held):
                    raise
                shape = _buffer_shape(module, space, device_id, local_core_id, buffer_id)
                raise ValueError(
                    f"Out-of-bounds swap of ({int(device_id)} {int(local_core_id)} {space} "
                    f"{int(buffer_id)}): swapping {index_text(transforms)} but buffer has "
                    f"shape {shape} .") from None

        return swap

    get = functools.wraps(original)(as_the_chip(original))
    # The interpreter's DMAs call get.__wrapped__ (its reader without the error handler).
    get.__wrapped__ = as_the_chip(raw)  # type: ignore[attr-defined]
    swap = module.fail_on_exception(named(original_swap.__wrapped__))
    shared_memory_class.out_of_bounds_reads = property(asked, set_own)
    try:
        with (attributes_replaced(module, {"get": get, "swap": swap}),
              attributes_replaced(dma_class, {"execute_read": execute_read})):
            yield True
    finally:
        del shared_memory_class.out_of_bounds_reads


def _record(module: Any, kind: str, space: str, device_id: Any, local_core_id: Any,
            buffer_id: Any, transforms: Any, source_info: Any) -> None:
    """Record a poisoned read for every recorder; what cannot be read of it is left out."""
    if not _UNCHECKED_READS.listening():
        return
    running = tpu_interpreter.running_interpreted_kernels()
    where = _where(source_info)
    kernel = running[0] if len(running) == 1 else (where.rpartition("(")[2].rstrip(")")
                                                    or "a kernel")
    _UNCHECKED_READS.add(UncheckedRead(
        kernel, "DMA" if kind == "dma" else kind, space.upper(), index_text(transforms),
        _buffer_shape(module, space, device_id, local_core_id, buffer_id), where))


def index_text(transforms: Any) -> str:
    """``[16]``, ``[24:32, 0:128]``: the read's range as the interpreter computed it."""
    try:
        rnge = private_attribute(_UTILS).to_range(jax.tree.map(int, transforms))
    except Exception:  # noqa: BLE001  # a note's detail: left out when it cannot be read
        return "an index"

    def one(index: Any) -> str:
        if isinstance(index, slice):
            return f"{index.start}:{index.stop}"
        return str(index)

    return "[" + ", ".join(one(index) for index in rnge) + "]"


def _buffer_shape(module: Any, space: str, device_id: Any, local_core_id: Any,
                  buffer_id: Any, *, held: bool = False) -> tuple[int, ...] | None:
    """The buffer's shape (``held``: as the interpreter holds it, tile-padded where it pads),
    or None."""
    try:
        core = module._local_core_id_or_zero_if_hbm(int(local_core_id), space)
        buffer = module._get_shared_memory().mem[(space, int(buffer_id), int(device_id), core)]
        return tuple(int(d) for d in (buffer.shape if held else buffer.logical_shape))
    except Exception:  # noqa: BLE001  # a detail: left out when it cannot be read
        return None


def _past(transforms: Any, shape: tuple[int, ...]) -> bool:
    """Whether the range ``transforms`` select leaves ``shape``."""
    try:
        utils = private_attribute(_UTILS)
        rnge = utils.to_range(jax.tree.map(int, transforms))
        rnge = rnge + tuple(slice(0, d) for d in shape[len(rnge):])
        return bool(utils.is_range_out_of_bounds_for_shape(rnge, shape))
    except Exception:  # noqa: BLE001  # unknown: the interpreter's own error stands
        return False


def _where(source_info: Any) -> str:
    """The read's line in the kernel's source, ``kernels.py:14 (gather)``."""
    if source_info is None:
        return ""
    try:
        frame = private_attribute(_SOURCE_INFO).user_frame(source_info.traceback)
        path = os.path.relpath(frame.file_name)
        path = frame.file_name if path.startswith("..") else path
        return f"{path}:{frame.start_line} ({frame.function_name})"
    except Exception:  # noqa: BLE001  # a note's detail: left out when it cannot be read
        return ""
