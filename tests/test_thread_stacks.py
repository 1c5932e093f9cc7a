"""``_compat.thread_stacks``: a thread's place read from another thread, an exception raised
in it, and the JAX internals that tell a compile from a computation."""

import os
import threading
import time

from pytest_pallas._compat import thread_stacks


class Stop(BaseException):
    pass


def _in_a_thread(target):
    """Start ``target`` in a daemon thread; its id, once it is running."""
    started = threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), target()), daemon=True)
    thread.start()
    started.wait()
    time.sleep(0.1)
    return thread


def test_a_python_loop_is_seen_moving_at_its_line_and_stopped_by_an_exception():
    raised = []

    def loop():
        try:
            total = 0
            while True:
                total += sum(range(10))
        except Stop:
            raised.append(True)

    thread = _in_a_thread(loop)
    place = thread_stacks.place_of_thread(thread.ident, __file__)
    assert place.kind == thread_stacks.PYTHON and place.moving
    assert place.line.startswith(os.path.relpath(__file__) + ":")
    assert "total += sum(range(10))" in place.stack or "while True:" in place.stack
    assert thread_stacks.raise_in_thread(thread.ident, Stop)
    thread.join(5)
    assert raised == [True]


def test_a_call_that_does_not_return_to_python_is_seen_still():
    thread = _in_a_thread(lambda: time.sleep(1.5))
    place = thread_stacks.place_of_thread(thread.ident, __file__)
    assert place.kind == thread_stacks.PYTHON and not place.moving
    assert "time.sleep(1.5)" in place.stack
    thread.join()
    assert thread_stacks.place_of_thread(thread.ident, __file__) is None  # it has ended


def test_an_exception_taken_back_is_never_raised():
    raised = []
    finish = threading.Event()

    def loop():
        try:
            while not finish.is_set():
                time.sleep(0.01)
        except Stop:
            raised.append(True)

    thread = _in_a_thread(loop)
    thread_stacks.cancel_raise_in_thread(thread.ident)  # nothing pending: no effect
    finish.set()
    thread.join(5)
    assert raised == []


def test_a_thread_waiting_for_an_xla_computation_is_seen_inside_xla():
    import jax
    import jax.numpy as jnp
    from jax import lax

    @jax.jit
    def long_loop(x):  # seconds inside XLA, then it returns
        return lax.while_loop(lambda c: c[0] < 300_000_000, lambda c: (c[0] + 1, c[1] + 1.0),
                              (0, x))[1]

    thread = _in_a_thread(lambda: long_loop(jnp.ones(2)).block_until_ready())
    place = thread_stacks.place_of_thread(thread.ident, __file__)
    while place is not None and place.kind != thread_stacks.XLA:  # tracing, compiling first
        place = thread_stacks.place_of_thread(thread.ident, __file__)
    thread.join(120)
    assert place is not None, "the XLA loop ended before it was seen"
    assert not place.moving
    assert place.line.startswith(os.path.relpath(__file__) + ":")
    assert "block_until_ready()" in place.stack


def test_jax_compiles_where_the_plugin_looks_for_a_compile():
    from jax._src import compiler

    assert compiler.__file__.endswith(thread_stacks.JAX_COMPILER_SOURCE)
    assert callable(compiler.compile_or_get_cached)
