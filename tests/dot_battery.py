"""Every form a dot takes, on the kernel's side and on the test's: the battery that
tests/test_dot_forms.py holds to ``pytest_pallas.numerics.DOT_FORMS``, on the CPU (the chip's
rounding in JAX's TPU interpreter and in XLA's CPU dots) and against libtpu's dump of each.

Run as a script (``python tests/dot_battery.py OUT.json`` with libtpu's dump flags in
``LIBTPU_INIT_ARGS``), it compiles each form for a TPU and writes what its dots became.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

F32, BF16 = "float32", "bfloat16"
SHARDS = 4  # the devices of a shard_map form


@dataclasses.dataclass(frozen=True)
class Form:
    """One dot form: ``build(interpret, devices, precision)`` gives ``fn(x, y)``; the dot's
    own operands, before any rounding, are ``operands(x, y)`` (float64), and the float64
    result of the same operands is ``contract(a, b)``."""

    side: str  # "kernel" (Mosaic) or "xla" (the test's own XLA dots)
    build: Callable[..., Callable[[Any, Any], Any]]
    shapes: tuple[tuple[int, ...], tuple[int, ...]]
    dtype: str
    contract: Callable[[Any, Any], Any]
    operands: Callable[[Any, Any], tuple[Any, Any]] = lambda x, y: (x, y)
    in_specs: tuple[Any, Any] | None = None  # a shard_map form's operand shardings


def _swap(a: Any) -> Any:
    return np.swapaxes(a, -1, -2)


def _plus_one_transposed(x: Any, y: Any) -> tuple[Any, Any]:
    return x, _swap(y) + 1.0


def _kernel(body: Callable[..., Any], out_shape: Callable[[Any, Any], tuple[int, ...]],
            wrap: str | None = None) -> Callable[..., Callable[[Any, Any], Any]]:
    def build(interpret: Any, devices: Any, precision: Any = None) -> Callable[[Any, Any], Any]:
        def kernel(x_ref: Any, y_ref: Any, o_ref: Any) -> None:
            o_ref[...] = body(x_ref[...], y_ref[...], precision).astype(o_ref.dtype)

        def call(x: Any, y: Any) -> Any:
            return pl.pallas_call(kernel, interpret=interpret, out_shape=jax.ShapeDtypeStruct(
                out_shape(x, y), jnp.float32))(x, y)

        return _wrapped(call, wrap, devices)
    return build


def _xla(body: Callable[..., Any], wrap: str | None = None) -> Callable[..., Any]:
    def build(interpret: Any, devices: Any, precision: Any = None) -> Callable[[Any, Any], Any]:
        del interpret
        return _wrapped(lambda x, y: body(x, y, precision), wrap, devices)
    return build


def _wrapped(fn: Callable[[Any, Any], Any], wrap: str | None,
             devices: Any) -> Callable[[Any, Any], Any]:
    if wrap == "vmap":
        return jax.vmap(fn)
    if wrap == "shard_map":
        mesh = Mesh(np.array(devices[:SHARDS]), ("i",))
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"),
                                     check_vma=False))
    return fn


def _dot(x: Any, y: Any, precision: Any) -> Any:
    return jnp.dot(x, y, precision=precision)


def _rhs_transposed(x: Any, y: Any, precision: Any) -> Any:
    return lax.dot_general(x, y, (((1,), (1,)), ((), ())), precision=precision)


def _lhs_transposed(x: Any, y: Any, precision: Any) -> Any:
    return lax.dot_general(x, y, (((0,), (0,)), ((), ())), precision=precision)


def _matmul_transposed(x: Any, y: Any, precision: Any) -> Any:
    return jnp.matmul(x, y.T, precision=precision)


def _einsum_batched(x: Any, y: Any, precision: Any) -> Any:
    return jnp.einsum("bij,bkj->bik", x, y, precision=precision)


def _float32_accumulator(x: Any, y: Any, precision: Any) -> Any:
    return jnp.dot(x, y, precision=precision, preferred_element_type=jnp.float32)


def _transposed_plus_one(x: Any, y: Any, precision: Any) -> Any:
    # The fusible-matmul tests' operand (tpu_fusible_matmul_test.py): a bfloat16 transpose
    # and add that XLA fuses into the dot.
    return jnp.dot(x, y.T + 1.0, precision=precision, preferred_element_type=jnp.float32)


def _vector_dot(x: Any, y: Any, precision: Any) -> Any:
    return lax.dot(x, y, precision=precision)


def _rows(x: Any, y: Any) -> tuple[int, ...]:
    return (x.shape[0], y.shape[-1])


SQUARE = ((128, 128), (128, 128))
BATCHED = ((2, 128, 128), (2, 128, 128))
SHARDED = ((SHARDS * 128, 128), (128, 128))

FORMS: dict[str, Form] = {
    "kernel: jnp.dot": Form("kernel", _kernel(_dot, _rows), SQUARE, F32,
                            lambda a, b: a @ b),
    "kernel: dot_general, rhs transposed": Form(
        "kernel", _kernel(_rhs_transposed, lambda x, y: (x.shape[0], y.shape[0])), SQUARE,
        F32, lambda a, b: a @ b.T),
    "kernel: x @ y.T": Form(
        "kernel", _kernel(_matmul_transposed, lambda x, y: (x.shape[0], y.shape[0])), SQUARE,
        F32, lambda a, b: a @ b.T),
    "kernel: dot_general, lhs transposed": Form(
        "kernel", _kernel(_lhs_transposed, lambda x, y: (x.shape[1], y.shape[1])), SQUARE,
        F32, lambda a, b: a.T @ b),
    "kernel: einsum, batched, rhs transposed": Form(
        "kernel", _kernel(_einsum_batched, lambda x, y: (*x.shape[:2], y.shape[1])), BATCHED,
        F32, lambda a, b: a @ _swap(b)),
    "kernel: preferred_element_type=float32": Form(
        "kernel", _kernel(_float32_accumulator, _rows), SQUARE, F32, lambda a, b: a @ b),
    "kernel: bfloat16, y.T + 1 fused into the dot": Form(
        "kernel", _kernel(_transposed_plus_one, lambda x, y: (x.shape[0], y.shape[0])), SQUARE,
        BF16, lambda a, b: a @ b, _plus_one_transposed),
    "kernel: matrix-vector": Form(
        "kernel", _kernel(_dot, lambda x, y: (x.shape[0],)), ((128, 128), (128,)), F32,
        lambda a, b: a @ b),
    "kernel: in vmap": Form(
        "kernel", _kernel(_dot, _rows, wrap="vmap"), BATCHED, F32, lambda a, b: a @ b),
    "kernel: in shard_map": Form(
        "kernel", _kernel(_dot, _rows, wrap="shard_map"), SHARDED, F32, lambda a, b: a @ b,
        in_specs=(P("i"), P())),
    "xla: jnp.dot": Form("xla", _xla(_dot), SQUARE, F32, lambda a, b: a @ b),
    "xla: x @ y.T, the transpose fused into the dot": Form(
        "xla", _xla(_matmul_transposed), SQUARE, F32, lambda a, b: a @ b.T),
    "xla: dot_general, rhs transposed": Form(
        "xla", _xla(_rhs_transposed), SQUARE, F32, lambda a, b: a @ b.T),
    "xla: dot_general, lhs transposed": Form(
        "xla", _xla(_lhs_transposed), SQUARE, F32, lambda a, b: a.T @ b),
    "xla: einsum, batched, rhs transposed": Form(
        "xla", _xla(_einsum_batched), BATCHED, F32, lambda a, b: a @ _swap(b)),
    "xla: preferred_element_type=float32": Form(
        "xla", _xla(_float32_accumulator), SQUARE, F32, lambda a, b: a @ b),
    "xla: bfloat16, y.T + 1 fused into the dot": Form(
        "xla", _xla(_transposed_plus_one), SQUARE, BF16, lambda a, b: a @ b,
        _plus_one_transposed),
    "xla: in vmap": Form("xla", _xla(_dot, wrap="vmap"), BATCHED, F32, lambda a, b: a @ b),
    "xla: in shard_map": Form("xla", _xla(_dot, wrap="shard_map"), SHARDED, F32,
                              lambda a, b: a @ b, in_specs=(P("i"), P())),
    "xla: lax.dot of two vectors": Form("xla", _xla(_vector_dot), ((128,), (128,)), F32,
                                        lambda a, b: a @ b),
    "xla: matrix-vector": Form("xla", _xla(_vector_dot), ((128, 128), (128,)), F32,
                               lambda a, b: a @ b),
}


def inputs(form: Form, seed: int = 0) -> tuple[Any, Any]:
    """Normal operands of ``form``'s shapes and type."""
    keys = jax.random.split(jax.random.key(seed))
    return tuple(jax.random.normal(key, shape, form.dtype)
                 for key, shape in zip(keys, form.shapes))  # type: ignore[return-value]


def as_float64(a: Any) -> Any:
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def bfloat16_rounded(a: Any) -> Any:
    """A float64 array's values rounded to bfloat16 (to nearest, ties to even)."""
    return as_float64(jnp.asarray(np.asarray(a, np.float32)).astype(jnp.bfloat16))


def references(form: Form, x: Any, y: Any) -> tuple[Any, Any]:
    """The float64 result of ``form`` on its operands rounded to bfloat16, and on its
    operands as they are (float32 products)."""
    a, b = form.operands(as_float64(x), as_float64(y))
    return (form.contract(bfloat16_rounded(a), bfloat16_rounded(b)), form.contract(a, b))


# --- Compiled for a TPU, in a process whose libtpu dumps (LIBTPU_INIT_ARGS) ----------------


def _compile_and_read(form: Form, precision: Any, devices: Any, info: Any,
                      dump: str) -> dict[str, Any]:
    from pytest_pallas._compat.libtpu_dump import dot_instructions
    from pytest_pallas.checks.chip_tracing import tracing_for_chip

    for name in os.listdir(dump):
        path = os.path.join(dump, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    if form.in_specs is None:
        shardings = [SingleDeviceSharding(devices[0])] * 2
    else:
        mesh = Mesh(np.array(devices[:SHARDS]), ("i",))
        shardings = [NamedSharding(mesh, spec) for spec in form.in_specs]
    args = [jax.ShapeDtypeStruct(shape, form.dtype, sharding=sharding)
            for shape, sharding in zip(form.shapes, shardings)]
    with tracing_for_chip(devices[0].device_kind, info):  # Mosaic asks for the chip's tiling
        jax.jit(form.build(False, devices, precision)).lower(*args).compile()
    return dataclasses.asdict(dot_instructions(dump))


def main(out: str, dump: str, chip: str = "v5e") -> None:
    from pytest_pallas.backend import chip_info
    from pytest_pallas.checks import compile_check

    compile_check.quiet_libtpu_environment()
    devices, info = compile_check.topology_devices(chip, SHARDS), chip_info(chip)
    emitted = {}
    for name, form in FORMS.items():
        emitted[name] = {"default": _compile_and_read(form, None, devices, info, dump)}
        if form.dtype == F32:
            emitted[name]["highest"] = _compile_and_read(form, lax.Precision.HIGHEST,
                                                         devices, info, dump)
    with open(out, "w") as file:
        json.dump({"libtpu": compile_check.libtpu_version(), "chip": chip, "forms": emitted},
                  file)


if __name__ == "__main__":
    main(*sys.argv[1:])
