"""The TPU interpreter's per-core computations, compiled once per kernel instead of once per
core and call.

JAX's interpreter (0.10.2 to 0.12, ``interpret/thread_map.py``) runs a kernel's cores each on
a thread of its own, and each thread traces, lowers and compiles the same per-core program
anew (``_run_jaxpr``: ``jax.jit(...).trace(...).lower().compile()``), at every call of the
kernel. For a two-core chip that doubled a compile; for a SparseCore kernel, one interpreter
core per subcore (``_compat.sparsecore``), it is 16 to 64 compiles of one program per call:
7 to 8 s of a call of a 32-subcore kernel writing one row each was 32 lowerings and compiles
(43 s of its threads' 52), its run 5 s.

Here the program is compiled by the first thread that needs it and run by every thread, for
as long as the block lasts: the same program (the thread map's jaxpr, by identity) with
operands of the same shapes and dtypes runs the same executable. The executable is placed
where ``interpreter_fixes.core_threads_off_the_kernels_device`` places the per-core
computations (the last simulated device), and so is its run. Each program's output says
when it has run: XLA may return from the call before (asynchronous dispatch), and a test
that --pallas-timeout stopped waits for its kernels' programs (``wait_for_core_programs``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from .jax_internals import JaxInternalsChanged, attributes_replaced, private_attribute

_THREAD_MAP = "jax._src.pallas.mosaic.interpret.thread_map"


# The per-core programs running now: those being started (a count), and the output of each
# started one, ready once the program has run (XLA may return from its call before: its
# asynchronous dispatch). A test that --pallas-timeout stopped may return while some still
# run, and the next test's kernels must not meet them in the interpreter's state.
_starting = 0
_started: list[Any] = []
_running_changed = threading.Condition()


def _still_running() -> bool:
    # Under _running_changed. Outputs that are ready leave the list, so that it holds only
    # the programs still running, however many kernels a run interprets.
    _started[:] = [output for output in _started if not output.is_ready()]
    return bool(_starting or _started)


def wait_for_core_programs(seconds: float, poke: Callable[[], object] = lambda: None) -> bool:
    """Wait, at most ``seconds``, until no per-core program runs; ``poke()`` is called every
    quarter second meanwhile (the watchdog's abort, which ends them at their next callback).
    Returns whether none runs."""
    deadline = time.monotonic() + seconds
    while True:
        with _running_changed:
            if not _still_running():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _running_changed.wait(min(left, 0.25))
        poke()


def _evaluate(jaxpr: Any, consts: Any, *args: Any) -> Any:
    jax.core.eval_jaxpr(jaxpr, consts, *args)
    # An output to ask: ready only once the whole program has run.
    return np.int32(0)


@contextlib.contextmanager
def _kernel_local_effects_lowerable() -> Iterator[None]:
    """Inside the block, the effects Pallas keeps inside a kernel (``pltpu.trace_value``'s,
    the explicit MXU's: ``pallas.core.kernel_local_effects``) do not stop a lowering. A
    per-core program is a kernel's body at the top of a program of its own, and JAX's
    lowering refuses an effect it does not know ("Cannot lower jaxpr with effects"): JAX's
    own thread map failed so for every kernel with one on a chip of two TensorCores, where
    one core runs the body inside its ``pallas_call``."""
    try:
        local = private_attribute("jax._src.pallas.core", "kernel_local_effects")._effect_types
        lowerable = private_attribute("jax._src.effects", "lowerable_effects")._effect_types
    except (JaxInternalsChanged, AttributeError):
        yield
        return
    added = set(local) - set(lowerable)
    lowerable.update(added)
    try:
        yield
    finally:
        lowerable.difference_update(added)


@contextlib.contextmanager
def per_core_programs_compiled_once() -> Iterator[bool]:
    """Inside the block, each per-core program of the TPU interpreter compiles once (see the
    module docstring); yields False where the thread map moved."""
    try:
        module = private_attribute(_THREAD_MAP)
        private_attribute(_THREAD_MAP, "_run_jaxpr")
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    compiled: dict[tuple, tuple[Any, Any]] = {}
    compiling = threading.Lock()

    def run_jaxpr(jaxpr: Any, consts: Any, *args: Any) -> None:
        global _starting
        with _running_changed:
            _starting += 1
        output = None
        try:
            output = run_compiled(jaxpr, consts, *args)
        finally:
            with _running_changed:
                _starting -= 1
                if output is not None:
                    _started.append(output)
                _still_running()  # drops the outputs of programs that have run
                _running_changed.notify_all()

    def run_compiled(jaxpr: Any, consts: Any, *args: Any) -> Any:
        leaves = jax.tree.leaves((consts, args))
        key = (id(jaxpr), tuple((np.shape(x), np.asarray(x).dtype) for x in leaves))
        # Where core_threads_off_the_kernels_device runs them: JAX's default device is a
        # thread's own setting.
        with jax.default_device(jax.local_devices()[-1]):
            with compiling:
                entry = compiled.get(key)
                if entry is None or entry[0] is not jaxpr:
                    traced = jax.jit(_evaluate, static_argnums=(0,)).trace(jaxpr, consts, *args)
                    with _kernel_local_effects_lowerable():
                        lowered = traced.lower()
                    # The jaxpr is kept with its executable: its id stays its own.
                    entry = compiled[key] = (jaxpr, lowered.compile())
            return entry[1](consts, *args)

    with attributes_replaced(module, {"_run_jaxpr": run_jaxpr}):
        try:
            yield True
        finally:
            compiled.clear()
