"""--pallas-timeout's watchdog: it times each TPU-interpreted kernel, and the test's work
outside its kernels from the last kernel's start or end, not the whole test; it stops the
test in its thread, or hands it on when it cannot."""

import threading
import time

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import io_callback

from pytest_pallas._compat import interpreter_threads, jax_internals, tpu_interpreter
from pytest_pallas.supervision.timeout import (
    KernelTimeout,
    PallasTimeout,
    TimeoutInterrupt,
    Watchdog,
)


class FakeKernels:
    """Stands in for the interpreter's running kernels: ``ages`` is what it reports."""

    def __init__(self, ages):
        self.ages = ages
        self.asked = threading.Event()

    def __call__(self):
        self.asked.set()
        return self.ages


@pytest.fixture
def no_abort(monkeypatch):
    aborted = []
    monkeypatch.setattr(tpu_interpreter, "abort_interpreted_kernels",
                        lambda error: aborted.append(error) or True)
    return aborted


def test_a_long_test_of_quick_kernels_is_not_stopped(no_abort):
    kernels = FakeKernels({"quick": 0.01})
    with Watchdog(0.2, lambda: "kernel 'quick'", kernel_ages=kernels) as watchdog:
        time.sleep(2.0)  # the test outlives the timeout ten times over; no kernel does
    assert kernels.asked.is_set()
    assert not watchdog.fired and not no_abort


def test_the_work_between_quick_kernels_is_timed_from_the_last_one(no_abort):
    # No kernel runs at any poll, but one ended a moment ago each time: the test's own work
    # between kernels never runs as long as the timeout, though the test does ten times.
    with Watchdog(0.2, lambda: "x", kernel_ages=dict,
                  last_kernel_event=time.monotonic) as watchdog:
        time.sleep(2.0)
    assert not watchdog.fired and not no_abort


def test_the_plugins_checks_of_a_kernel_stop_the_clocks(no_abort):
    # The TPU compiler's verdict, say, taking longer than the timeout: not the test's work.
    with Watchdog(0.2, lambda: "x", kernel_ages=dict, last_kernel_event=time.monotonic,
                  checks_age=lambda: 1.0) as watchdog:
        time.sleep(1.0)
    assert not watchdog.fired


def test_a_python_loop_past_the_timeout_is_stopped_where_it_is(no_abort):
    started = time.monotonic()
    with pytest.raises(PallasTimeout) as raised:  # noqa: PT012 (the loop is what is stopped)
        with Watchdog(0.3, lambda: "x", kernel_ages=dict, last_kernel_event=lambda: None,
                      test_name="test_x.py::test_loop", test_file=__file__):
            while True:
                pass
    assert time.monotonic() - started < 5
    assert not isinstance(raised.value, KernelTimeout)
    assert isinstance(raised.value.__cause__, TimeoutInterrupt)
    assert str(raised.value).startswith(
        "pallas: test_x.py::test_loop ran longer than --pallas-timeout=0.3s outside its "
        "kernels, in its own code at tests/test_timeout.py:")


def test_a_test_caught_past_the_timeout_is_handed_on_with_where_it_was(no_abort):
    # A call that does not return to Python (time.sleep here; inside XLA in a real hang) is
    # not reached by the exception: a grace period later, on_stuck gets the failure's text.
    handed = []
    with pytest.raises(PallasTimeout):  # noqa: PT012
        with Watchdog(0.2, lambda: "x", kernel_ages=dict, last_kernel_event=lambda: None,
                      test_name="test_x.py::test_sleeps", test_file=__file__,
                      on_stuck=lambda text, seconds: handed.append((text, seconds))):
            time.sleep(4)  # the grace period is 2 s
    [(text, seconds)] = handed
    assert text.startswith("pallas: test_x.py::test_sleeps ran longer than "
                           "--pallas-timeout=0.2s outside its kernels, in its own code at "
                           "tests/test_timeout.py:")
    assert ("It could not be stopped in its process (in a call that does not return to "
            "Python): the process was ended" in text)
    assert "time.sleep(4)" in text  # the stack of the test's thread
    assert 2 <= seconds < 4


def test_a_kernel_past_the_timeout_is_stopped_and_named(no_abort):
    kernels = FakeKernels({"quick": 0.01, "hung": 5.0})
    with Watchdog(0.2, lambda: "kernel 'hung'", kernel_ages=kernels) as watchdog:
        for _ in range(200):
            if no_abort:
                break
            time.sleep(0.05)
    assert watchdog.fired
    assert str(no_abort[0]).startswith(
        "pallas: kernel 'hung' ran longer than --pallas-timeout=0.2s and was stopped.")


def test_without_a_view_of_the_kernels_the_whole_test_is_timed(no_abort):
    # A JAX whose interpreter hides kernel entries: the old clock, from the test's start.
    with Watchdog(0.2, lambda: "a kernel in test_x", kernel_ages=lambda: None) as watchdog:
        for _ in range(200):
            if no_abort:
                break
            time.sleep(0.05)
    assert watchdog.fired and no_abort


# What the per-core program below waits for: one pair of events per test, read when it runs
# (JAX may serve an earlier test's executable, and with it this callback).
_CORE_PROGRAM = {"running": threading.Event(), "release": threading.Event()}


def _core_program_waits(x):
    _CORE_PROGRAM["running"].set()
    _CORE_PROGRAM["release"].wait(30)
    return x


def _core_program(x):
    io_callback(_core_program_waits, jax.ShapeDtypeStruct((), jnp.int32), x)


@pytest.fixture
def core_program():
    """Starts a per-core program of the TPU interpreter on a thread of its own, as its thread
    map does, running until the event it returns is set."""
    running, release = threading.Event(), threading.Event()
    _CORE_PROGRAM.update(running=running, release=release)
    threads = []

    def start():
        jaxpr = jax.make_jaxpr(_core_program)(jnp.int32(0))
        # The thread map's runner as it is now (the block below replaced it), as the
        # interpreter calls it.
        thread_map = jax_internals.private_attribute("jax._src.pallas.mosaic.interpret.thread_map")
        thread = threading.Thread(target=thread_map._run_jaxpr,
                                  args=(jaxpr.jaxpr, jaxpr.consts, jnp.int32(0)))
        thread.start()
        threads.append(thread)
        assert running.wait(60), "the per-core program did not start"
        return release

    with interpreter_threads.per_core_programs_compiled_once():
        yield start
        release.set()
        for thread in threads:
            thread.join()


def test_a_stopped_test_ends_after_its_kernels_per_core_programs(monkeypatch, core_program):
    # A stopped test may return while its kernel's cores still run; the next test's kernels
    # would meet them. The test ends once they have, which the abort brings about.
    release = core_program()
    monkeypatch.setattr(tpu_interpreter, "abort_interpreted_kernels",
                        lambda error: release.set() or True)
    with Watchdog(0.2, lambda: "kernel 'hung'", kernel_ages=FakeKernels({"hung": 5.0}),
                  on_stuck=lambda text, seconds: pytest.fail(text)) as watchdog:
        while not release.is_set():
            time.sleep(0.05)
    assert watchdog.fired and interpreter_threads.wait_for_core_programs(0)


def test_per_core_programs_that_outlast_the_grace_period_end_the_process(no_abort,
                                                                         core_program):
    core_program()  # never released while the watchdog waits
    handed = []
    with Watchdog(0.2, lambda: "kernel 'hung'", kernel_ages=FakeKernels({"hung": 5.0}),
                  on_stuck=lambda text, seconds: handed.append(text)):
        while not no_abort:
            time.sleep(0.05)
    [text] = handed
    assert text.startswith("pallas: kernel 'hung' ran longer than --pallas-timeout=0.2s and was "
                           "stopped, but its kernels' computations still ran 2s later, inside "
                           "XLA: the process was ended")
    assert not interpreter_threads.wait_for_core_programs(0)


def test_zero_disables_the_watchdog(no_abort):
    with Watchdog(0, lambda: "x", kernel_ages=lambda: None) as watchdog:
        time.sleep(0.3)
    assert not watchdog.fired and not no_abort


def test_a_property_of_many_quick_kernels_outlasts_the_timeout_and_passes(pytester):
    # Each kernel takes well under a second; the test, with its pauses, takes longer than
    # --pallas-timeout=5. Timing the test instead of the kernel failed it.
    pytester.makepyfile(test_slow_property='''
import time
import jax, jax.numpy as jnp, pytest
from jax.experimental import pallas as pl

def double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

@pytest.mark.pallas
def test_many_kernels():
    x = jnp.ones((8, 128), jnp.float32)
    for _ in range(3):
        y = pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        assert float(y[0, 0]) == 2.0
        time.sleep(2.5)
''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--pallas-timeout=5",
                                "--pallas-interpret=tpu")
    result.assert_outcomes(passed=1)


class FakeSharedMemory:
    """The TPU interpreter's shared memory as the abort sees it: a lock, a failure slot
    and the two barriers its devices wait at."""

    def __init__(self, failure=None):
        self.lock = threading.Lock()
        self._failure = failure
        self.barrier = threading.Barrier(2)
        self.clean_up_barrier = threading.Barrier(2)


@pytest.mark.parametrize("failed_first", [None, RuntimeError("a device's own failure")],
                         ids=["no-failure-yet", "a-device-failed-first"])
def test_the_clean_up_barrier_breaks_on_the_second_abort(monkeypatch, failed_first):
    from pytest_pallas._compat import jax_internals

    module = jax_internals.private_attribute(tpu_interpreter.INTERPRETER_MODULE)
    memory = FakeSharedMemory(failure=failed_first)
    monkeypatch.setattr(module, "_shared_memory", memory, raising=False)
    timeout = KernelTimeout("ran longer than --pallas-timeout")

    assert tpu_interpreter.abort_interpreted_kernels(timeout)
    assert memory.barrier.broken and not memory.clean_up_barrier.broken
    # A device that failed on its own keeps its error in the slot; the timeout does not
    # replace it, and a second call still reaches the clean-up barrier.
    assert memory._failure is (failed_first or timeout)
    assert tpu_interpreter.abort_interpreted_kernels(timeout)
    assert memory.clean_up_barrier.broken
