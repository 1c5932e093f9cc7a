"""Float32 matmuls on the CPU rounded as an accelerator rounds them: a replacement of the
CPU lowering rule of ``lax.dot_general_p`` (a private registry of JAX's MLIR lowering).

On a TPU a float32 ``dot_general`` at the default precision is one bfloat16 MXU pass: its
operands are rounded to bfloat16 (round to nearest even), the products are exact and
accumulate in float32 (``pytest_pallas.numerics`` holds the facts and their sources). The
CPU computes it in float32. Inside :func:`float32_dots_rounded` every such dot lowered for
the CPU rounds its float32 operands first, with XLA's ``reduce_precision`` (bit for bit
``x.astype(bfloat16).astype(float32)``): the kernels that JAX's interpreters evaluate (their
``dot_general`` equations are bound, and so lowered, on the CPU) and the test's own XLA dots
(a reference ``jnp.dot``, a jitted oracle) alike, as on the chip both round.

JAX caches lowered and compiled programs by the program and its trace context; the rule is
not part of that context, but ``jax_default_matmul_precision`` is. So the block also sets
that flag, process-wide (the interpreter evaluates kernels on XLA's callback threads, which
do not see a thread's own setting), to ``"bfloat16"``, the name JAX gives the TPU's default
(``Precision.DEFAULT``): a program compiled outside the block is never served inside it,
nor the reverse. A user's own setting of the flag wins (the block then leaves it alone, and
a dot whose precision it makes ``HIGHEST`` keeps float32, as on the chip).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from . import jax_internals
from .jax_internals import JaxInternalsChanged

_MLIR = "jax._src.interpreters.mlir"
_LAX = "jax._src.lax.lax"

# Mantissa bits kept of a float32 operand (exponent bits stay float32's 8).
MANTISSA_BITS = {"bfloat16": 7, "tensorfloat32": 10}

# The jax_default_matmul_precision value the block sets: the TPU's default pass.
_PRECISION_FLAG = "bfloat16"

_lock = threading.Lock()
_active: list[str | None] = []  # the rounding of each block entered, innermost last
_restore: Any = None


@contextlib.contextmanager
def float32_dots_rounded(rounding: str = "bfloat16") -> Iterator[None]:
    """Inside the block, a float32 ``dot_general`` at the default precision, lowered for the
    CPU, rounds its float32 operands to ``rounding`` (``"bfloat16"`` or ``"tensorfloat32"``)
    first. ``precision=HIGHEST`` (or ``HIGH``), other operand dtypes and the accumulation type
    (``preferred_element_type``) are left as they are.

        with float32_dots_rounded():
            jnp.dot(x, y)  # x and y rounded to bfloat16, products summed in float32

    Raises ``JaxInternalsChanged`` when this JAX keeps its lowering rules elsewhere.
    """
    global _restore
    if rounding not in MANTISSA_BITS:
        raise ValueError(f"rounding {rounding!r} must be one of {', '.join(MANTISSA_BITS)}")
    with _lock:
        if not _active:
            _restore = _install()
        _active.append(rounding)
    try:
        yield
    finally:
        with _lock:
            _active.pop()
            if not _active and _restore is not None:
                _restore()
                _restore = None


@contextlib.contextmanager
def float32_dots_exact() -> Iterator[None]:
    """Inside a :func:`float32_dots_rounded` block, float32 products again (a test that
    measures against float32 arithmetic). The flag becomes ``"default"`` (the same
    precision, another cache key) so that no program compiled with rounding is served."""
    import jax

    with _lock:
        _active.append(None)
    ours = jax.config.jax_default_matmul_precision == _PRECISION_FLAG
    if ours:
        jax.config.update("jax_default_matmul_precision", "default")
    try:
        yield
    finally:
        if ours and jax.config.jax_default_matmul_precision == "default":
            jax.config.update("jax_default_matmul_precision", _PRECISION_FLAG)
        with _lock:
            _active.pop()


def rounding_now() -> str | None:
    """The rounding of the innermost :func:`float32_dots_rounded` block, or None."""
    return _active[-1] if _active else None


def _install() -> Any:
    import jax

    mlir = jax_internals.private_attribute(_MLIR)
    primitive = jax_internals.private_attribute(_LAX, "dot_general_p")
    table = getattr(mlir, "_platform_specific_lowerings", None)
    entry = table.get("cpu", {}).get(primitive) if table is not None else None
    original = getattr(entry, "rule", None)
    if not callable(original) or not hasattr(mlir, "register_lowering"):
        raise JaxInternalsChanged(
            f"{_MLIR} no longer keeps a CPU lowering rule for dot_general where pytest-pallas "
            "looks (_platform_specific_lowerings['cpu']); float32 matmuls cannot round as "
            "the chip's on this JAX (--pallas-numerics=exact runs without it).")
    hlo = jax_internals.private_attribute("jax._src.lib.mlir.dialects", "hlo")
    lax = jax_internals.private_attribute(_LAX)

    def rounded(ctx: Any, lhs: Any, rhs: Any, *, precision: Any = None, **params: Any) -> Any:
        rounding = rounding_now()
        if rounding is not None:
            bits = MANTISSA_BITS[rounding]
            per_operand = _per_operand(precision, lax.Precision)
            lhs, rhs = (
                _round(hlo, mlir, value, bits)
                if _is_float32(aval) and each in (None, lax.Precision.DEFAULT) else value
                for value, aval, each in zip((lhs, rhs), ctx.avals_in, per_operand))
        return original(ctx, lhs, rhs, precision=precision, **params)

    flag_before = jax.config.jax_default_matmul_precision
    set_flag = flag_before is None
    mlir.register_lowering(primitive, rounded, platform="cpu", inline=entry.inline)
    if set_flag:
        jax.config.update("jax_default_matmul_precision", _PRECISION_FLAG)

    def restore() -> None:
        mlir.register_lowering(primitive, original, platform="cpu", inline=entry.inline)
        if set_flag and jax.config.jax_default_matmul_precision == _PRECISION_FLAG:
            jax.config.update("jax_default_matmul_precision", None)

    return restore


def _per_operand(precision: Any, precision_enum: Any) -> tuple[Any, Any]:
    """The precision of each operand; ``"other"`` for a dot algorithm (left alone)."""
    if precision is None:
        return None, None
    if isinstance(precision, precision_enum):
        return precision, precision
    if isinstance(precision, (tuple, list)) and len(precision) == 2:
        return tuple(precision)
    return "other", "other"


def _round(hlo: Any, mlir: Any, value: Any, mantissa_bits: int) -> Any:
    return hlo.reduce_precision(value, mlir.i32_attr(8), mlir.i32_attr(mantissa_bits))


def _is_float32(aval: Any) -> bool:
    import numpy as np

    try:
        return np.dtype(aval.dtype) == np.float32
    except TypeError:  # an extended dtype (a key, a semaphore)
        return False
