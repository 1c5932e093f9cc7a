"""The comparator: ``assert_allclose`` and the tolerance policy behind it.

An element passes when ``|actual - expected| <= atol + rtol * |expected|``.

* ``rtol`` is one unit in the last place of the output dtype: a correctly
  rounded result is within half of it.
* ``atol`` is scaled by ``max|expected|`` (so an all-zeros output never passes
  for a non-zero expectation, whatever the tolerance): a quarter of the
  output's ulp, plus the error a float32 accumulation of ``reduction_length``
  terms may add (``eps_accumulator * (1 + log2(L))``). On a TPU, where a
  float32 ``jnp.dot`` rounds its operands to bfloat16, the accumulator's
  epsilon is bfloat16's (``matmul_precision="bfloat16"``); on a GPU, whose tensor
  cores round float32 operands to TensorFloat-32, it is TF32's, 2**-10
  (``matmul_precision="tensorfloat32"``).

The policy is deliberately tight: a bfloat16 matmul with k >= 512 that
accumulates in bfloat16 instead of float32 fails it (tests/test_compare.py
shows that), while a float32-accumulating one passes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from .checks import mismatch
from .checks.mismatch import bitwise_differences  # noqa: F401  (public here too)
from .dtypes import EPSILON, MATMUL_PRECISIONS, ML_DTYPES, epsilon, matmul_epsilon
from .ops.error_models import error_model_hint
from .ops.registry import op_error_model


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol * |expected|``, and the reason for the numbers."""

    rtol: float
    atol: float
    why: str

    def bound(self, expected: np.ndarray) -> np.ndarray:
        return self.atol + self.rtol * np.abs(expected)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The outcome of one comparison; ``worst_error`` is in units of the tolerance (<= 1 passes)."""

    passed: bool
    worst_error: float
    tolerance: Tolerance | None
    message: str


def default_tolerance(
    dtype: Any,
    *,
    scale: float,
    reduction_length: int | None = None,
    matmul_precision: str = "float32",
) -> Tolerance:
    """The default tolerance for an output of ``dtype`` whose largest expected magnitude
    is ``scale``.

    >>> default_tolerance("bfloat16", scale=1.0).rtol
    0.0078125
    """
    name = np.dtype(dtype).name
    output_eps = epsilon(name)
    accumulator = matmul_precision if matmul_precision in MATMUL_PRECISIONS else "float32"
    reasons = [f"{name} output: rtol = 1 ulp = {output_eps:.3g}"]
    atol_units = output_eps / 4
    # A matmul that rounds its operands (bfloat16, TF32) errs by its epsilon even when it
    # sums one term: its products are of rounded operands.
    if reduction_length is not None and (reduction_length > 1 or accumulator != "float32"):
        accumulation = matmul_epsilon(accumulator) * (1 + math.log2(reduction_length))
        atol_units += accumulation
        reasons.append(
            f"reduction of length {reduction_length} accumulated in {accumulator} "
            f"adds {accumulation:.3g}"
        )
    reasons.append(f"atol = {atol_units:.3g} x max|expected| ({scale:.4g})")
    atol = atol_units * scale
    floor = _smallest_normal(name)
    if atol < floor:
        # TPUs flush subnormals to zero: a result below the smallest normal
        # number may come back as 0 from a correct kernel.
        atol = floor
        reasons.append(f"at least the smallest normal {name}, {floor:.3g} (subnormals flush to 0)")
    return Tolerance(rtol=output_eps, atol=atol, why="; ".join(reasons))


def _smallest_normal(name: str) -> float:
    return float(ml_dtypes.finfo(ML_DTYPES.get(name, np.dtype(name))).tiny)


def _to_numpy(value: Any, what: str) -> np.ndarray:
    if isinstance(value, (tuple, list, dict)):
        raise TypeError(
            f"{what} is a {type(value).__name__}, expected an array; "
            "compare pytrees of the same structure, or return a single jax.Array"
        )
    try:
        return np.asarray(value)
    except Exception as error:
        raise TypeError(
            f"{what} of type {type(value).__name__} cannot be read as an array: {error}"
        )


def _format_index(flat_index: int, shape: tuple[int, ...]) -> str:
    if not shape:
        return "()"
    return str(tuple(int(i) for i in np.unravel_index(flat_index, shape)))


def _format_value(value: Any) -> str:
    return np.format_float_positional(float(value), precision=8, trim="-") if np.isfinite(
        value
    ) else str(float(value))


def compare_arrays(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    reduction_length: int | None = None,
    matmul_precision: str = "float32",
    dtype: Any = None,
    exact: bool | None = None,
    name: str = "",
    additional_atol: float = 0.0,
    additional_reason: str = "",
    block_shape: Sequence[int | None] | None = None,
    without_step: Mapping[str, Any] | None = None,
) -> Comparison:
    """Compare one array leaf; never raises for a mismatch (see ``Comparison.message``).

    ``dtype`` is the dtype the result must have (defaults to the actual dtype, so a
    float64 oracle can be the expectation); ``exact`` forces bit-for-bit equality
    (default: for integer and boolean outputs). ``additional_atol`` widens the
    default for an error source the op knows of, ``additional_reason`` says which.
    A mismatch's message ends with its pattern (``checks.mismatch.diagnose``), located in
    blocks of ``block_shape`` (default: the output block of a kernel the test traced,
    else (8, 128) tiles); ``without_step`` maps a reduction step to the expected
    result without it, to recognise a skipped step.
    """
    actual_array = _to_numpy(actual, f"actual{name}")
    expected_array = _to_numpy(expected, f"expected{name}")
    label = f"output{name}" if name else "output"
    if dtype is not None and actual_array.dtype != np.dtype(dtype):
        return Comparison(False, math.inf, None,
                          f"{label} has dtype {actual_array.dtype}, expected {np.dtype(dtype)}.")
    if actual_array.shape != expected_array.shape:
        return Comparison(
            False, math.inf, None,
            f"{label} has shape {actual_array.shape}, expected {expected_array.shape}.",
        )
    out_dtype = actual_array.dtype
    if exact is None:
        exact = not np.issubdtype(out_dtype, np.inexact) and out_dtype.name not in EPSILON
    size = actual_array.size
    header = f"{label} ({out_dtype.name}, shape {actual_array.shape})"
    blocks = mismatch.blocks_for(actual_array.shape, block_shape)
    if exact:
        return _compare_exact(actual_array, expected_array, header, blocks, without_step)

    a = actual_array.astype(np.float64)
    e = expected_array.astype(np.float64)
    finite_expected = e[np.isfinite(e)]
    scale = float(np.max(np.abs(finite_expected))) if finite_expected.size else 0.0
    tolerance = _tolerance(out_dtype, scale, rtol=rtol, atol=atol,
                           reduction_length=reduction_length,
                           matmul_precision=matmul_precision)
    if additional_atol:
        tolerance = Tolerance(rtol=tolerance.rtol, atol=tolerance.atol + additional_atol,
                              why=f"{tolerance.why}; {additional_reason}")
    errors = _ElementErrors.of(a, e, tolerance)
    if errors.count == 0:
        return Comparison(True, errors.worst, tolerance, "")
    lines = [f"Arrays are not close: {header}.",
             f"Mismatched elements: {errors.count} / {size} "
             f"({100.0 * errors.count / size:.3g}%)",
             *_worst_differences(a, e, errors),
             f"Tolerance: |actual - expected| <= atol + rtol * |expected| with "
             f"rtol={tolerance.rtol:.3g}, atol={tolerance.atol:.3g} ({tolerance.why})",
             f"Worst error: {errors.worst:.3g} x tolerance"]
    lines += _pattern(a, e, errors.mismatched, tolerance, blocks, without_step)
    lines += _nan_where_finite_hint(a, e)
    return Comparison(False, errors.worst, tolerance, "\n".join(lines))


def _tolerance(out_dtype: np.dtype, scale: float, *, rtol: float | None, atol: float | None,
               reduction_length: int | None, matmul_precision: str) -> Tolerance:
    """The caller's ``rtol`` and ``atol``, the default tolerance for what they left None."""
    if rtol is not None and atol is not None:
        return Tolerance(rtol=rtol, atol=atol, why="given by the caller")
    default = default_tolerance(out_dtype if out_dtype.name in EPSILON else "float32",
                                scale=scale, reduction_length=reduction_length,
                                matmul_precision=matmul_precision)
    return Tolerance(
        rtol=default.rtol if rtol is None else rtol,
        atol=default.atol if atol is None else atol,
        why=default.why if rtol is None and atol is None else "given by the caller",
    )


@dataclasses.dataclass(frozen=True)
class _ElementErrors:
    """Each element's error against ``tolerance``: where both are finite, the difference;
    a NaN or Inf where the other side has none (or another Inf) is a mismatch of its own."""

    difference: np.ndarray  # |actual - expected| where both are finite, else 0
    finite: np.ndarray
    special: np.ndarray  # NaN or Inf at different places
    mismatched: np.ndarray
    count: int
    worst: float  # in units of the tolerance

    @classmethod
    def of(cls, a: np.ndarray, e: np.ndarray, tolerance: Tolerance) -> _ElementErrors:
        a_nan, e_nan = np.isnan(a), np.isnan(e)
        a_inf, e_inf = np.isinf(a), np.isinf(e)
        special = (a_nan != e_nan) | ((a_inf | e_inf) & ~(a_nan | e_nan) & (a != e))
        finite = np.isfinite(e) & np.isfinite(a)
        with np.errstate(invalid="ignore", over="ignore"):
            difference = np.where(finite, np.abs(a - e), 0.0)
        bound = tolerance.bound(np.where(finite, e, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            in_units = np.where(difference > 0,
                                difference / np.where(bound > 0, bound, np.nan), 0.0)
        in_units = np.where(np.isnan(in_units), np.inf, in_units)
        in_units = np.where(special, np.inf, in_units)
        mismatched = (difference > bound) | special
        return cls(difference, finite, special, mismatched,
                   int(np.count_nonzero(mismatched)),
                   float(np.max(in_units)) if a.size else 0.0)


def _worst_differences(a: np.ndarray, e: np.ndarray, errors: _ElementErrors) -> list[str]:
    """The failure's lines on the NaN or Inf out of place and the worst differences."""
    lines = []
    special_count = int(np.count_nonzero(errors.special))
    if special_count:
        first = int(np.flatnonzero(errors.special)[0])
        lines.append(
            f"NaN/Inf at different places: {special_count} elements, first at index "
            f"{_format_index(first, a.shape)}: actual {_format_value(a.flat[first])}, "
            f"expected {_format_value(e.flat[first])}"
        )
    if np.any(errors.finite):
        finite, difference = errors.finite, errors.difference
        worst_abs = int(np.argmax(difference))
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = np.where(finite & (e != 0), difference / np.abs(e), 0.0)
            relative = np.where(finite & (e == 0) & (difference > 0), np.inf, relative)
        worst_rel = int(np.argmax(relative))
        lines.append(
            f"Worst absolute difference: {difference.flat[worst_abs]:.6g} at index "
            f"{_format_index(worst_abs, a.shape)}: actual {_format_value(a.flat[worst_abs])}, "
            f"expected {_format_value(e.flat[worst_abs])}"
        )
        lines.append(
            f"Worst relative difference: {relative.flat[worst_rel]:.6g} at index "
            f"{_format_index(worst_rel, a.shape)}: actual {_format_value(a.flat[worst_rel])}, "
            f"expected {_format_value(e.flat[worst_rel])}"
        )
    return lines


def _compare_exact(actual: np.ndarray, expected: np.ndarray, header: str,
                   blocks: mismatch.Blocks,
                   without_step: Mapping[str, Any] | None = None) -> Comparison:
    if actual.dtype != expected.dtype and actual.dtype.itemsize == expected.dtype.itemsize:
        expected = expected.astype(actual.dtype)
    if np.issubdtype(actual.dtype, np.inexact) or actual.dtype.name in EPSILON:
        # Bit for bit: NaN payloads and signed zeros count.
        mismatched = bitwise_differences(actual, expected.astype(actual.dtype))
    else:
        mismatched = actual != expected
    count = int(np.count_nonzero(mismatched))
    if count == 0:
        return Comparison(True, 0.0, Tolerance(0.0, 0.0, "exact"), "")
    first = int(np.flatnonzero(mismatched)[0])
    size = actual.size
    lines = [
        f"Arrays are not equal: {header} must match exactly.",
        f"Mismatched elements: {count} / {size} ({100.0 * count / size:.3g}%)",
        f"First mismatch at index {_format_index(first, actual.shape)}: "
        f"actual {actual.flat[first].item()!r}, expected {expected.flat[first].item()!r}",
        "Tolerance: exact (integer or bit-for-bit output)",
    ]
    lines += _pattern(actual, expected, mismatched, Tolerance(0.0, 0.0, "exact"), blocks,
                      without_step)
    if np.issubdtype(actual.dtype, np.inexact) or actual.dtype.name in EPSILON:
        lines += _nan_where_finite_hint(actual.astype(np.float64), expected.astype(np.float64))
    return Comparison(False, math.inf, Tolerance(0.0, 0.0, "exact"), "\n".join(lines))


def _pattern(actual: np.ndarray, expected: np.ndarray, mismatched: np.ndarray,
             tolerance: Tolerance, blocks: mismatch.Blocks,
             without_step: Mapping[str, Any] | None) -> list[str]:
    """The mismatch pattern's lines; a failure of that analysis never hides the mismatch."""
    try:
        return mismatch.diagnose(actual, expected, mismatched, rtol=tolerance.rtol,
                                 atol=tolerance.atol, blocks=blocks, without_step=without_step)
    except Exception as error:  # the comparison's verdict stands without the pattern
        return [f"(mismatch pattern not analysed: {type(error).__name__}: {error})"]


def _nan_where_finite_hint(actual: np.ndarray, expected: np.ndarray) -> list[str]:
    """The uninitialised-read hint, as lines, if ``actual`` has NaN where ``expected`` is finite."""
    count = int(np.count_nonzero(np.isnan(actual) & np.isfinite(expected)))
    hint = uninitialized_read_hint(count) if count else None
    return [hint] if hint else []


def _leaves(tree: Any) -> tuple[list[tuple[str, Any]], Any]:
    import jax  # lazy: importable from a conftest, before JAX starts

    paths_and_leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in paths_and_leaves], treedef


# The matmul precision of the backend the current test runs on: the plugin sets it
# while a Pallas test runs (a TPU rounds float32 dot operands to bfloat16), so a
# test's assert_allclose needs no backend-specific argument.
_BACKEND_MATMUL_PRECISION: contextvars.ContextVar[str] = contextvars.ContextVar(
    "pallas_backend_matmul_precision", default="float32")


@contextlib.contextmanager
def backend_matmul_precision(precision: str):
    """Within the block, ``assert_allclose`` defaults to ``matmul_precision=precision``."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul precision {precision!r} must be one of "
                         f"{', '.join(MATMUL_PRECISIONS)}")
    token = _BACKEND_MATMUL_PRECISION.set(precision)
    try:
        yield
    finally:
        _BACKEND_MATMUL_PRECISION.reset(token)


# While a Pallas test runs (on any backend): the titles of the kernels it has traced, so a
# failure's hint can name the error model of the op that produced the output.
_TRACED_KERNELS: contextvars.ContextVar[Callable[[], Sequence[str]] | None] = (
    contextvars.ContextVar("pallas_traced_kernels", default=None))


@contextlib.contextmanager
def traced_kernels(titles: Callable[[], Sequence[str]] | None):
    """Within the block, a failure's error-model hint may name the op of these kernels
    (``titles`` gives those the running test has traced so far)."""
    token = _TRACED_KERNELS.set(titles)
    try:
        yield
    finally:
        _TRACED_KERNELS.reset(token)


def traced_kernel_titles() -> list[str]:
    """The titles of the kernels the running Pallas test has traced; [] outside one."""
    titles = _TRACED_KERNELS.get()
    return list(dict.fromkeys(titles())) if titles is not None else []


# While a Pallas test runs interpreted on the CPU: the names of the kernels it has traced.
# Both interpreters fill memory a kernel has not written with NaN, so a NaN where the
# reference is finite most likely comes from a kernel reading such memory.
_INTERPRETED_KERNELS: contextvars.ContextVar[Callable[[], Sequence[str]] | None] = (
    contextvars.ContextVar("pallas_interpreted_kernels", default=None))


@contextlib.contextmanager
def interpreted_kernels(names: Callable[[], Sequence[str]] | None):
    """Within the block, a NaN where the reference is finite is explained as an uninitialised read.

    ``names`` gives the kernels the test has run so far, as a failure names them; None
    turns the explanation off.
    """
    token = _INTERPRETED_KERNELS.set(names)
    try:
        yield
    finally:
        _INTERPRETED_KERNELS.reset(token)


def without_uninitialized_read_hint():
    """Within the block, a NaN where the reference is finite is not explained (the caller
    finds the cause itself)."""
    return interpreted_kernels(None)


def uninitialized_read_hint(count: int) -> str | None:
    """What ``count`` NaN where the reference is finite mean in interpret mode; None outside."""
    names = _INTERPRETED_KERNELS.get()
    return None if names is None else describe_uninitialized_read(count, names())


class GpuKernelName(str):
    """The name of a Mosaic GPU kernel that ran in JAX's GPU interpreter (NaN-poisoned SMEM
    and GMEM), among the names :func:`interpreted_kernels` gives."""


def describe_uninitialized_read(count: int | None, kernels: Sequence[str]) -> str:
    """The paragraph that explains a NaN in interpret mode, naming ``kernels``.

    ``count`` is how many NaN sit where the reference is finite; None when only
    the failure's text is known (a comparator other than ``assert_allclose``).
    """
    from .checks.violations import UNINITIALIZED_READ, UNINITIALIZED_READ_FIX  # lazy: as jax above

    kernels = list(dict.fromkeys(kernels))
    what = (f"{count} NaN where the reference is finite" if count is not None
            else "the failure shows NaN")
    if kernels and all(isinstance(name, GpuKernelName) for name in kernels):
        return (
            f"pallas: {what}. JAX's GPU interpreter fills SMEM and GMEM a kernel has not "
            f"written with NaN, so the likely cause is in Mosaic GPU kernel {', '.join(kernels)}: "
            "an SMEM tile read before the TMA copy into it arrived (plgpu.barrier_wait), a "
            "scratch buffer read before it is written, or an output never written. "
            "--pallas-detect-races finds reads that race with a copy or another thread."
        )
    which = f"kernel {', '.join(kernels)}" if kernels else "a kernel this test ran"
    return (
        f"pallas: {what}. Interpret mode fills memory a "
        "kernel has not written with NaN, so the likely cause is TPU rule "
        f"[{UNINITIALIZED_READ}] in {which}: an accumulator read before it is initialised, an "
        "output element never written, or a DMA destination read before its .wait(). "
        f"Fix: {UNINITIALIZED_READ_FIX} To confirm, call the function through "
        "pytest_pallas.check_uninitialized_reads(fn, *args); --pallas-detect-races finds DMA races."
    )


def assert_allclose(
    actual: Any,
    expected: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    reduction_length: int | None = None,
    matmul_precision: str | None = None,
    dtype: Any = None,
    exact: bool | None = None,
    block_shape: Sequence[int | None] | None = None,
    without_step: Mapping[str, Any] | None = None,
    op: str | None = None,
    inputs: Sequence[Any] | None = None,
    op_params: dict[str, Any] | None = None,
) -> float:
    """Assert that ``actual`` matches ``expected`` within the dtype-aware default tolerance.

    Works on arrays and on pytrees of arrays (same structure). NaN and +-Inf
    must sit at the same places. Returns the worst error in units of the
    tolerance (<= 1.0), which the conformance report prints.
    ``matmul_precision`` (which widens the allowance of a reduction) defaults to
    the precision of the backend the test runs on (``dtypes.MATMUL_PRECISIONS``).
    ``op``, ``inputs`` and ``op_params`` judge by the error model the conformance suite
    judges that op by (``ops.registry.op_error_model``): its allowance, the precision of its
    inner matmul, and its reduction length and exactness where the call does not give them;
    which ops have one and the arguments each takes: docs/comparator.md. A failure ends with the
    pattern of its mismatches, located in blocks of ``block_shape`` (else the output
    BlockSpec of the kernel the test traced, else (8, 128) tiles); ``without_step`` maps a
    step of a reduction to the expected result without it (docs/comparator.md, "Where
    and how it is wrong").

    >>> import numpy as np
    >>> assert_allclose(np.float32([1.0, 2.0]), np.array([1.0, 2.0])) <= 1.0
    True
    """
    __tracebackhide__ = True
    if matmul_precision is None:
        matmul_precision = _BACKEND_MATMUL_PRECISION.get()
    extra, reason = 0.0, ""
    if op is not None:
        if inputs is None:
            raise ValueError(f"assert_allclose(op={op!r}) needs inputs=(...), the op's "
                             "arguments, to size its error model")
        # The model the conformance suite judges the op by. A reduction length or exactness
        # the call gives wins; the inner matmul's precision is the op's (bfloat16 operands
        # of attention's probabilities times v, with bfloat16 inputs) on any backend.
        model = op_error_model(op, inputs, matmul_precision=matmul_precision, params=op_params)
        extra, reason = model.atol, model.why
        if reduction_length is None:
            reduction_length = model.reduction_length
        if exact is None:
            exact = model.exact
        matmul_precision = model.matmul_precision or matmul_precision
    actual_leaves, actual_tree = _leaves(actual)
    expected_leaves, expected_tree = _leaves(expected)
    if actual_tree != expected_tree:
        raise AssertionError(
            f"Structures differ: actual is {actual_tree}, expected {expected_tree}."
        )
    step_leaves = {}
    for step, tree in (without_step or {}).items():
        leaves, tree_structure = _leaves(tree)
        if tree_structure != expected_tree:
            raise TypeError(f"without_step[{step!r}] is {tree_structure}, expected the structure "
                            f"of expected, {expected_tree}")
        step_leaves[step] = [leaf for _, leaf in leaves]
    worst = 0.0
    failures = []
    failed_worst: list[tuple[str, float]] = []  # (dtype, worst error) of each failed output
    failed_shapes: list[tuple[int, ...]] = []  # and its shape
    for position, ((path, a), (_, e)) in enumerate(zip(actual_leaves, expected_leaves)):
        result = compare_arrays(
            a, e, rtol=rtol, atol=atol, reduction_length=reduction_length,
            matmul_precision=matmul_precision, dtype=dtype, exact=exact, name=path,
            block_shape=block_shape,
            without_step={step: leaves[position] for step, leaves in step_leaves.items()},
            additional_atol=extra, additional_reason=reason,
        )
        worst = max(worst, result.worst_error)
        if not result.passed:
            failures.append(result.message)
            failed_worst.append((np.dtype(getattr(a, "dtype", np.float64)).name,
                                 result.worst_error))
            failed_shapes.append(tuple(np.shape(a)))
    if failures:
        if op is None and rtol is None and atol is None and not exact:
            hint = error_model_hint(failed_worst,
                                    reduction_length_given=reduction_length is not None,
                                    kernels=traced_kernel_titles(),
                                    shapes=failed_shapes)
            failures += [hint] if hint else []
        raise AssertionError("\n\n".join(failures))
    return worst
