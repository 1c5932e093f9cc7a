"""Output blocks the grid visits again after leaving them, run as the chip runs them.

On the chip, Pallas TPU writes an output block back to HBM each time the grid leaves it and
never reads it back: a block visited again starts from whatever its VMEM buffer holds (JAX's
``pl.RevisitMode``: "the buffer state should be considered undefined"), and the block's last
write-back is its value. JAX's TPU interpreter stops at every such revisit ("Revisited block
... of output i"), which fails kernels the chip runs right: one whose padding iterations map
to block 0 and write nothing there, say, and write that block whole on its real visit.

Within :func:`revisits_run_as_on_the_chip`, each write-back leaves the kernel's output buffer
holding poison (the interpreter's fill for fresh memory: NaN, the integer fill; zeros when the
interpreter fills zeros), and a revisit is recorded instead of stopped. A kernel that reads a
revisited block, or leaves part of it unwritten, then computes from poison and its test fails
on the values, and :func:`revisited_blocks_recorded` names the revisit for the failure's note.
A kernel with an output under ``pl.RevisitMode.ANY`` (whose revisits the chip reads back from
HBM, which the interpreter does not) keeps the interpreter's stop. Part of the compatibility
layer: the interpreter's functions are reached through ``jax_internals``, and the fix yields
False where they moved (JAX's behaviour then: every revisit stops).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from . import tpu_interpreter
from .jax_internals import INTERPRETER_MODULE, JaxInternalsChanged, private_attribute
from .out_of_bounds import index_text
from .recordings import Recordings

_UTILS = "jax._src.pallas.mosaic.interpret.utils"


@dataclasses.dataclass(frozen=True)
class RevisitedBlock:
    """An output block a kernel's grid came back to after leaving it."""

    kernel: str  # as the interpreter names it ("body at kernels.py:12")
    output: int  # the output's position among the kernel's outputs
    block: str  # the block's range in the output, "[0:8, 128:256]"
    iteration: tuple[int, ...]  # the grid iteration that came back
    earlier: tuple[tuple[int, ...], tuple[int, ...]]  # the first and last earlier visits

    def describe(self) -> str:
        """``kernel 'k' came back to output 0's block [0:8, 0:128] in grid iteration (1, 0)
        (visited in iterations (0, 0) through (0, 0))``."""
        first, last = self.earlier
        return (f"kernel {self.kernel!r} came back to output {self.output}'s block {self.block} "
                f"in grid iteration {self.iteration} (visited in iterations {first} through "
                f"{last})")


_REVISITS: Recordings[RevisitedBlock] = Recordings()


def revisited_blocks_recorded() -> contextlib.AbstractContextManager[list[RevisitedBlock]]:
    """Collect a :class:`RevisitedBlock` for each output a kernel revisits (its first revisit)
    while the block runs, under :func:`revisits_run_as_on_the_chip`."""
    return _REVISITS.recorded()


class _Visits:
    """One core's visits to the output blocks of the kernel it runs: kept in the slot JAX's own
    check keeps its history in (the interpreter's shared memory, one per kernel run)."""

    def __init__(self) -> None:
        self.current: dict[int, Any] = {}  # output -> the block it is on
        self.first: dict[Any, tuple[int, ...]] = {}  # (output, block) -> first visit
        self.last: dict[Any, tuple[int, ...]] = {}  # (output, block) -> latest visit
        self.reported: set[int] = set()  # outputs whose revisit was recorded


# How many revisits_run_as_on_the_chip blocks are open: a kernel lowered inside one and
# cached by jit behaves as JAX's when it runs outside every one.
_open = 0
_open_lock = threading.Lock()


def _running_as_on_the_chip() -> bool:
    with _open_lock:
        return _open > 0


@contextlib.contextmanager
def revisits_run_as_on_the_chip() -> Iterator[bool]:
    """Output write-backs leave poison in the kernel's buffer, and revisits are recorded, not
    stopped, for kernels lowered in the block; see the module's docstring. Yields False where
    the interpreter moved."""
    global _open
    try:
        module = private_attribute(INTERPRETER_MODULE)
        original_check = module._check_for_revisiting.__wrapped__
        module.fail_on_exception  # noqa: B018
        module._get_shared_memory  # noqa: B018
        module._local_core_id_or_zero_if_hbm  # noqa: B018
        space_names = module.TPU_MEMORY_SPACE_NAMES
        fill_value = private_attribute(_UTILS).get_uninitialized_value
        to_range = private_attribute(_UTILS).to_range
        revisit_any = private_attribute("jax._src.pallas.core", "RevisitMode").ANY
        tpu_interpreter.install_kernel_exit_hook()  # what asks for the replacements
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    def check(kernel: str) -> Any:
        def check_for_revisiting(token: Any, device_id: Any, local_core_id: Any,
                                 loop_idx: Any, output_blocks: Any) -> Any:
            if not _running_as_on_the_chip():
                return original_check(token, device_id, local_core_id, loop_idx, output_blocks)
            device, core = int(device_id), int(local_core_id)
            history = module._get_shared_memory().output_ranges[(device, core)]
            if not history:
                history.append(_Visits())
            visits = history[0]
            if not isinstance(visits, _Visits):  # JAX's own check began this kernel's history
                return original_check(token, device_id, local_core_id, loop_idx, output_blocks)
            iteration = tuple(int(i) for i in loop_idx)
            for output, block in enumerate(output_blocks):
                if block is None:  # an output aliased to an input, or left in HBM
                    continue
                key = (output, _hashable(to_range(jax.tree.map(int, block))))
                if visits.current.get(output) != key:
                    if key in visits.last and output not in visits.reported:
                        visits.reported.add(output)
                        _REVISITS.add(RevisitedBlock(
                            kernel, output, index_text(block), iteration,
                            (visits.first[key], visits.last[key])))
                    visits.first.setdefault(key, iteration)
                    visits.current[output] = key
                visits.last[key] = iteration
            return token

        return module.fail_on_exception(check_for_revisiting)

    def poisoning(reader: Any) -> Any:
        @functools.wraps(reader)  # the interpreter's module: its callbacks get NumPy arrays
        def get(token: Any, device_id: Any, local_core_id: Any, memory_space: Any,
                buffer_id: Any, transforms: Any, *args: Any, **kwargs: Any) -> Any:
            result = reader(token, device_id, local_core_id, memory_space, buffer_id,
                            transforms, *args, **kwargs)
            space = space_names.get(int(memory_space), "hbm")
            # A read with no keyword and outside HBM is the interpreter copying a kernel's
            # output block out for its write-back (JAX 0.10 to 0.12): the block has left.
            if not args and not kwargs and space != "hbm" and _running_as_on_the_chip():
                _poison(module, fill_value, space, device_id, local_core_id, buffer_id)
            return result

        # The interpreter's DMAs call get.__wrapped__ (its reader without the error handler).
        get.__wrapped__ = getattr(reader, "__wrapped__", reader)  # type: ignore[attr-defined]
        return get

    def lowering(kernel: str, params: dict[str, Any]) -> dict[str, Any]:
        mapping = params.get("grid_mapping")
        outputs = _output_block_mappings(mapping)
        if outputs is None or any(
                getattr(getattr(each, "pipeline_mode", None), "revisit", None) == revisit_any
                for each in outputs):
            return {}  # the chip reads these revisits back: the interpreter's stop stays
        return {"_check_for_revisiting": check(kernel), "get": poisoning(module.get)}

    with _open_lock:
        _open += 1
    try:
        with tpu_interpreter.replaced_while_kernels_lower(lowering):
            yield True
    finally:
        with _open_lock:
            _open -= 1


def _output_block_mappings(mapping: Any) -> tuple[Any, ...] | None:
    """The block mappings of a grid mapping's outputs, or None where it has no such fields."""
    try:
        return tuple(mapping.block_mappings[mapping.num_inputs:])
    except (AttributeError, TypeError):
        return None


def _hashable(rnge: Any) -> tuple[Any, ...]:
    # Slices are not hashable before Python 3.12.
    return tuple((r.start, r.stop, r.step) if isinstance(r, slice) else r for r in rnge)


def _poison(module: Any, fill_value: Any, space: str, device_id: Any, local_core_id: Any,
            buffer_id: Any) -> None:
    """Fill one kernel buffer with the interpreter's fill for fresh memory."""
    shared = module._get_shared_memory()
    core = module._local_core_id_or_zero_if_hbm(int(local_core_id), space)
    with shared.lock:
        buffer = shared.mem.get((space, int(buffer_id), int(device_id), core))
        content = getattr(buffer, "content", None)
        if isinstance(content, np.ndarray):
            content[...] = fill_value(content.dtype, shared.uninitialized_memory)
