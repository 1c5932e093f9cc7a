"""Who waits at the TPU interpreter's start barrier: a kernel that only some devices of a
``shard_map`` run.

JAX's TPU interpreter (jax 0.10.2 and 0.12.0.1) makes every device of the mesh wait at a
``threading.Barrier`` before it runs a kernel without a ``collective_id`` (``_barrier``), sized
by the mesh's device count. A kernel that only some devices run (inside a ``lax.cond`` on
``lax.axis_index``, or a loop whose trip count differs by device) waits there for devices that
never come: the test hangs, in JAX without the plugin too. On the chip, a kernel that does not
talk to other devices runs on any of them alone. ``--pallas-timeout`` breaks the wait;
:func:`kernels_stopped_short` then says which kernel was waiting for devices and whether it
talks to other devices (then a device that skips it would hang the chip too).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any

from .interpreter_processes import remote_device_operations
from .jax_internals import INTERPRETER_MODULE, private_attribute


@dataclasses.dataclass(frozen=True)
class StoppedShort:
    """A kernel whose start barrier was broken while devices waited there for the rest."""

    kernel: str
    arrived: int  # devices that had reached the barrier
    devices: int  # the devices of the mesh it waits for
    talks_to_other_devices: bool  # a remote DMA or semaphore signal in its body


_lock = threading.Lock()
_waiting: dict[str, int] = {}
_stopped: list[StoppedShort] = []


def start_barrier_for(original: Any, kernel: str, jaxpr: Any) -> Any:
    """The interpreter's ``_barrier`` callback for ``kernel`` (body ``jaxpr``), recording the
    devices that wait at it and what broke it."""
    talks = bool(remote_device_operations(jaxpr)) if jaxpr is not None else True
    return functools.wraps(original)(functools.partial(_wait, original, kernel, talks))


def _wait(original: Any, kernel: str, talks: bool, token: Any, device_id: Any) -> Any:
    shared = private_attribute(INTERPRETER_MODULE, "_get_shared_memory")()
    barrier = getattr(shared, "barrier", None)
    with _lock:
        _waiting[kernel] = _waiting.get(kernel, 0) + 1
        arrived = _waiting[kernel]
    try:
        return original(token, device_id)
    except threading.BrokenBarrierError:
        parties = getattr(barrier, "parties", 0)
        with _lock:
            arrived = max(arrived, _waiting.get(kernel, 0))
            if arrived < parties and not any(s.kernel == kernel for s in _stopped):
                _stopped.append(StoppedShort(kernel, arrived, parties, talks))
        raise
    finally:
        with _lock:
            _waiting[kernel] -= 1


def kernels_stopped_short() -> list[StoppedShort]:
    """The kernels whose start barrier was broken before all the mesh's devices reached it."""
    with _lock:
        return list(_stopped)


def forget() -> None:
    """Between tests."""
    with _lock:
        _waiting.clear()
        _stopped.clear()
