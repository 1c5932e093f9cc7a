"""``--pallas-timeout``: a kernel that hangs fails its test, and the run goes on.

A hung Pallas kernel on the CPU is almost always a TPU-interpreted wait
that nothing will satisfy: a DMA semaphore never signalled, a remote copy
to a device that never receives, a barrier some device never reaches. A
watchdog thread, once the test has run for longer than the timeout, fills
the interpreter's failure slot (see ``_jax_compat.abort_interpreted_kernels``)
so that the waiting kernel raises, and the test fails with a message that
names it. Work that is not a TPU-interpreter wait (a Python loop, a plain
interpreter ``while_loop``) cannot be interrupted this way; the message
printed at the deadline says so.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from . import _jax_compat


class KernelTimeout(RuntimeError):
    """A kernel ran past ``--pallas-timeout``."""


class Watchdog:
    """Aborts TPU-interpreted waits once ``seconds`` have passed; a context manager."""

    def __init__(self, seconds: float, describe: Callable[[], str]) -> None:
        """``describe()`` names what hung; asked when the timeout fires, not before."""
        self.seconds = seconds
        self._describe = describe
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

    def _watch(self) -> None:
        if self._stop.wait(self.seconds):
            return
        self.what = self._describe()
        self.fired = True
        error = KernelTimeout(self.message)
        aborted = False
        # Keep aborting until the test returns: a test may start another kernel.
        while not self._stop.is_set():
            aborted = _jax_compat.abort_interpreted_kernels(error) or aborted
            if not aborted:
                sys.stderr.write(
                    f"\n{self.message}\n(pallas: no TPU-interpreted kernel is waiting, so it "
                    "cannot be interrupted; the test will run to its end.)\n"
                )
                aborted = True  # say it once
            self._stop.wait(0.5)
