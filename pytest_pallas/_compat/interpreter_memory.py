"""How much host memory JAX's interpreters take for a kernel, and kernels weighed against
the host's before they run.

An interpreted kernel's operands and results are copied several times into the interpreter's
simulated memory; a kernel written for a chip's 16 GiB or more of HBM can outgrow a small
host, whose out-of-memory killer then ends the test process mid-run (pytest-xdist: "worker
crashed"). Weighed at its trace, such a kernel raises :class:`HostMemoryShortage` instead.
Part of the compatibility layer: the copies counted are those of JAX's TPU interpreter (the
plain interpreter's and the GPU interpreter's are not measured; the same weight is used).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import pallas_call_hooks
from .jax_internals import JaxInternalsChanged

# How many times over an interpreted kernel's operands and results are held in host memory
# beyond the test's own arrays, at the run's peak: the interpreter's program copies them once
# before its first callback, then the callback's copy, the buffer's (``np.array``) and the
# tile-padded one (jax 0.10.2, TPU interpreter: a 6 GiB operand and 1 GiB result of JAX's
# test_large_array_indexing reached 13.4 GiB before the first callback; 1 and 2 GiB versions
# peaked 3 times their operands and results above the test's own array).
COPIES_OF_A_KERNELS_ARRAYS = 3
# Kernels with less than this are not weighed against the host's memory.
_WEIGHED_FROM_BYTES = 64 * 2**20


class HostMemoryShortage(MemoryError):
    """An interpreted kernel's copies would not fit in the host's available memory."""

    def __init__(self, needed: int, available: int) -> None:
        self.needed, self.available = needed, available
        super().__init__(f"interpreting this kernel needs about {needed / 2**30:.1f} GiB of "
                         f"host memory, {available / 2**30:.1f} GiB is available")


def _nbytes(aval: Any) -> int:
    try:
        return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize
    except (AttributeError, TypeError):  # a semaphore, a token
        return 0


@contextlib.contextmanager
def kernels_weighed_against_host_memory(
        memory_available: Callable[[], int | None],
        on_shortage: Callable[[HostMemoryShortage], None] | None = None) -> Iterator[bool]:
    """Each kernel traced in the block whose copies in an interpreter
    (:data:`COPIES_OF_A_KERNELS_ARRAYS` times its operands and results) would not fit in
    ``memory_available()`` bytes raises a :class:`HostMemoryShortage` at its trace, heard
    first by ``on_shortage``: the host's out-of-memory killer would otherwise end the process
    mid-run (JAX's ``test_large_array_indexing``, a 6 GiB array, on a 24 GiB host)."""
    def weigh(params: dict[str, Any], avals: tuple[Any, ...]) -> None:
        size = sum(map(_nbytes, (*avals, *(params.get("out_avals") or ()))))
        if size < _WEIGHED_FROM_BYTES:
            return
        available = memory_available()
        needed = size * COPIES_OF_A_KERNELS_ARRAYS
        if available is not None and needed > available:
            shortage = HostMemoryShortage(needed, available)
            if on_shortage is not None:
                on_shortage(shortage)
            raise shortage

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(pallas_call_hooks.observe_pallas_calls(weigh, with_avals=True))
        except (JaxInternalsChanged, AttributeError):
            yield False
            return
        yield True
