"""Pallas kernels inside ``jax.experimental.custom_partitioning``, in JAX's interpreters.

A kernel a library wraps in ``custom_partitioning`` (so that a sharded ``jax.jit`` runs it
per shard) could not be interpreted, at jax 0.10.2 and 0.12.0.1 alike:

- XLA's SPMD partitioner calls the ``partition`` rule, and traces the ``lower_fn`` it
  returns, on a thread of its own, where the forced interpret mode
  (``pltpu.force_tpu_interpret_mode``, a thread's own setting) is not in force: the kernel
  was lowered for the TPU ("Only interpret mode is supported on CPU backend").
- An interpreted kernel carries the TPU interpreter's ordered IO effect (its kernels run one
  at a time). ``custom_partitioning`` drops its body's effects (its abstract evaluation
  declares none), so the lowering found no token for that effect and stopped at
  ``KeyError: OrderedIOEffect``.

Inside :func:`partitioned_kernels_interpreted`, the ``partition`` rule and its ``lower_fn``
run in the interpret mode in force where the call was lowered. On one device (or inside a
``shard_map``) the body is lowered into the caller's program, and a body whose only ordered
effects are TPU-interpreted kernels gets a fresh token for them: its kernels are ordered
among themselves, and each kernel's callbacks by its own data. On several devices the
partitioned body is a program of its own, lowered with no token, whose host callbacks XLA
does not keep (any ``io_callback`` there crashed the process, jax 0.10.2): such a kernel
raises :class:`~._compat.jax_internals.InterpreterLimit` before it is lowered, a limit of
JAX's that the plugin answers by running the test again in the plain interpreter. A body with
an ordered effect of the test's own (``io_callback(..., ordered=True)``) is left to JAX,
which refuses it on the chip too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
from collections.abc import Iterator
from typing import Any

from jax.experimental.pallas import tpu as pltpu

from .jax_internals import (
    InterpreterLimit,
    JaxInternalsChanged,
    attributes_replaced,
    mesh_kernel_primitive_names,
    private_attribute,
)

_CUSTOM_PARTITIONING = "jax._src.custom_partitioning"

PARTITIONED_ON_SEVERAL_DEVICES = (
    "JAX's TPU interpreter cannot run a kernel inside a custom_partitioning body partitioned "
    "over several devices: JAX lowers that body with no token for the interpreter's ordered "
    "effect (KeyError: OrderedIOEffect), and XLA does not keep the host callbacks it is made "
    "of")
_MLIR = "jax._src.interpreters.mlir"

# Lowerings on this thread that may take a fresh token for the interpreter's ordered effect.
_fresh_tokens = threading.local()


@contextlib.contextmanager
def partitioned_kernels_interpreted() -> Iterator[bool]:
    """Inside the block, a Pallas kernel in a ``custom_partitioning`` body runs in the
    interpreter the test forces (see the module docstring). Yields False where
    ``custom_partitioning``, its lowering or JAX's tokens moved."""
    try:
        module = private_attribute(_CUSTOM_PARTITIONING)
        mlir = private_attribute(_MLIR)
        info_class = module._ShardingCallbackInfo
        primitive = module.custom_partitioning_p
        entry = mlir._lowerings[primitive]
        token_set = mlir.TokenSet
        original_get = token_set.get
        ordered_effect = private_attribute("jax._src.callback", "_OrderedIOEffect")
        forced_mode = private_attribute("jax._src.config",
                                        "pallas_tpu_interpret_mode_context_manager")
        original_init = info_class.__init__
        init_signature = inspect.signature(original_init)
        if "partition" not in init_signature.parameters or not hasattr(entry, "rule"):
            raise AttributeError("custom_partitioning's callback info changed shape")
    except (JaxInternalsChanged, AttributeError, KeyError, ImportError, TypeError,
            ValueError):
        yield False
        return

    build_helper = mlir.build_mlir_module_helper

    def keeping_mode(self: Any, *args: Any, **kwargs: Any) -> None:
        # Runs where the call is lowered, on the test's thread: the mode to carry over.
        bound = init_signature.bind(self, *args, **kwargs)
        forced = forced_mode.value
        if forced is not None and callable(bound.arguments["partition"]):
            bound.arguments["partition"] = _partition_in_mode(
                bound.arguments["partition"], forced, pltpu.force_tpu_interpret_mode)
        original_init(*bound.args, **bound.kwargs)

    def get(self: Any, effect: Any) -> Any:
        __tracebackhide__ = True
        if (effect is ordered_effect and getattr(_fresh_tokens, "depth", 0)
                and effect not in self.effects()):
            return mlir.create_token()
        return original_get(self, effect)

    def build_mlir_module_helper(closed_jaxpr: Any, *args: Any, **kwargs: Any) -> Any:
        if _ordered_by_interpreted_kernels_only(closed_jaxpr, ordered_effect):
            raise InterpreterLimit(PARTITIONED_ON_SEVERAL_DEVICES)
        return build_helper(closed_jaxpr, *args, **kwargs)

    def lowering_rule(ctx: Any, *values: Any, call: Any, **params: Any) -> Any:
        with _fresh_tokens_if(_ordered_by_interpreted_kernels_only(call, ordered_effect)):
            return entry.rule(ctx, *values, call=call, **params)

    functools.update_wrapper(build_mlir_module_helper, build_helper)
    functools.update_wrapper(lowering_rule, entry.rule)
    try:
        with (attributes_replaced(info_class, {"__init__": keeping_mode}),
              attributes_replaced(token_set, {"get": get}),
              attributes_replaced(mlir, {"build_mlir_module_helper": build_mlir_module_helper})):
            mlir._lowerings[primitive] = dataclasses.replace(entry, rule=lowering_rule)
            yield True
    finally:
        mlir._lowerings[primitive] = entry


def _partition_in_mode(partition: Any, forced: Any, force_mode: Any) -> Any:
    """``partition``, and the ``lower_fn`` it returns, run with ``forced`` as the interpret
    mode, on whichever thread XLA calls them."""

    @functools.wraps(partition)
    def in_mode(*args: Any, **kwargs: Any) -> Any:
        with force_mode(forced):
            result = partition(*args, **kwargs)
        # (mesh, lower_fn, result sharding, argument shardings)
        if not (isinstance(result, tuple) and len(result) == 4 and callable(result[1])):
            return result
        lower_fn = result[1]

        @functools.wraps(lower_fn)
        def lowered_in_mode(*lower_args: Any, **lower_kwargs: Any) -> Any:
            with force_mode(forced):
                return lower_fn(*lower_args, **lower_kwargs)

        return (result[0], lowered_in_mode, *result[2:])

    return in_mode


@contextlib.contextmanager
def _fresh_tokens_if(allowed: bool) -> Iterator[None]:
    if not allowed:
        yield
        return
    _fresh_tokens.depth = getattr(_fresh_tokens, "depth", 0) + 1
    try:
        yield
    finally:
        _fresh_tokens.depth -= 1


_KERNEL_PRIMITIVES = ("pallas_call", *mesh_kernel_primitive_names())


def _ordered_by_interpreted_kernels_only(closed_jaxpr: Any, ordered_effect: Any) -> bool:
    """Whether ``closed_jaxpr`` has the ordered IO effect, and only from kernels run in JAX's
    TPU interpreter (whose ``interpret=`` is a ``pltpu.InterpretParams``)."""
    def only_kernels(jaxpr: Any) -> bool:
        found = False
        for equation in getattr(jaxpr, "eqns", ()):
            if ordered_effect not in equation.effects:
                continue
            if equation.primitive.name in _KERNEL_PRIMITIVES:
                if not isinstance(equation.params.get("interpret"), pltpu.InterpretParams):
                    return False
                found = True
                continue
            ordered_inside = [sub for sub in _sub_jaxprs(equation.params)
                              if ordered_effect in getattr(sub, "effects", ())]
            if not ordered_inside or not all(map(only_kernels, ordered_inside)):
                return False  # an ordered effect of the test's own
            found = True
        return found

    return only_kernels(getattr(closed_jaxpr, "jaxpr", closed_jaxpr))


def _sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            jaxpr = getattr(item, "jaxpr", item)
            if hasattr(jaxpr, "eqns"):
                yield jaxpr
