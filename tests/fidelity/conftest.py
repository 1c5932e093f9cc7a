"""The fidelity tests' TPU interpreter, for kernels that are broken on purpose."""

from __future__ import annotations

import contextlib

import pytest
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas._compat import jax_internals, pallas_call_hooks, tpu_interpreter


@pytest.fixture
def interpret():
    """Run the body in TPU interpret mode with the given params, from fresh interpreter state.

    The kernels here are broken on purpose: checks a harness runs around the whole test
    (static checks, kernel-exit checks) are suspended inside, and the interpreter's state
    (its race flag among it) is cleared on the way out.
    """

    @contextlib.contextmanager
    def run(**params):
        tpu_interpreter.reset_interpreter_state()
        try:
            with (
                pallas_call_hooks.suspend_pallas_call_observers(),
                tpu_interpreter.suspend_kernel_exit_recording(),
                pltpu.force_tpu_interpret_mode(jax_internals.interpret_params(**params)),
            ):
                yield
        finally:
            tpu_interpreter.reset_interpreter_state()

    return run
