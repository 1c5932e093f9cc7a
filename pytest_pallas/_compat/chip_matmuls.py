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

A GPU's tensor cores take a float32 operand as TensorFloat-32 (10 mantissa bits): inside
``float32_dots_rounded("tensorfloat32")`` a dot at precision None, ``DEFAULT`` or ``HIGH``
rounds both float32 operands to it (Triton's rule: either operand's precision asks for it),
the flag is ``"tensorfloat32"``, and :func:`gpu_wgmma_rounded` rounds the float32 operands
of Mosaic GPU's ``wgmma`` in JAX's GPU interpreter, which computes it with NumPy in a host
callback (``acc + np.matmul(a, b)``, jax 0.10.2 ``mosaic_gpu/interpret/gpu_callbacks.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy
import numpy as np
from jax.lax import Precision

from . import jax_internals
from .jax_internals import JaxInternalsChanged

_MLIR = "jax._src.interpreters.mlir"
_LAX = "jax._src.lax.lax"

# Mantissa bits kept of a float32 operand (exponent bits stay float32's 8).
MANTISSA_BITS = {"bfloat16": 7, "tensorfloat32": 10}

# The jax_default_matmul_precision value each block sets (None: float32 products): JAX's
# name of the TPU's default pass, of the GPU's TF32, and of the default (another cache key).
_PRECISION_FLAGS = {"bfloat16": "bfloat16", "tensorfloat32": "tensorfloat32", None: "default"}

_lock = threading.Lock()
_active: list[str | None] = []  # the rounding of each block entered, innermost last
_restore: Any = None


@contextlib.contextmanager
def float32_dots_rounded(rounding: str = "bfloat16") -> Iterator[None]:
    """Inside the block, a float32 ``dot_general`` at the default precision, lowered for the
    CPU, rounds its float32 operands to ``rounding`` (``"bfloat16"`` or ``"tensorfloat32"``)
    first. ``precision=HIGHEST`` (under ``"bfloat16"`` ``HIGH`` too), other operand dtypes and
    the accumulation type (``preferred_element_type``) are left as they are, but for a
    bfloat16 operand of an MXU dot under ``"bfloat16"``, held to bfloat16 values
    (:func:`operand_mantissa_bits`).

        with float32_dots_rounded():
            jnp.dot(x, y)  # x and y rounded to bfloat16, products summed in float32

    Blocks nest: the innermost one rounds. Raises ``JaxInternalsChanged`` when this JAX keeps
    its lowering rules elsewhere.
    """
    if rounding not in MANTISSA_BITS:
        raise ValueError(f"rounding {rounding!r} must be one of {', '.join(MANTISSA_BITS)}")
    with _block(rounding):
        yield


@contextlib.contextmanager
def float32_dots_exact() -> Iterator[None]:
    """Inside a :func:`float32_dots_rounded` block, float32 products again (a test that
    measures against float32 arithmetic). The flag becomes ``"default"`` (the same
    precision, another cache key) so that no program compiled with rounding is served."""
    with _block(None):
        yield


@contextlib.contextmanager
def _block(rounding: str | None) -> Iterator[None]:
    """Push ``rounding``; the flag follows it while it is the run's own (never the user's)."""
    global _restore

    with _lock:
        if not _active and rounding is not None:
            _restore = _install(_PRECISION_FLAGS[rounding])  # sets the flag itself
        outer = _PRECISION_FLAGS[_active[-1]] if _active else None
        _active.append(rounding)
    flag = _PRECISION_FLAGS[rounding]
    ours = outer is not None and jax.config.jax_default_matmul_precision == outer
    if ours and flag != outer:
        jax.config.update("jax_default_matmul_precision", flag)
    try:
        yield
    finally:
        if ours and flag != outer and jax.config.jax_default_matmul_precision == flag:
            jax.config.update("jax_default_matmul_precision", outer)
        with _lock:
            _active.pop()
            if not _active and _restore is not None:
                _restore()
                _restore = None


def rounding_now() -> str | None:
    """The rounding of the innermost :func:`float32_dots_rounded` block, or None."""
    return _active[-1] if _active else None


def _install(flag: str) -> Any:
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

    def rounded(ctx: Any, lhs: Any, rhs: Any, *, precision: Any = None, **params: Any) -> Any:
        rounding = rounding_now()
        dimension_numbers = params.get("dimension_numbers")
        if rounding is not None and goes_through_the_matrix_unit(
                rounding, *ctx.avals_in, dimension_numbers):
            per_operand = rounded_operands(rounding, precision)
            lhs, rhs = (
                _round(hlo, mlir, value, bits) if bits is not None else value
                for value, bits in zip((lhs, rhs), (
                    operand_mantissa_bits(rounding, aval, each)
                    for aval, each in zip(ctx.avals_in, per_operand))))
            if rounding == "bfloat16" and any(per_operand):
                return _accumulated_in_passes(
                    ctx, lhs, rhs, dimension_numbers,
                    lambda ctx, lhs, rhs: original(ctx, lhs, rhs, precision=precision,
                                                   **params), hlo, mlir)
        return original(ctx, lhs, rhs, precision=precision, **params)

    set_flag = jax.config.jax_default_matmul_precision is None
    mlir.register_lowering(primitive, rounded, platform="cpu", inline=entry.inline)
    if set_flag:
        jax.config.update("jax_default_matmul_precision", flag)

    def restore() -> None:
        mlir.register_lowering(primitive, original, platform="cpu", inline=entry.inline)
        if set_flag and jax.config.jax_default_matmul_precision == flag:
            jax.config.update("jax_default_matmul_precision", None)

    return restore


# How many elements of the contracted dimension one MXU pass sums: the TPU's lane width, the
# MXU's width on v4, v5e and v5p, and the unit of every kernel's K blocks (a float32 block's
# last dimension is a multiple of 128). v6e's and 7x's MXUs are 256 wide: a multiple.
PASS_DEPTH = 128


def _accumulated_in_passes(ctx: Any, lhs: Any, rhs: Any, dimension_numbers: Any,
                           dot: Any, hlo: Any, mlir: Any) -> Any:
    """A rounded float32 dot summed as the chip's passes sum it: the contracted dimension in
    runs of :data:`PASS_DEPTH`, one run's float32 result added to the next, in order.

    Why: a kernel that accumulates its K blocks (``acc += x_blk @ y_blk``) sums in that order,
    and on a TPU the test's own XLA dot does too, so JAX's tests hold the two to a few float32
    ulps (``atol=5e-5`` on sums near 128: tests/pallas/tpu_pallas_pipeline_test.py). XLA's CPU
    dot sums all of K at once, in its own order: 9 ulps from the float64 sum of the same
    rounded products where the kernel's order is 2.3, so 1.4% of elements missed. How the
    chip orders the products within one pass is unchecked; this takes the CPU's.
    """
    (lhs_contracting, rhs_contracting), _ = dimension_numbers
    lhs_aval, rhs_aval = ctx.avals_in
    out_aval = ctx.avals_out[0]
    if (len(lhs_contracting) != 1 or not _is_float32(out_aval)
            or not isinstance(lhs_aval.shape[lhs_contracting[0]], int)):
        return dot(ctx, lhs, rhs)
    depth = lhs_aval.shape[lhs_contracting[0]]
    if depth <= PASS_DEPTH:
        return dot(ctx, lhs, rhs)

    def run_of(value: Any, aval: Any, axis: int, start: int, stop: int) -> tuple[Any, Any]:
        starts, limits = [0] * len(aval.shape), list(aval.shape)
        starts[axis], limits[axis] = start, stop
        run_aval = aval.update(shape=tuple(limit - begin for begin, limit
                                           in zip(starts, limits)))
        return mlir.slice_op(ctx, value, run_aval, start_indices=starts, limit_indices=limits,
                             strides=[1] * len(aval.shape)), run_aval

    total = None
    for start in range(0, depth, PASS_DEPTH):
        stop = min(start + PASS_DEPTH, depth)
        lhs_run, lhs_run_aval = run_of(lhs, lhs_aval, lhs_contracting[0], start, stop)
        rhs_run, rhs_run_aval = run_of(rhs, rhs_aval, rhs_contracting[0], start, stop)
        [partial] = dot(ctx.replace(avals_in=(lhs_run_aval, rhs_run_aval)), lhs_run, rhs_run)
        total = partial if total is None else hlo.add(total, partial)
    return [total]


def goes_through_the_matrix_unit(rounding: str, lhs: Any, rhs: Any,
                                 dimension_numbers: Any) -> bool:
    """Whether the hardware that rounds for ``rounding`` computes this dot on its matrix unit.

    On a TPU a dot with an operand that has no free dimension (a matrix-vector product:
    ``jnp.dot`` of an (8, 8) and an (8,) float32 block) is not an MXU pass: Mosaic lowers it
    to ``llo.vmul.f32`` and ``llo.vadd.xlane.f32`` (libtpu 0.0.42.1's post-lower-to-llo dump,
    v5e), float32 products; XLA's own matrix-vector and vector dots too (``vmul.f32``, v4 to
    v6e; 7x puts XLA's on the MXU: ``numerics.NOT_EMULATED``). Every other form, transposed,
    batched, in ``vmap`` or ``shard_map``, is an MXU pass on both sides
    (``numerics.DOT_FORMS``, each read from libtpu's dump).
    """
    if rounding != "bfloat16" or dimension_numbers is None:
        return True
    (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = dimension_numbers
    free = (len(lhs.shape) - len(lhs_contracting) - len(lhs_batch),
            len(rhs.shape) - len(rhs_contracting) - len(rhs_batch))
    return min(free) > 0


def operand_mantissa_bits(rounding: str, aval: Any, rounded: bool) -> int | None:
    """The mantissa bits a matrix-unit dot's operand of type ``aval`` is rounded to on the
    CPU (None: taken as it is). A float32 operand that the hardware rounds (``rounded``, by
    the dot's precision): ``rounding``'s bits. A bfloat16 operand on a TPU: bfloat16's 7,
    whatever the precision.

    Why a bfloat16 operand: the MXU takes it as bfloat16 values, but XLA's CPU, which
    allows excess precision, may compute a bfloat16 expression that feeds a dot in float32
    and drop the rounding between (``jnp.dot(x, y.T + 1.0)`` of bfloat16 arrays: the
    transpose and the add fused into the dot's operand; not ``y + 1.0``), in a kernel's dot
    and in the test's alike, but not in every shape. On the chip the operand is rounded on
    both sides (Mosaic: ``llo.vpack`` to bfloat16 before ``llo.vmatmul``; XLA: a ``convert``
    to bf16 before the convolution: :data:`pytest_pallas.numerics.DOT_FORMS`).
    """
    if rounded and _is_float32(aval):
        return MANTISSA_BITS[rounding]
    if rounding == "bfloat16" and _is_bfloat16(aval):
        return MANTISSA_BITS["bfloat16"]
    return None


def rounded_operands(rounding: str, precision: Any) -> tuple[bool, bool]:
    """Which operands of a dot at ``precision`` (a ``dot_general``'s parameter) the hardware
    takes rounded: on a TPU each operand at None or ``DEFAULT``; on a GPU both, when either
    is at None, ``DEFAULT`` or ``HIGH`` (Triton's ``input_precision=TF32``; XLA's TF32 at
    both)."""
    if rounding == "bfloat16" and getattr(precision, "name", None) in _ONE_BFLOAT16_PASS:
        return True, True  # the algorithm says so on any backend; XLA's CPU ignores it
    per_operand = _per_operand(precision, Precision)
    if rounding == "tensorfloat32":
        either = any(each in (None, Precision.DEFAULT, Precision.HIGH) for each in per_operand)
        return either, either
    each_rounded = tuple(each in (None, Precision.DEFAULT) for each in per_operand)
    return each_rounded[0], each_rounded[1]


# Dot algorithms (``jax.lax.DotAlgorithmPreset``) that take both operands as bfloat16 in one
# pass: what the TPU's MXU does at the default precision. XLA's CPU computes them in float32
# (tokamax's test_precision expects BF16_BF16_F32 to differ from HIGHEST).
_ONE_BFLOAT16_PASS = ("BF16_BF16_F32", "BF16_BF16_BF16")


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
    return _dtype_name(aval) == "float32"


def _is_bfloat16(aval: Any) -> bool:
    return _dtype_name(aval) == "bfloat16"


def _dtype_name(aval: Any) -> str | None:
    try:
        return np.dtype(aval.dtype).name
    except TypeError:  # an extended dtype (a key, a semaphore)
        return None


def round_mantissa(values: Any, rounding: str) -> Any:
    """A NumPy float32 array with its mantissa rounded to ``rounding``'s bits, to nearest,
    ties to even (as XLA's ``reduce_precision``); NaN and infinities kept. For host code
    (a callback), where no XLA program may run."""
    values = np.asarray(values)
    drop = 23 - MANTISSA_BITS[rounding]
    raw = values.view(np.uint32)
    odd = (raw >> np.uint32(drop)) & np.uint32(1)
    half = np.uint32((1 << (drop - 1)) - 1)
    kept = (raw + half + odd) & np.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    return np.where(np.isnan(values), values, kept.view(np.float32))


_GPU_CALLBACKS = "jax._src.pallas.mosaic_gpu.interpret.gpu_callbacks"


class _RoundingNumPy:
    """NumPy, but a float32 ``matmul`` inside a ``"tensorfloat32"`` block takes TF32 operands."""

    def __init__(self, numpy: Any) -> None:
        self._numpy = numpy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._numpy, name)

    def matmul(self, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        if rounding_now() == "tensorfloat32":
            a, b = (round_mantissa(x, "tensorfloat32")
                    if getattr(x, "dtype", None) == self._numpy.float32 else x for x in (a, b))
        return self._numpy.matmul(a, b, *args, **kwargs)


def _computes_with_np_matmul(module: Any) -> bool:
    """Whether ``module``'s source computes its products with its global ``np``'s ``matmul``
    (jax 0.10.2: in ``wgmma`` itself; jax 0.12: in the pending wgmma it applies later)."""
    try:
        return "np.matmul(" in inspect.getsource(module)
    except (OSError, TypeError):  # no source shipped: the swap cannot be vouched for
        return False


@contextlib.contextmanager
def gpu_wgmma_rounded() -> Iterator[None]:
    """Inside the block (and a ``"tensorfloat32"`` one), JAX's GPU interpreter computes
    Mosaic GPU's ``wgmma`` of float32 operands with TF32 operands, as Mosaic GPU compiles it
    (``wgmma.py``: a float32 operand's element type is ``FloatTF32Type``). Raises
    ``JaxInternalsChanged`` when the interpreter no longer computes it with ``np.matmul``."""
    callbacks = jax_internals.private_attribute(_GPU_CALLBACKS)
    current = getattr(callbacks, "np", None)
    if not (hasattr(callbacks, "wgmma") and _computes_with_np_matmul(callbacks)) or not (
            current is numpy or isinstance(current, _RoundingNumPy)):
        raise JaxInternalsChanged(
            f"{_GPU_CALLBACKS}.wgmma no longer computes with np.matmul; Mosaic GPU's wgmma "
            "of float32 operands computes float32 products in JAX's GPU interpreter on this "
            "JAX (as --pallas-numerics=exact)")
    if isinstance(current, _RoundingNumPy):  # nested: the outer block restores
        yield
        return
    callbacks.np = _RoundingNumPy(numpy)
    try:
        yield
    finally:
        callbacks.np = numpy
