"""``--pallas-timeout``: a kernel that hangs fails its test, and the run goes on.

A hung Pallas kernel on the CPU is almost always a TPU-interpreted wait
that nothing will satisfy: a DMA semaphore never signalled, a remote copy
to a device that never receives, a barrier some device never reaches. A
watchdog thread times each TPU-interpreted kernel from the moment it starts
(not the test: a property runs many kernels, each quick); once one has run
longer than the timeout, it fills the interpreter's failure slot (see
``_compat.tpu_interpreter.abort_interpreted_kernels``) so that the waiting kernel
raises, and the test fails with a message that names it. Work that is not
a TPU-interpreted kernel (a Python loop, a plain-interpreter
``while_loop``) is neither timed nor interrupted; a test still running
after the timeout gets a note on stderr that says so.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from .._compat import gpu_interpreter, tpu_interpreter


class KernelTimeout(RuntimeError):
    """A kernel ran past ``--pallas-timeout``."""


class Watchdog:
    """Aborts TPU-interpreted waits once a kernel has run ``seconds``; a context manager."""

    def __init__(self, seconds: float, describe: Callable[[], str],
                 kernel_ages: Callable[[], dict[str, float] | None] = (
                     tpu_interpreter.running_interpreted_kernel_ages)) -> None:
        """``describe()`` names what hung; asked when the timeout fires, not before.

        ``kernel_ages()`` gives the seconds each running kernel has run, or None
        when kernels cannot be seen: then the whole test is timed instead.
        """
        self.seconds = seconds
        self._describe = describe
        self._kernel_ages = kernel_ages
        self.what = ""
        self.fired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def message(self) -> str:
        return (
            f"pallas: {self.what} ran longer than --pallas-timeout={self.seconds:g}s and was "
            "stopped. The usual cause is a wait that is never satisfied: a DMA or semaphore "
            "wait without a matching start/signal, a remote copy whose receiver never waits, "
            "or a barrier some device does not reach. Raise --pallas-timeout if the kernel is "
            "only slow."
        )

    def __enter__(self) -> Watchdog:
        if self.seconds > 0:
            self._thread = threading.Thread(target=self._watch, name="pallas-timeout",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _overdue(self, started: float) -> bool:
        ages = self._kernel_ages()
        if ages is None:
            return time.monotonic() - started >= self.seconds
        return any(age >= self.seconds for age in ages.values())

    def _watch(self) -> None:
        started = time.monotonic()
        noted = False
        # Polled: a kernel may start at any moment of the test. A dict read per poll.
        poll = min(0.25, self.seconds / 4)
        while not self._overdue(started):
            if self._stop.wait(poll):
                return
            if not noted and time.monotonic() - started >= self.seconds:
                noted = True
                sys.stderr.write(
                    f"\npallas: this test is still running after --pallas-timeout="
                    f"{self.seconds:g}s, though no TPU-interpreted kernel has run that long; "
                    "work outside such kernels is not stopped.\n"
                )
        self.what = self._describe()
        self.fired = True
        error = KernelTimeout(self.message)
        aborted = False
        # Keep aborting until the test returns: a test may start another kernel.
        while not self._stop.is_set():
            aborted = (tpu_interpreter.abort_interpreted_kernels(error)
                       | gpu_interpreter.abort_gpu_waits()) or aborted
            if not aborted:
                sys.stderr.write(
                    f"\n{self.message}\n(pallas: no TPU-interpreted kernel is waiting, so it "
                    "cannot be interrupted; the test will run to its end.)\n"
                )
                aborted = True  # say it once
            self._stop.wait(0.5)
