"""The properties every implementation of an op must have, checked on one ``Case`` at a time.

Each check calls the implementation the way the contract says (under
``jax.jit``; inside ``shard_map`` for a collective op; under ``jax.vmap`` for the
batching property), judges the result and records the outcome per
(op, property) in the run's ``ConformanceRecorder``. A failure raises
``AssertionError`` with a paragraph that says what was expected; an
exception from the implementation propagates unchanged (the user's frames
first) with the input noted by Hypothesis.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from .._compat.xla_cpu_options import fast_compile_options
from ..compare import compare_arrays
from ..ops.inputs import Case
from ..ops.operation import DEVICES, resolve_params


def call_kwargs(case: Case) -> dict[str, Any]:
    """The keyword arguments the implementation and the oracle get (deferred values imported)."""
    return resolve_params(case.kwargs)


def expected_output(case: Case, *, flush_subnormal_inputs: bool = False) -> np.ndarray:
    """The float64 (or exact integer) oracle result for ``case``; with
    ``flush_subnormal_inputs``, of its float inputs with subnormals read as 0."""
    op = case.operation
    oracle = op.load_oracle()
    kwargs = call_kwargs(case)
    if op.collective:
        kwargs[DEVICES] = case.dims[DEVICES]
    return np.asarray(oracle(*oracle_args(case, flush_subnormal_inputs=flush_subnormal_inputs),
                             **kwargs))


def oracle_args(case: Case, *, flush_subnormal_inputs: bool = False) -> tuple[np.ndarray, ...]:
    """The arguments as the oracle gets them: floats in float64 (an exact op's as they are,
    so that a copy is judged bit for bit), integers as drawn."""
    if case.operation.exact:
        return tuple(case.args)
    return tuple(_float64(a, flush_subnormal_inputs) if np.asarray(a).dtype.kind not in "iub"
                 else a for a in case.args)


def _float64(array: Any, flush_subnormals: bool) -> np.ndarray:
    wide = np.asarray(array, np.float64)
    if not flush_subnormals:
        return wide
    tiny = float(ml_dtypes.finfo(np.asarray(array).dtype).tiny)
    return np.where(np.abs(wide) < tiny, 0.0, wide)


def _has_subnormal_inputs(case: Case) -> bool:
    for arg in case.args:
        arg = np.asarray(arg)
        if arg.dtype.kind == "f" or arg.dtype.name == "bfloat16":
            tiny = float(ml_dtypes.finfo(arg.dtype).tiny)
            magnitude = np.abs(arg.astype(np.float64))
            if np.any((magnitude > 0) & (magnitude < tiny)):
                return True
    return False


def judge_against_oracle(case: Case, result: Any, *, matmul_precision: str
                         ) -> tuple[dict[str, bool], float, str, np.ndarray]:
    """``judge_value`` of ``result`` against the oracle, and the oracle's result.

    A TPU (and XLA on the CPU) reads subnormal float inputs as 0, so a correct kernel's
    result on such inputs can be the oracle's of the flushed inputs (an rms_norm of a
    bfloat16 2.8e-40 is 0 on the chip, 2.8e-37 in float64): that result passes too.
    """
    expected = expected_output(case)
    verdicts, worst, message = judge_value(case, result, expected,
                                           matmul_precision=matmul_precision)
    if message and not case.operation.exact and _has_subnormal_inputs(case):
        flushed = expected_output(case, flush_subnormal_inputs=True)
        judged = judge_value(case, result, flushed, matmul_precision=matmul_precision)
        if not judged[2]:
            return (*judged, flushed)
    return verdicts, worst, message, expected


def run(implementation: Callable, case: Case, compiled: dict | None = None) -> Any:
    """Call ``implementation`` on ``case`` as the contract says; return the raw result.

    ``compiled``, if given, keeps the jitted callable per implementation and keyword
    arguments, so that examples of one signature (the sweep's profiles of a dtype, the
    deterministic property's two calls) compile once. The interpreter JAX is forced to
    use is part of jit's cache key, so a plain-interpreted executable never answers for
    a TPU-interpreted call.
    """
    if case.operation.collective:
        return _run_collective(implementation, case)
    function = _jitted(implementation, {**call_kwargs(case), **case.blocks}, compiled)
    result = function(*case.args)
    return jax.block_until_ready(result)


def suite_jit(function: Callable, *, long_run: bool = False) -> Any:
    """``jax.jit(function)`` as the suite compiles an implementation: on the CPU, with XLA's
    options that compile an interpreted kernel fastest (``_compat.xla_cpu_options``);
    ``long_run`` keeps LLVM's optimiser for a program that runs long (a vmapped batch)."""
    return jax.jit(function, compiler_options=fast_compile_options(long_run=long_run) or None)


def _jitted(implementation: Callable, kwargs: dict[str, Any], compiled: dict | None) -> Any:
    try:
        key = (implementation, tuple(sorted(kwargs.items())))
        hash(key)
    except TypeError:  # an unhashable parameter value: compile afresh
        key = None
    if compiled is None or key is None:
        return suite_jit(functools.partial(implementation, **kwargs))
    if key not in compiled:
        compiled[key] = suite_jit(functools.partial(implementation, **kwargs))
    return compiled[key]


# The mesh axis a collective op is called over.
AXIS_NAME = "ring"


def _run_collective(implementation: Callable, case: Case) -> Any:
    return jax.block_until_ready(suite_jit(collective_function(implementation, case))(
        *case.args))


def collective_function(implementation: Callable, case: Case) -> Callable:
    """The collective op's implementation inside ``shard_map`` over the case's devices,
    taking and returning the global arrays."""
    count = case.dims[DEVICES]
    devices = jax.devices()
    if count > len(devices):
        pytest.skip(f"{case.op_name} on {count} devices: JAX sees {len(devices)}; run with "
                    f"--pallas-devices={count}")
    mesh = Mesh(np.array(devices[:count]), (AXIS_NAME,))
    body = functools.partial(implementation, **{case.operation.collective: AXIS_NAME},
                             **call_kwargs(case), **case.blocks)
    specs = tuple(PartitionSpec(AXIS_NAME) for _ in case.args)
    return jax.shard_map(body, mesh=mesh, in_specs=specs,
                         out_specs=PartitionSpec(AXIS_NAME), check_vma=False)


def describe_output(result: Any) -> str:
    try:
        kind = "jax.Array" if isinstance(result, jax.Array) else type(result).__name__
    except ImportError:  # pragma: no cover - jax is a dependency
        kind = type(result).__name__
    if hasattr(result, "shape") and hasattr(result, "dtype"):
        return f"a {kind} of shape {tuple(result.shape)} and dtype {result.dtype}"
    text = repr(result)
    return f"a {kind} {text[:80] + '...' if len(text) > 80 else text}"


def output_type_problem(case: Case, result: Any) -> str:
    """'' when the result is a jax.Array of the contract's shape and dtype, else what is wrong."""
    expected_shape = expected_shape_of(case)
    wanted = f"a jax.Array of shape {expected_shape} and dtype {case.dtype}"
    if not isinstance(result, jax.Array):
        return (f"{case.op_name} returned {describe_output(result)}; the contract expects {wanted} "
                f"(signature {case.operation.signature}).")
    if tuple(result.shape) != expected_shape or str(result.dtype) != case.dtype:
        return f"{case.op_name} returned {describe_output(result)}; the contract expects {wanted}."
    return ""


def expected_shape_of(case: Case) -> tuple[int, ...]:
    return case.operation.result_shape(case.dims)


def introduced_nonfinite(actual: Any, expected: np.ndarray) -> np.ndarray:
    """Where ``actual`` has NaN or Inf and the oracle's ``expected`` is finite."""
    return ~np.isfinite(np.asarray(actual, np.float64)) & np.isfinite(expected)


def judge_value(case: Case, result: Any, expected: np.ndarray, *,
                matmul_precision: str) -> tuple[dict[str, bool], float, str]:
    """Judge shape/dtype, finiteness and value of one result.

    Returns the verdict per property, the worst error in tolerances and the
    failure message ('' when every property holds).
    """
    op = case.operation
    actual = np.asarray(result)
    verdicts = {"shape_dtype": True, "finite": True, "value": True}
    if np.issubdtype(expected.dtype, np.floating):
        introduced = introduced_nonfinite(actual, expected)
        if np.any(introduced):
            verdicts["finite"] = False
    # The op's error model, which assert_allclose(op=...) judges by too.
    model = op.error_model(case, matmul_precision)
    comparison = compare_arrays(
        actual, expected, reduction_length=model.reduction_length,
        matmul_precision=model.matmul_precision, exact=model.exact,
        additional_atol=model.atol, additional_reason=model.why,
    )
    if not comparison.passed:
        verdicts["value"] = False
    message = comparison.message
    if not verdicts["finite"]:
        first = tuple(int(i) for i in np.argwhere(introduced)[0])
        message = (f"{case.op_name} produced NaN or Inf where the oracle is finite "
                   f"({int(introduced.sum())} elements, first at {first}).\n" + message)
    return verdicts, comparison.worst_error, message


def vmapped_case_args(case: Case, batch: int = 2) -> tuple[np.ndarray, ...]:
    """Each argument stacked ``batch`` times along a new leading axis, perturbed per slice."""
    stacked = []
    for arg in case.args:
        slices = [arg]
        for i in range(1, batch):
            if np.issubdtype(arg.dtype, np.integer):
                slices.append((arg.astype(np.int64) * (i + 1) % 1000).astype(arg.dtype))
            else:
                slices.append((arg.astype(np.float64) * (-0.5 * i)).astype(arg.dtype))
        stacked.append(np.stack(slices))
    return tuple(stacked)
