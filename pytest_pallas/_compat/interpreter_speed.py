"""What makes an interpreted kernel cheaper without changing what it computes or what is
checked of it.

``jax_enable_checks`` turns on JAX's checks of its own invariants: every jaxpr JAX builds is
type-checked again (``core.check_jaxpr``), at every level of nesting. JAX's test cases turn it
on for every test (``JaxTestCase._default_thread_local_config``). Inside a Pallas kernel's body
a ``pl.when`` or ``lax.fori_loop`` builds a ``cond`` or ``while`` whose branches are checked
again by each enclosing one, and the TPU interpreter expands a kernel into a program of
thousands of equations: measured on JAX's ragged paged attention test (``complex12``, jax
0.10.2), a sixth of the test's CPU went to these checks, three quarters of it in the kernel
body's trace (``benchmarks/profile_phases.py``). They check JAX, not the kernel: a kernel's
type errors are raised by the primitives' own rules either way. Inside
:func:`jax_checks_off_in_kernels`, a kernel's body is traced, and a ``pallas_call`` lowered (an
interpreter's expansion with it), with the checks off; the test's own program keeps them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .jax_internals import JaxInternalsChanged, private_attribute

_PALLAS_CALL = "jax._src.pallas.pallas_call"
_MLIR = "jax._src.interpreters.mlir"


@contextlib.contextmanager
def jax_checks_off_in_kernels() -> Iterator[None]:
    """Inside the block, Pallas traces a kernel's body and lowers a ``pallas_call`` with
    ``jax_enable_checks`` off (see the module docstring); everything is restored on exit."""
    pallas_call = private_attribute(_PALLAS_CALL)
    mlir = private_attribute(_MLIR)
    trace_kernel = getattr(pallas_call, "_trace_kernel_to_jaxpr", None)
    primitive = getattr(pallas_call, "pallas_call_p", None)
    entry = getattr(mlir, "_lowerings", {}).get(primitive)
    lowering = getattr(entry, "rule", None)
    if not callable(trace_kernel) or not callable(lowering):
        raise JaxInternalsChanged(
            f"{_PALLAS_CALL} traces and lowers kernels elsewhere on this JAX: JAX's own checks "
            "stay on inside kernels")

    def unchecked(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def without_checks(*args: Any, **kwargs: Any) -> Any:
            with jax.enable_checks(False):
                return function(*args, **kwargs)

        return without_checks

    pallas_call._trace_kernel_to_jaxpr = unchecked(trace_kernel)
    mlir.register_lowering(primitive, unchecked(lowering), inline=entry.inline)
    try:
        yield
    finally:
        pallas_call._trace_kernel_to_jaxpr = trace_kernel
        mlir.register_lowering(primitive, lowering, inline=entry.inline)
