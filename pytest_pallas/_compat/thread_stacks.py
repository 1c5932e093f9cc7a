"""A test's thread, seen and stopped from another thread (``--pallas-timeout``'s watchdog).

Three internals, each guarded and checked by ``tests/test_thread_stacks.py``:

* CPython's ``sys._current_frames()``: the stack of every thread, read without stopping it.
* CPython's ``PyThreadState_SetAsyncExc`` (through ``ctypes``): an exception raised in a
  thread when it next runs Python code. A thread blocked in C (an XLA computation, a
  compile, ``time.sleep``) does not run Python code until that call returns.
* JAX's private modules on that stack: a frame of ``jax/_src/compiler.py`` is XLA's compile
  (``compile_or_get_cached``, ``backend_compile_and_load``); a thread whose innermost frames
  are JAX's and do not move is waiting for an XLA computation.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import time
import traceback
from types import FrameType

# Where JAX compiles (a frame of this file on the stack means a compile is under way).
JAX_COMPILER_SOURCE = os.path.join("jax", "_src", "compiler.py")
# Frames of these packages are JAX's, not the test's.
_JAX_PACKAGES = (os.sep + "jax" + os.sep, os.sep + "jaxlib" + os.sep)

COMPILE = "compile"  # inside XLA's compile
XLA = "xla"  # inside JAX, not moving: running or waiting for an XLA computation
JAX = "jax"  # inside JAX's own Python code (tracing, lowering), moving
PYTHON = "python"  # in the test's own code (or a library's), outside JAX


@dataclasses.dataclass(frozen=True)
class ThreadPlace:
    """Where a thread is: ``kind`` (one of the constants above), ``line`` (``file:line`` of
    its innermost frame in the test's own file, else its innermost frame outside JAX),
    ``moving`` (whether its innermost frame or instruction changed while it was watched: it
    runs Python code; a one-instruction loop looks still) and ``stack`` (its frames from
    the test's function inward, formatted)."""

    kind: str
    line: str
    moving: bool
    stack: str


def _frames(thread_id: int) -> list[FrameType]:
    """The thread's frames, outermost first; empty when it has ended."""
    frame = sys._current_frames().get(thread_id)
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def _is_jax(filename: str) -> bool:
    return any(package in filename for package in _JAX_PACKAGES)


def _where(frame: FrameType) -> str:
    """``file:line``, the file relative to the current directory when it is under it."""
    path = frame.f_code.co_filename
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    return f"{path if relative.startswith('..') else relative}:{frame.f_lineno}"


def place_of_thread(thread_id: int, test_file: str, *, watch_seconds: float = 0.2,
                    ) -> ThreadPlace | None:
    """Where ``thread_id`` is, watched for ``watch_seconds``; None if it has ended.

    ``test_file``: the test's own file, whose innermost frame names the line."""
    first = _frames(thread_id)
    if not first:
        return None
    innermost = (first[-1], first[-1].f_lasti)
    moving = False
    deadline = time.monotonic() + watch_seconds
    while not moving and time.monotonic() < deadline:
        time.sleep(0.02)
        frames = _frames(thread_id)
        if not frames:
            return None
        moving = (frames[-1], frames[-1].f_lasti) != innermost
    frames = _frames(thread_id) or first
    test_file = os.path.abspath(test_file)
    in_test = [index for index, frame in enumerate(frames)
               if os.path.abspath(frame.f_code.co_filename) == test_file]
    own = [index for index, frame in enumerate(frames) if not _is_jax(frame.f_code.co_filename)]
    line_index = (in_test or own or [len(frames) - 1])[-1]
    if any(frame.f_code.co_filename.endswith(JAX_COMPILER_SOURCE) for frame in frames):
        kind = COMPILE
    elif _is_jax(frames[-1].f_code.co_filename):
        kind = JAX if moving else XLA
    else:
        kind = PYTHON
    start = in_test[0] if in_test else max(0, len(frames) - 12)
    stack = "".join(traceback.format_list(
        traceback.StackSummary.extract((frame, frame.f_lineno) for frame in frames[start:])))
    return ThreadPlace(kind, _where(frames[line_index]), moving, stack.rstrip())


def raise_in_thread(thread_id: int, exception_type: type[BaseException]) -> bool:
    """Raise ``exception_type`` in ``thread_id`` when it next runs Python code; whether the
    thread was found. A thread blocked in C raises it only once that call returns."""
    found = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                       ctypes.py_object(exception_type))
    return found == 1


def cancel_raise_in_thread(thread_id: int) -> None:
    """Take back an exception :func:`raise_in_thread` asked for and the thread has not raised."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
