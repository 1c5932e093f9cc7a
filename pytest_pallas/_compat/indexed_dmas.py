"""DMAs indexed by a vector of indices (``x_hbm.at[indices]``) in JAX's TPU interpreter.

A SparseCore kernel gathers and scatters rows with such a DMA (JAX's own SparseCore tests do,
``pltpu.async_copy(x_hbm.at[indices_vmem], ...)``). JAX's TPU interpreter (jax 0.10.2 and
0.12.0.1) reads a DMA's indices as Python integers: a vector of them crashed inside its
``dma_start`` callback ("CpuCallback error ... TypeError: only 0-dimensional arrays can be
converted to Python scalars"), and a ref of them was read as its buffer's id, so the copy
went to the wrong rows (reported as an out-of-bounds access). Inside
:func:`indexed_dmas_named`, such a DMA stops the kernel's tracing first, with one line: in a
SparseCore kernel (where ``_compat.sparsecore`` does not run it, row by row) an
:class:`~._compat.jax_internals.InterpreterLimit` (JAX's limit, not the kernel's bug), in a
TensorCore kernel a ``ValueError`` naming what the TPU compiler
says of it (libtpu 0.0.42.1 for v5e rejects the copy's vector of indices: "'tpu.memref_slice'
op operand #1 must be variadic of 32-bit signless integer").
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from . import sparsecore
from .jax_internals import (
    INTERPRETER_MODULE,
    InterpreterLimit,
    JaxInternalsChanged,
    attributes_replaced,
    kernel_name,
    private_attribute,
)

SPARSE_CORE_LIMIT = (
    "JAX's TPU interpreter cannot run a DMA indexed by a vector of indices ({where}), a "
    "SparseCore gather or scatter: it reads a DMA's indices as integers")
TENSOR_CORE_REFUSAL = (
    "pallas: kernel {kernel}: a DMA indexed by a vector of indices ({where}) in a TensorCore "
    "kernel, which the TPU compiler rejects (libtpu 0.0.42.1 for v5e: 'tpu.memref_slice' "
    "takes 32-bit integers, not a vector); copy a contiguous pl.ds(start, size), or row by "
    "row")


@contextlib.contextmanager
def indexed_dmas_named() -> Iterator[bool]:
    """Inside the block, a kernel with a vector-indexed DMA stops at its tracing with one line
    (see the module docstring). Yields False where the interpreter's evaluator moved."""
    try:
        module = private_attribute(INTERPRETER_MODULE)
        original = module._interpret_jaxpr
        dma_start = private_attribute("jax._src.pallas.mosaic.primitives", "dma_start_p")
        tree_util = private_attribute("jax._src.tree_util")
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    @functools.wraps(original)
    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, **kwargs: Any) -> Any:
        where = _vector_indexed_dma(jaxpr, dma_start, tree_util)
        if where is not None:
            mesh = getattr(ctx, "mesh", None)
            core = str(getattr(getattr(mesh, "core_type", None), "value", ""))
            if core.startswith("sc"):
                if sparsecore.interpreting_sparsecore_kernel():
                    # _compat.sparsecore runs its instances, and sparsecore_copies its
                    # indexed copies, row by row.
                    return original(jaxpr, *args, ctx=ctx, **kwargs)
                raise InterpreterLimit(SPARSE_CORE_LIMIT.format(where=where))
            raise ValueError(TENSOR_CORE_REFUSAL.format(
                kernel=repr(kernel_name({"jaxpr": jaxpr})), where=where))
        return original(jaxpr, *args, ctx=ctx, **kwargs)

    # Looked up by name for each body the interpreter evaluates, nested ones too.
    with attributes_replaced(module, {"_interpret_jaxpr": interpret_jaxpr}):
        yield True


def _vector_indexed_dma(jaxpr: Any, dma_start: Any, tree_util: Any) -> str | None:
    """Where a ``dma_start`` of ``jaxpr``'s own equations takes a vector of indices, in words
    (its source line); None if none does. Nested bodies are the evaluator's next calls."""
    for equation in getattr(jaxpr, "eqns", ()):
        if equation.primitive is not dma_start:
            continue
        try:
            source, destination = tree_util.tree_unflatten(equation.params["tree"],
                                                           equation.invars)[:2]
        except (KeyError, TypeError, ValueError):
            continue
        for side, ref in (("source", source), ("destination", destination)):
            for transform in getattr(ref, "transforms", ()):
                shape = tuple(getattr(transform, "int_indexer_shape", ()) or ())
                if shape:
                    return f"its {side}, by {_count(shape)} indices, {_line(equation)}"
    return None


def _count(shape: tuple[Any, ...]) -> str:
    try:
        return str(functools.reduce(lambda a, b: a * int(b), shape, 1))
    except (TypeError, ValueError):
        return "a vector of"


def _line(equation: Any) -> str:
    frame = getattr(getattr(equation, "source_info", None), "traceback", None)
    frames = getattr(frame, "frames", None) or ()
    for entry in frames:
        name = getattr(entry, "file_name", "")
        if name and "/jax/" not in name.replace("\\", "/"):
            return f"at {name.rsplit('/', 1)[-1]}:{getattr(entry, 'line_num', '?')}"
    return "in the kernel"
