"""The operations of the conformance contract (CONTRACT.md §2).

Each operation names its signature, its dimensions, the dtypes the suite
draws, where its reference kernel and its oracle live, and what its
tolerance depends on. Importing this module is cheap (no JAX): the plugin
validates ``--pallas-impl`` and ``--pallas-ops`` against it at start-up.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Operation:
    name: str
    signature: str
    dimensions: tuple[str, ...]
    dtypes: tuple[str, ...]
    reference: str  # "module:attr" of the reference kernel
    oracle: str  # "module:attr" of the float64 NumPy oracle
    cost: str  # "module:attr" of the cost model (-> pl.CostEstimate)
    reduction_dimension: str | None = None  # widens the tolerance
    exact: bool = False  # integer results and copies compare bit for bit

    def load_reference(self) -> Callable:
        return _load(self.reference)

    def load_oracle(self) -> Callable:
        return _load(self.oracle)

    def load_cost(self) -> Callable:
        return _load(self.cost)


def _load(target: str) -> Callable:
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def _op(name, signature, dimensions, dtypes, module, attr, **kwargs) -> Operation:
    return Operation(
        name=name,
        signature=signature,
        dimensions=dimensions,
        dtypes=dtypes,
        reference=f"reference_kernels.{module}:{attr}",
        oracle=f"reference_kernels.{module}:{attr}_reference",
        cost=f"reference_kernels.{module}:{attr}_cost",
        **kwargs,
    )


FLOATS = ("float32", "bfloat16")

OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        _op("add", "f(x, y)", ("shape",), FLOATS + ("int32",), "elementwise", "add"),
        _op("sum", "f(x)", ("n", "r", "c"), FLOATS, "reduction", "sum_leading_axis",
            reduction_dimension="n"),
        _op("matmul", "f(x, y)", ("m", "k", "n"), FLOATS, "matmul", "matmul",
            reduction_dimension="k"),
        _op("matmul_activation", "f(x, y, *, activation)", ("m", "k", "n"), FLOATS, "matmul",
            "matmul_activation", reduction_dimension="k"),
        _op("batched_matmul", "f(x, y)", ("b", "m", "k", "n"), FLOATS, "matmul",
            "batched_matmul", reduction_dimension="k"),
        _op("softmax", "f(x)", ("rows", "cols"), FLOATS, "softmax", "softmax",
            reduction_dimension="cols"),
        _op("attention", "f(q, k, v)", ("s", "t", "d"), FLOATS, "attention", "attention",
            reduction_dimension="t"),
        _op("mha", "f(q, k, v)", ("b", "h", "s", "t", "d"), FLOATS, "attention", "mha",
            reduction_dimension="t"),
        _op("mqa", "f(q, k, v)", ("b", "h", "s", "t", "d"), FLOATS, "attention", "mqa",
            reduction_dimension="t"),
        _op("copy", "f(x)", ("rows", "cols"), FLOATS + ("int32",), "dma", "copy", exact=True),
        _op("ppermute", "f(x, *, axis_name, shift)", ("devices", "rows", "cols"),
            FLOATS + ("int32",), "collectives", "ppermute", exact=True),
    )
}

OP_NAMES: tuple[str, ...] = tuple(OPERATIONS)


def get_operation(name: str) -> Operation:
    try:
        return OPERATIONS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; the conformance ops are {', '.join(OP_NAMES)}")
