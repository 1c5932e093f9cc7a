"""Fixes to JAX's TPU interpreter that the plugin applies while a Pallas test runs.

Part of the compatibility layer (see ``_jax_compat``): every private JAX
internal used here is reached through ``_jax_compat._private`` and each fix
is a context manager that puts JAX back as it was on exit. Each is tested at
both ends of the supported range in ``tests/test_interpreter_compat.py``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from ._jax_compat import JaxInternalsChanged, _private

_CALLBACK = "jax._src.callback"
_INTERPRETER_PACKAGE = "jax._src.pallas.mosaic.interpret"


def _callback_module(callback: Any) -> str:
    """The module of the Python function behind an io_callback's ``_FlatCallback``."""
    function = getattr(callback, "callback_func", callback)
    while isinstance(function, functools.partial):
        function = function.func
    return getattr(function, "__module__", "") or ""


@contextlib.contextmanager
def interpreter_callbacks_on_host_arrays() -> Iterator[bool]:
    """The TPU interpreter's callbacks get their operands as NumPy arrays, not as JAX arrays.

    Why: ``jax.experimental.io_callback`` copies a callback's operands onto the
    CPU device (``device_put``) before calling it. XLA's CPU client copies a
    buffer of 100 KiB or more on its thread pool, whose size is the number of
    simulated devices on a small host. A kernel interpreted on 8 devices holds
    all 8 pool threads in its callbacks while they wait on each other (a remote
    DMA, a barrier), so the copy of a large operand waits for a thread that
    never frees: the run hangs with every thread on a futex, past any timeout
    (``bench_reduce_scatter`` on 8 devices did). The interpreter reads its
    operands with NumPy anyway, so they are handed over as NumPy copies
    instead. Other callbacks are left to JAX. Yields False when this JAX's
    io_callback cannot be wrapped (JAX's behaviour then).
    """
    try:
        module = _private(_CALLBACK)
        original = module.io_callback_impl
    except (JaxInternalsChanged, AttributeError):
        yield False
        return
    import numpy as np

    @functools.wraps(original)
    def io_callback_impl(*args: Any, callback: Any, **params: Any) -> Any:
        if not _callback_module(callback).startswith(_INTERPRETER_PACKAGE):
            return original(*args, callback=callback, **params)
        # Copies: the operands are views of XLA's buffers, valid during the call only.
        results = callback(*(np.array(arg) for arg in args))
        return [np.asarray(result) for result in results]

    module.io_callback_impl = io_callback_impl
    try:
        yield True
    finally:
        module.io_callback_impl = original
