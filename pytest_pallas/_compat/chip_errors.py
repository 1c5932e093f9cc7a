"""The exception types JAX raises on a TPU when the chip's compiler rejects a kernel, so that
the CPU run's rejection is one of them too (contract §9).

On the chip a kernel Mosaic cannot compile (a scalar op on i8, a block over the scoped VMEM
limit) fails in XLA's compile with ``jax.errors.JaxRuntimeError``, which Pallas re-raises as
``MosaicError`` (``jax._src.pallas.mosaic.error_handling``) when the message carries
Mosaic's source location. Tests written for the chip expect either
(``assertRaises(MosaicError)``, ``assertRaises(jax.errors.JaxRuntimeError)``); the plugin's
``TpuRuleViolation`` for the same kernel is then an instance of both.
"""

from __future__ import annotations

import functools

import jax

from .jax_internals import JaxInternalsChanged, private_attribute

_ERROR_HANDLING_MODULE = "jax._src.pallas.mosaic.error_handling"


@functools.cache
def chip_compile_errors() -> tuple[type[BaseException], ...]:
    """``(MosaicError, JaxRuntimeError)``, or what this JAX still has of them."""
    found: list[type[BaseException]] = []
    try:
        found.append(private_attribute(_ERROR_HANDLING_MODULE, "MosaicError"))
    except JaxInternalsChanged:
        pass  # then only the public type below
    runtime_error = getattr(jax.errors, "JaxRuntimeError", None)
    if isinstance(runtime_error, type):
        found.append(runtime_error)
    return tuple(found)


@functools.cache
def as_chip_compile_error(base: type[BaseException],
                          lowering: type[BaseException] | None = None) -> type[BaseException]:
    """A subclass of ``base`` that is also each of the chip's compile errors, and
    ``lowering`` (the Python exception Mosaic's lowering raised: ``NotImplementedError`` for
    an unsigned matmul) when given; ``base`` itself when Python cannot combine them."""
    bases = (base, *([lowering] if lowering is not None else []), *chip_compile_errors())
    message = property(BaseException.__str__)
    try:
        return type(f"{base.__name__}ByTheChip", bases, {
            "__module__": base.__module__,
            "__doc__": f"{base.__doc__}\n\nAlso the error JAX raises on the chip for it "
                       "(MosaicError, jax.errors.JaxRuntimeError).",
            # JaxRuntimeError's own constructor never runs (the plugin's does): its message
            # accessors read the plugin's message instead.
            "__str__": BaseException.__str__,
            "error_message": message,
            "_error_message": message,
        })
    except TypeError:  # a layout Python cannot merge: keep the plugin's own type
        return base
