"""TPU 7x's explicit MXU (``pltpu.matmul_push_rhs``, ``matmul_acc_lhs``, ``matmul_pop``) in
JAX's TPU interpreter, which has no rule for them ("MLIR translation rule for primitive
'matmul_push_rhs' not found for platform cpu").

The MXU's state lives on the host while a kernel runs, as its docstrings describe it: each
MXU has staging registers a right-hand side is pushed to (transposed if asked), the weights
``matmul_acc_lhs`` loads from one of them, and accumulators addressed by ``acc_addr``, to which
each ``matmul_acc_lhs`` adds ``lhs @ weights`` and from which ``matmul_pop`` takes the sum,
zeroing it (an accumulator never added to reads zero). The product itself is a
``jnp.matmul`` in the kernel, so a float32 one rounds as the run's chip numbers round every
kernel dot (contract §10). Checked against JAX's own
``ExplicitMXUTest`` (tests/pallas/tpu_pallas_test.py), which holds the explicit MXU to a
``jnp.matmul`` in a kernel bit for bit; the chip's order within a pass: unchecked.

The API is jax 0.10's and 0.11's (accumulators addressed by number); JAX 0.12's accumulator
refs are not supplied, and its kernels skip as before. The host calls are ordered
``io_callback``s, which XLA runs on threads of its own: the state
is one for the process, so kernels on several simulated devices at once would share it (a
limit: JAX's tests run the explicit MXU on one device).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from .jax_internals import JaxInternalsChanged, private_attribute

_PRIMITIVES_MODULE = "jax._src.pallas.mosaic.primitives"
_INTERPRETER_MODULE = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"

# The side of the square right-hand side the MXU takes (matmul_push_rhs: "Must be 256x256").
RHS_SIDE = 256


class ExplicitMxuMisuse(RuntimeError):
    """A kernel used the explicit MXU as its docstrings do not allow (push to a staging
    register twice, load an empty one, multiply with no right-hand side loaded, ...)."""


class _Mxus:
    def __init__(self) -> None:
        self.staged: dict[tuple[int, int], Any] = {}  # (mxu, staging register) -> rhs
        self.weights: dict[int, Any] = {}  # mxu -> the loaded rhs
        self.accumulators: dict[tuple[int, int], Any] = {}  # (mxu, acc_addr) -> sum

    def clear(self) -> None:
        for held in (self.staged, self.weights, self.accumulators):
            held.clear()


_MXUS = _Mxus()


def _stage(rhs: Any, *, mxu: int, register: int) -> None:
    if (mxu, register) in _MXUS.staged:
        raise ExplicitMxuMisuse(
            f"matmul_push_rhs to staging register {register} of MXU {mxu}, which already "
            "holds a right-hand side: load it with matmul_acc_lhs(load_staged_rhs=...) first")
    _MXUS.staged[(mxu, register)] = np.asarray(rhs)


def _load(*, mxu: int, register: int) -> None:
    staged = _MXUS.staged.pop((mxu, register), None)
    if staged is None:
        raise ExplicitMxuMisuse(
            f"matmul_acc_lhs(load_staged_rhs={register}) on MXU {mxu}, whose staging "
            "register is empty: push a right-hand side to it with matmul_push_rhs first")
    _MXUS.weights[mxu] = staged


def _weights(*, mxu: int, dtype: Any) -> Any:
    weights = _MXUS.weights.get(mxu)
    if weights is None:
        raise ExplicitMxuMisuse(f"matmul_acc_lhs on MXU {mxu}, which has no right-hand side "
                                "loaded: pass load_staged_rhs= once after matmul_push_rhs")
    if weights.dtype != np.dtype(dtype):
        raise ExplicitMxuMisuse(
            f"matmul_acc_lhs with a {np.dtype(dtype)} left-hand side on MXU {mxu}, whose "
            f"right-hand side is {weights.dtype}: the interpreter multiplies only one dtype")
    return weights


def _accumulate(product: Any, *, mxu: int, address: int) -> None:
    total = _MXUS.accumulators.get((mxu, address))
    _MXUS.accumulators[(mxu, address)] = (np.array(product) if total is None
                                          else total + np.asarray(product))


def _pop(*, mxu: int, address: int, shape: tuple[int, int], dtype: Any) -> Any:
    total = _MXUS.accumulators.pop((mxu, address), None)
    if total is None:  # an accumulator starts at zero, as matmul_pop leaves it
        return np.zeros(shape, np.dtype(dtype))
    if tuple(total.shape) != tuple(shape):
        raise ExplicitMxuMisuse(
            f"matmul_pop of a {tuple(shape)} result from accumulator {address} on MXU {mxu}, "
            f"which holds a {tuple(total.shape)} one")
    return total.astype(np.dtype(dtype))


def _host(function: Any, result: Any, *args: Any, **params: Any) -> Any:
    return io_callback(functools.partial(function, **params), result, *args, ordered=True)


def _push_rhs(rhs: Any, *, staging_register: int, mxu_index: int, transpose: bool) -> list:
    _host(_stage, None, rhs.T if transpose else rhs, mxu=mxu_index, register=staging_register)
    return []


def _acc_lhs(lhs: Any, *, acc_addr: int, mxu_index: int, load_staged_rhs: int | None) -> list:
    if load_staged_rhs is not None:
        _host(_load, None, mxu=mxu_index, register=load_staged_rhs)
    weights = _host(_weights, jax.ShapeDtypeStruct((lhs.shape[-1], RHS_SIDE), lhs.dtype),
                    mxu=mxu_index, dtype=lhs.dtype)
    accumulated = jnp.int32 if jnp.issubdtype(lhs.dtype, jnp.integer) else jnp.float32
    product = jnp.matmul(lhs, weights, preferred_element_type=accumulated)
    _host(_accumulate, None, product, mxu=mxu_index, address=acc_addr)
    return []


def _pop_acc(*, acc_addr: int, shape: tuple[int, int], dtype: Any, mxu_index: int) -> Any:
    return _host(_pop, jax.ShapeDtypeStruct(tuple(shape), dtype), mxu=mxu_index,
                 address=acc_addr, shape=tuple(shape), dtype=dtype)


_IMPLEMENTATIONS = {
    "matmul_push_rhs_p": _push_rhs,
    "matmul_acc_lhs_p": _acc_lhs,
    "matmul_pop_p": _pop_acc,
}


def addressed_accumulators(primitives: Any = None) -> bool:
    """Whether this JAX's explicit MXU addresses its accumulators by number
    (``matmul_acc_lhs(acc_addr=...)``, jax 0.10 and 0.11), the API supplied here. JAX 0.12
    passes accumulator refs instead and adds FIFO primitives."""
    if primitives is None:
        try:
            primitives = private_attribute(_PRIMITIVES_MODULE)
        except JaxInternalsChanged:
            return False
    function = getattr(primitives, "matmul_acc_lhs", None)
    try:
        return function is not None and "acc_addr" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


@contextlib.contextmanager
def explicit_mxu_interpreted() -> Iterator[bool]:
    """Inside the block, JAX's TPU interpreter runs the explicit-MXU primitives this JAX has
    (registered in its table of primitive implementations, ``_interpret_impls``); yields
    False where this JAX has no such table or primitives."""
    try:
        primitives = private_attribute(_PRIMITIVES_MODULE)
        table = private_attribute(_INTERPRETER_MODULE, "_interpret_impls")
    except JaxInternalsChanged:
        yield False
        return
    if not addressed_accumulators(primitives):
        yield False  # JAX 0.12's accumulator refs (AccMemorySpace): not supplied
        return
    _MXUS.clear()  # nothing a test before left behind (a kernel that failed midway)
    added = []
    for name, implementation in _IMPLEMENTATIONS.items():
        primitive = getattr(primitives, name, None)
        if primitive is not None and primitive not in table:
            table[primitive] = implementation
            added.append(primitive)
    try:
        yield bool(added)
    finally:
        for primitive in added:
            table.pop(primitive, None)
