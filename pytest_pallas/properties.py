"""The properties every implementation of an op must have, checked on one ``Case`` at a time.

Each check calls the implementation the way the contract says (under
``jax.jit``; inside ``shard_map`` for ``ppermute``; under ``jax.vmap`` for the
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

import numpy as np

from . import error_models
from .compare import compare_arrays
from .op_inputs import Case
from .ops import get_operation

VMAP_OPS = ("add", "sum", "matmul", "matmul_activation", "softmax", "attention", "copy")


def _activation(name: str | None) -> Callable | None:
    if name is None:
        return None
    import jax

    return getattr(jax.nn, name)


def _call_kwargs(case: Case) -> dict[str, Any]:
    kwargs = dict(case.kwargs)
    if case.op == "matmul_activation":
        kwargs["activation"] = _activation(kwargs["activation"])
    return kwargs


def expected_output(case: Case) -> np.ndarray:
    """The float64 (or exact integer) oracle result for ``case``."""
    op = get_operation(case.op)
    oracle = op.load_oracle()
    if case.op == "ppermute":
        blocks = np.split(case.args[0], case.dims["devices"], axis=0)
        return np.concatenate(list(oracle(blocks, case.kwargs["shift"])), axis=0)
    return np.asarray(oracle(*case.args, **_call_kwargs(case)))


def run(implementation: Callable, case: Case) -> Any:
    """Call ``implementation`` on ``case`` as the contract says; return the raw result."""
    import jax

    if case.op == "ppermute":
        return _run_ppermute(implementation, case)
    function = jax.jit(functools.partial(implementation, **_call_kwargs(case)))
    result = function(*case.args)
    return jax.block_until_ready(result)


def _run_ppermute(implementation: Callable, case: Case) -> Any:
    import jax
    from jax.sharding import Mesh, PartitionSpec

    count = case.dims["devices"]
    devices = jax.devices()
    if count > len(devices):
        import pytest

        pytest.skip(f"ppermute on {count} devices: JAX sees {len(devices)}; run with "
                    f"--pallas-devices={count}")
    mesh = Mesh(np.array(devices[:count]), ("ring",))
    body = functools.partial(implementation, axis_name="ring", shift=case.kwargs["shift"])
    sharded = jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("ring"),
                            out_specs=PartitionSpec("ring"), check_vma=False)
    return jax.block_until_ready(jax.jit(sharded)(*case.args))


def describe_output(result: Any) -> str:
    try:
        import jax

        kind = "jax.Array" if isinstance(result, jax.Array) else type(result).__name__
    except ImportError:  # pragma: no cover - jax is a dependency
        kind = type(result).__name__
    if hasattr(result, "shape") and hasattr(result, "dtype"):
        return f"a {kind} of shape {tuple(result.shape)} and dtype {result.dtype}"
    text = repr(result)
    return f"a {kind} {text[:80] + '...' if len(text) > 80 else text}"


def output_type_problem(case: Case, result: Any) -> str:
    """'' when the result is a jax.Array of the contract's shape and dtype, else what is wrong."""
    import jax

    expected_shape = expected_shape_of(case)
    wanted = f"a jax.Array of shape {expected_shape} and dtype {case.dtype}"
    if not isinstance(result, jax.Array):
        return (f"{case.op} returned {describe_output(result)}; the contract expects {wanted} "
                f"(signature {get_operation(case.op).signature}).")
    if tuple(result.shape) != expected_shape or str(result.dtype) != case.dtype:
        return f"{case.op} returned {describe_output(result)}; the contract expects {wanted}."
    return ""


def expected_shape_of(case: Case) -> tuple[int, ...]:
    d = case.dims
    shapes = {
        "add": lambda: tuple(d["shape"]),
        "sum": lambda: (d["r"], d["c"]),
        "matmul": lambda: (d["m"], d["n"]),
        "matmul_activation": lambda: (d["m"], d["n"]),
        "batched_matmul": lambda: (d["b"], d["m"], d["n"]),
        "softmax": lambda: (d["rows"], d["cols"]),
        "copy": lambda: (d["rows"], d["cols"]),
        "attention": lambda: (d["s"], d["d"]),
        "mha": lambda: (d["b"], d["h"], d["s"], d["d"]),
        "mqa": lambda: (d["b"], d["h"], d["s"], d["d"]),
        "ppermute": lambda: (d["devices"] * d["rows"], d["cols"]),
    }
    return shapes[case.op]()


def matmul_precision_for(case: Case, backend_precision: str) -> str:
    # Attention multiplies probabilities rounded to the input dtype by v (as
    # JAX's own flash attention does): with bfloat16 inputs that second matmul
    # has bfloat16 operands wherever it runs.
    if case.op in ("attention", "mha", "mqa") and case.dtype == "bfloat16":
        return "bfloat16"
    return backend_precision


def op_allowance(case: Case, backend_precision: str) -> tuple[float, str]:
    """The error a correct kernel of ``case.op`` cannot avoid (``error_models``), as an atol."""
    if case.op not in error_models.KNOWN_OPS:
        return 0.0, ""
    return error_models.op_allowance(case.op, case.args, matmul_precision=backend_precision,
                                     params=case.kwargs)


def introduced_nonfinite(actual: Any, expected: np.ndarray) -> np.ndarray:
    """Where ``actual`` has NaN or Inf and the oracle's ``expected`` is finite."""
    return ~np.isfinite(np.asarray(actual, np.float64)) & np.isfinite(expected)


def judge_value(case: Case, result: Any, expected: np.ndarray, *,
                matmul_precision: str) -> tuple[dict[str, bool], float, str]:
    """Judge shape/dtype, finiteness and value of one result.

    Returns the verdict per property, the worst error in tolerances and the
    failure message ('' when every property holds).
    """
    op = get_operation(case.op)
    actual = np.asarray(result)
    verdicts = {"shape_dtype": True, "finite": True, "value": True}
    if np.issubdtype(expected.dtype, np.floating):
        introduced = introduced_nonfinite(actual, expected)
        if np.any(introduced):
            verdicts["finite"] = False
    precision = matmul_precision_for(case, matmul_precision)
    extra, reason = op_allowance(case, matmul_precision)
    comparison = compare_arrays(
        actual, expected, reduction_length=case.reduction_length,
        matmul_precision=precision,
        exact=True if op.exact or case.dtype == "int32" else None,
        additional_atol=extra, additional_reason=reason,
    )
    if not comparison.passed:
        verdicts["value"] = False
    message = comparison.message
    if not verdicts["finite"]:
        first = tuple(int(i) for i in np.argwhere(introduced)[0])
        message = (f"{case.op} produced NaN or Inf where the oracle is finite "
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
