"""--pallas-timeout's watchdog: it times each TPU-interpreted kernel, not the whole test."""

import threading
import time

import pytest

from pytest_pallas._compat import tpu_interpreter
from pytest_pallas.supervision.timeout import Watchdog


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


def test_a_long_test_of_quick_kernels_is_not_stopped(no_abort, capsys):
    kernels = FakeKernels({"quick": 0.01})
    with Watchdog(0.2, lambda: "kernel 'quick'", kernel_ages=kernels) as watchdog:
        time.sleep(2.0)  # the test outlives the timeout ten times over; no kernel does
    assert kernels.asked.is_set()
    assert not watchdog.fired and not no_abort
    assert "no TPU-interpreted kernel has run that long" in capsys.readouterr().err


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
