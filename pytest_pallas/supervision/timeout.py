"""``--pallas-timeout``: a test that runs past it fails, naming where it was, and the run goes on.

The watchdog, a thread beside the test's call, keeps two clocks. Each TPU-interpreted
kernel is timed from its start; the test's work outside its kernels (its reference
computation, a compile, its own Python code) from the test's start or its last kernel's
start or end, whichever came last. So a property that runs many quick kernels may take
longer than the timeout, and a reference computation that never returns may not. (A Mosaic
GPU kernel's interpreter does not say when a kernel starts: with one, the whole test is
timed.)

When one clock passes the timeout, the watchdog stops the test in its process if it can:

1. it fills the TPU interpreter's failure slot (``_compat.tpu_interpreter``), so a kernel
   waiting for a DMA or a semaphore nobody signals raises (JAX's GPU interpreter's waits
   likewise);
2. it raises ``TimeoutInterrupt`` in the test's thread (``_compat.thread_stacks``), which
   stops a Python loop at its next instruction.

The test then fails with ``KernelTimeout`` or ``PallasTimeout``, naming where it was. A
thread inside XLA (a computation that does not return, a compile) runs no Python code, so
neither reaches it, nor does SIGINT. If the test is still running a grace period later,
the watchdog hands it to ``on_stuck``: the plugin records its failure and ends the
process, and the run goes on in another (``plugin.stuck_tests``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from .._compat import gpu_interpreter, interpreter_threads, thread_stacks, tpu_interpreter
from .._compat.thread_stacks import cancel_raise_in_thread, raise_in_thread


class PallasTimeout(RuntimeError):
    """A test ran past ``--pallas-timeout`` outside its kernels."""


class KernelTimeout(PallasTimeout):
    """A kernel ran past ``--pallas-timeout``."""


class TimeoutInterrupt(BaseException):
    """Raised in a test's thread at the timeout. A BaseException, so that neither the test's
    ``except Exception`` nor Hypothesis (which re-runs a failing example while it shrinks)
    takes it; the plugin turns it into the test's ``PallasTimeout``."""

    raised = 0  # how many were raised (made when a thread raises one), for the watchdog

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        TimeoutInterrupt.raised += 1

    def __str__(self) -> str:
        return "the test was here when --pallas-timeout stopped it"


# The plugin's own checks of a kernel at its trace are not the test's work: the timeout's
# clocks stop while they run (the TPU compiler's verdict takes seconds, for each chip), and
# they are stopped only past the timeout and this long.
PLUGIN_CHECKS_SECONDS = 120.0


def grace_seconds(timeout: float) -> float:
    """How long a test may take to stop in its process after the timeout: a wait aborted or
    an exception raised in Python code ends it at once; 2 to 30 s covers its unwinding."""
    return min(30.0, max(2.0, timeout / 10))


class Watchdog:
    """``--pallas-timeout`` around a test's call; a context manager entered in its thread."""

    def __init__(self, seconds: float, describe: Callable[[], str],
                 kernel_ages: Callable[[], dict[str, float] | None] = (
                     tpu_interpreter.running_interpreted_kernel_ages),
                 last_kernel_event: Callable[[], float | None] = (
                     tpu_interpreter.last_interpreted_kernel_event), *,
                 checks_age: Callable[[], float | None] = lambda: None,
                 test_name: str = "this test", test_file: str = "",
                 on_stuck: Callable[[str, float], None] | None = None) -> None:
        """``describe()`` names the kernel that hung; asked when the timeout fires.

        ``kernel_ages()`` gives the seconds each running kernel has run, or None when
        kernels cannot be seen: then the whole test is timed instead. ``last_kernel_event()``
        is when (``time.monotonic()``) a kernel, or the plugin's checks of one, last started
        or ended, None if never. ``checks_age()``: how long the plugin's checks of the kernel
        being traced (the TPU compiler's verdict) have run, None when none run: the clocks
        stop meanwhile, and the checks have ``PLUGIN_CHECKS_SECONDS`` at least.
        ``test_file``: the test's file, whose line the failure names. ``on_stuck(text,
        seconds)``: called with the failure's text and the seconds the test has run, when
        it is still running a grace period after the timeout (it ends the process); without
        it the test runs to its end.
        """
        self.seconds = seconds
        self._describe = describe
        self._kernel_ages = kernel_ages
        self._last_kernel_event = last_kernel_event
        self._checks_age = checks_age
        self._test_name = test_name
        self._test_file = test_file
        self._on_stuck = on_stuck
        self.what = ""  # what ran past the timeout, in words
        self.in_kernel = False  # whether it was a kernel (or the plugin's checks of one)
        self._in_checks = False  # whether it was the plugin's checks of a kernel
        self.fired = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # no exception is raised in the test once stopped
        self._interrupted = False  # TimeoutInterrupt was raised in the test's thread
        self._thread: threading.Thread | None = None
        self._test_thread = 0
        self._started = 0.0
        self._raised_before = 0
        self._error: PallasTimeout | None = None  # what the aborted kernels raise

    @property
    def message(self) -> str:
        if self._in_checks:
            return (f"pallas: {self.what} ran longer than --pallas-timeout={self.seconds:g}s "
                    f"and {PLUGIN_CHECKS_SECONDS:g}s and were stopped. This is pytest-pallas's "
                    "own work, not the test's: please report it (--pallas-compile=none skips "
                    "the TPU compiler's verdict).")
        if self.in_kernel:
            return (
                f"pallas: {self.what} ran longer than --pallas-timeout={self.seconds:g}s and "
                "was stopped. The usual cause is a wait that is never satisfied: a DMA or "
                "semaphore wait without a matching start/signal, a remote copy whose receiver "
                "never waits, or a barrier some device does not reach. Raise --pallas-timeout "
                "if the kernel is only slow."
            )
        return (f"pallas: {self._test_name} ran longer than --pallas-timeout={self.seconds:g}s "
                f"outside its kernels, {self.what}, and was stopped. Raise --pallas-timeout if "
                "the test is only slow (0 disables it).")

    def failure(self) -> PallasTimeout:
        """The test's failure, once the watchdog fired."""
        return (KernelTimeout if self.in_kernel else PallasTimeout)(self.message)

    def __enter__(self) -> Watchdog:
        if self.seconds > 0:
            self._test_thread = threading.get_ident()
            self._thread = threading.Thread(target=self._watch, name="pallas-timeout",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, error, traceback) -> None:
        # TimeoutInterrupt is raised at most once, anywhere in the test's thread until the
        # watchdog stops (here too): wherever it is met, it becomes the test's failure.
        interrupt = error if isinstance(error, TimeoutInterrupt) else None
        for _ in range(2):
            try:
                self._close()
                break
            except TimeoutInterrupt as raised:
                interrupt = raised
        if self.fired:
            self._wait_for_stopped_kernels()
        if interrupt is not None:
            raise self.failure() from interrupt

    def _wait_for_stopped_kernels(self) -> None:
        """The test returned after the watchdog fired; its kernels' per-core programs may run
        on, on the interpreter's threads, and would meet the next test's kernels in the
        interpreter's state, failing them with this test's error.
        Wait for them, aborting, at most the grace period; past it the process is ended."""
        def abort() -> None:
            if self._error is not None:
                tpu_interpreter.abort_interpreted_kernels(self._error)

        grace = grace_seconds(self.seconds)
        if interpreter_threads.wait_for_core_programs(grace, abort):
            return
        head = (f"pallas: {self.what or self._test_name} ran longer than --pallas-timeout="
                f"{self.seconds:g}s and was stopped, but its kernels' computations still ran "
                f"{grace:g}s later, inside XLA")
        if self._on_stuck is None:
            sys.stderr.write(f"\n{head}; the next test may meet them.\n")
            return
        self._on_stuck(f"{head}: the process was ended, so that the next test starts without "
                       "them, and the run went on. Raise --pallas-timeout if the test is only "
                       "slow (0 disables it).", time.monotonic() - self._started)

    def _close(self) -> None:
        with self._lock:
            self._stop.set()
            if self._interrupted:
                cancel_raise_in_thread(self._test_thread)  # not raised yet: never
        if self._thread is not None:
            self._thread.join()

    def _overdue(self, started: float) -> str | None:
        """Which clock passed the timeout: "kernel", "checks" (the plugin's), "outside" (the
        test's work outside its kernels) or "test" (kernels cannot be seen: the whole test);
        None if none has."""
        now = time.monotonic()
        checking = self._checks_age()
        if checking is not None:
            return "checks" if checking >= max(self.seconds, PLUGIN_CHECKS_SECONDS) else None
        ages = self._kernel_ages()
        if ages is None:
            return "test" if now - started >= self.seconds else None
        if any(age >= self.seconds for age in ages.values()):
            return "kernel"
        quiet_since = max(started, self._last_kernel_event() or started)
        return "outside" if not ages and now - quiet_since >= self.seconds else None

    def _watch(self) -> None:
        self._started = started = time.monotonic()
        # Polled: a kernel may start at any moment of the test. A dict read per poll.
        poll = min(0.25, self.seconds / 4)
        clock = self._overdue(started)
        while clock is None:
            if self._stop.wait(poll):
                return
            clock = self._overdue(started)
        self.in_kernel = clock != "outside"
        self._in_checks = clock == "checks"
        self.what = self._describe() if self.in_kernel else self._place_text()
        self.fired = True
        error = self._error = self.failure()
        fired_at = time.monotonic()
        grace = grace_seconds(self.seconds)
        aborted = stuck = False
        # Keep aborting until the test returns: a test may start another kernel.
        while not self._stop.is_set():
            aborted = (tpu_interpreter.abort_interpreted_kernels(error)
                       | gpu_interpreter.abort_gpu_waits())
            waited = time.monotonic() - fired_at
            if not self.in_kernel or not aborted or waited >= grace / 2:
                self._interrupt()
            if waited >= grace and not stuck:
                stuck = True
                self._stuck()
            self._stop.wait(0.5 if self.in_kernel else 0.1)

    def _place_text(self, place=None) -> str:
        """Where the test's thread is, in words: "in its own code at test_x.py:12", ..."""
        if place is None:
            place = thread_stacks.place_of_thread(self._test_thread, self._test_file)
        if place is None:
            return "in its own code"
        return {
            thread_stacks.COMPILE: f"in XLA's compile (called at {place.line})",
            thread_stacks.XLA: (f"in XLA, running a computation of its own called at "
                                f"{place.line} (no TPU-interpreted kernel was running: jnp "
                                "code, or a kernel in the plain interpreter)"),
            thread_stacks.JAX: f"in JAX's own code (tracing or lowering, called at {place.line})",
        }.get(place.kind, f"in its own code at {place.line}")

    def _interrupt(self) -> None:
        """Raise ``TimeoutInterrupt`` in the test's thread, once, unless it has returned."""
        with self._lock:
            if self._interrupted or self._stop.is_set():
                return

            self._raised_before = TimeoutInterrupt.raised
            self._interrupted = raise_in_thread(self._test_thread, TimeoutInterrupt)

    def _stuck(self) -> None:
        """The test did not stop in its process: hand it to ``on_stuck``, or say so."""
        place = thread_stacks.place_of_thread(self._test_thread, self._test_file)
        if place is None or self._stop.is_set():
            return  # it has just returned
        if place.kind in (thread_stacks.XLA, thread_stacks.COMPILE):
            blocked = "inside XLA, which does not return to Python"
        elif TimeoutInterrupt.raised > self._raised_before:
            blocked = "its code went on after the interrupt"
        else:
            blocked = "in a call that does not return to Python"
        if self.in_kernel:
            head = f"pallas: {self.what} ran longer than --pallas-timeout={self.seconds:g}s"
        else:
            head = (f"pallas: {self._test_name} ran longer than --pallas-timeout="
                    f"{self.seconds:g}s outside its kernels, {self._place_text(place)}")
        head += f". It could not be stopped in its process ({blocked})"
        if self._on_stuck is None:
            sys.stderr.write(f"\n{head}; it runs to its end.\n")
            return
        # Ends the process, unless this run has no way to go on in another (it says so).
        self._on_stuck(
            f"{head}: the process was ended and the run went on with the next test. "
            "Raise --pallas-timeout if the test is only slow (0 disables it).\n\n"
            f"where the test's thread was (innermost last):\n{place.stack}",
            time.monotonic() - self._started)
