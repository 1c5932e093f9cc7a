"""Finding the ``pallas_call``s of a traced program: their params, operand avals and
meshes, which of their outputs the program uses, whether they communicate, and a
fingerprint that is equal for two traces of the same kernel.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

from .._compat import jax_internals


def pallas_call_params_in(jaxpr: Any) -> Iterator[dict[str, Any]]:
    """The params of every ``pallas_call`` equation in a (closed) jaxpr, nested ones included.

    Descends into every sub-jaxpr an equation carries (``jit``/``pjit``,
    ``closed_call``, ``shard_map``, ``custom_vjp_call``/``custom_jvp_call``,
    ``cond`` branches, ``scan``/``while`` bodies, ...), but not into a
    kernel's own body.
    """
    inner = getattr(jaxpr, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        jaxpr = inner
    for equation in getattr(jaxpr, "eqns", ()):
        if equation.primitive is jax_internals.pallas_call_primitive():
            yield equation.params
            continue
        for value in equation.params.values():
            for sub in sub_jaxprs(value):
                yield from pallas_call_params_in(sub)


def pallas_call_uses_in(jaxpr: Any) -> Iterator[tuple[dict[str, Any], tuple[bool, ...]]]:
    """Each ``pallas_call`` of a (closed) jaxpr with which of its outputs the program uses.

    An output counts as used when a later equation reads it or the enclosing
    jaxpr returns it (so an output handed back out of a nested ``jit`` is
    used, conservatively). Same traversal as :func:`pallas_call_params_in`.
    """
    inner = getattr(jaxpr, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        jaxpr = inner
    equations = list(getattr(jaxpr, "eqns", ()))
    read = {id(v) for v in getattr(jaxpr, "outvars", ())}
    for equation in equations:
        read.update(id(v) for v in equation.invars)
    for equation in equations:
        if equation.primitive is jax_internals.pallas_call_primitive():
            yield equation.params, tuple(id(v) in read for v in equation.outvars)
            continue
        for value in equation.params.values():
            for sub in sub_jaxprs(value):
                yield from pallas_call_uses_in(sub)


def sub_jaxprs(value: Any) -> Iterator[Any]:
    if hasattr(value, "eqns"):
        yield value
    elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
        yield value.jaxpr
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from sub_jaxprs(item)


def pallas_call_fingerprint(params: dict[str, Any]) -> str:
    """Text that is equal for two traces of the same kernel with the same grid and params.

    The kernel jaxpr, grid mapping (every field of it and of its block mappings: block
    shapes, index maps, pipeline modes, memory spaces) and compiler params print without
    source locations, so a kernel traced again for another example of the same shapes
    prints the same. The interpreter choice is left out.
    """
    text = "\n".join(f"{name}={_params_text(name, params[name])}"
                     for name in sorted(params) if name not in ("interpret", "debug"))
    # JAX prints some variables by their object ids (a ref selection's index: "Var(id=...)"),
    # which differ between traces: they are numbered in order of appearance instead.
    numbers: dict[str, int] = {}
    text = _OBJECT_ID.sub(lambda m: f"id={numbers.setdefault(m.group(1), len(numbers))}", text)
    return _ADDRESS.sub("", text)


def _params_text(name: str, value: Any) -> str:
    if name == "jaxpr":
        return _printed(value, str)
    if name == "grid_mapping":
        return _fields_text(value)
    return _printed(value, repr)


def _fields_text(value: Any) -> str:
    """A grid mapping with every field it has. Its repr (and a block mapping's) names the
    grid and block shapes only: two kernels that differ in a block's index map, its
    ``pipeline_mode`` (``pl.Buffered(1)``) or memory space printed the same, and the compile
    check answered the second with the first's verdict."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{field.name}={_fields_text(getattr(value, field.name, None))}"
                           for field in dataclasses.fields(value) if field.name != "debug")
        return f"{type(value).__name__}({fields})"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_fields_text(item) for item in value) + ")"
    if hasattr(value, "jaxpr") or hasattr(value, "eqns"):
        return _printed(value, str)
    if callable(value) and not isinstance(value, type):
        return getattr(value, "__qualname__", type(value).__name__)
    return _printed(value, repr)


_OBJECT_ID = re.compile(r"\bid=(\d+)")
# An object printed by its address (a function of the grid mapping): another every trace.
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _printed(value: Any, printer: Callable[[Any], str]) -> str:
    """``value`` as JAX prints it or, where JAX's printer fails on it, its structure. (JAX
    0.10's printer raises a TypeError on a DMA from a nested ref selection, ``x_ref.at[i].at[j]``,
    that its interpreter runs.)"""
    try:
        return printer(value)
    except Exception:  # noqa: BLE001  # any failure of JAX's printer: the structure instead
        return _structure(value, {})


def _structure(value: Any, names: dict[Any, int]) -> str:
    """What a jaxpr computes, printed without JAX's printer: each equation's primitive, its
    operands and results (numbered in order of appearance, with their types) and params."""
    jaxpr = next(sub_jaxprs(value), None) if hasattr(value, "eqns") or hasattr(
        value, "jaxpr") else None
    if jaxpr is None:
        if isinstance(value, (tuple, list)):
            return "(" + ", ".join(_structure(item, names) for item in value) + ")"
        try:
            return repr(value)
        except Exception:  # noqa: BLE001
            return type(value).__name__

    def var(v: Any) -> str:
        if hasattr(v, "val"):  # a literal
            return f"{v.val!r}:{getattr(v, 'aval', '')}"
        return f"v{names.setdefault(v, len(names))}:{getattr(v, 'aval', '')}"

    lines = [f"in ({', '.join(var(v) for v in getattr(jaxpr, 'invars', ()))})"]
    for eqn in jaxpr.eqns:
        params = ", ".join(f"{key}={_structure(eqn.params[key], names)}"
                           for key in sorted(eqn.params))
        lines.append(f"{', '.join(var(v) for v in eqn.outvars)} = {eqn.primitive.name}"
                     f"[{params}]({', '.join(var(v) for v in eqn.invars)})")
    lines.append(f"out ({', '.join(var(v) for v in getattr(jaxpr, 'outvars', ()))})")
    return "{" + "; ".join(lines) + "}"


def pallas_call_communicates(params: dict[str, Any]) -> bool:
    """Whether a pallas_call's kernel names mesh axes or talks to other devices.

    Mosaic's own test (``MosaicGridMapping.has_communication``): such a kernel
    lowers only inside ``shard_map``, with the mesh.
    """
    names = {"NamedAxisEffect", "CommsEffect"}
    jaxprs = [params.get("jaxpr")]
    grid_mapping = params.get("grid_mapping")
    for mapping in getattr(grid_mapping, "block_mappings", ()):
        jaxprs.append(getattr(getattr(mapping, "index_map_jaxpr", None), "jaxpr", None))
    return any(type(effect).__name__ in names
               for jaxpr in jaxprs for effect in getattr(jaxpr, "effects", ()))


def pallas_call_equations_in(
        jaxpr: Any, mesh_axes: tuple[tuple[str, int], ...] = ()
) -> Iterator[tuple[dict[str, Any], tuple[Any, ...], tuple[tuple[str, int], ...]]]:
    """Each ``pallas_call`` of a (closed) jaxpr: its params, operand avals and enclosing mesh.

    As :func:`pallas_call_params_in`, with the abstract values of the call's
    operands and the axes (name, size) of the ``shard_map`` it sits in, if any.
    """
    inner = getattr(jaxpr, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        jaxpr = inner
    for equation in getattr(jaxpr, "eqns", ()):
        if equation.primitive is jax_internals.pallas_call_primitive():
            yield equation.params, tuple(v.aval for v in equation.invars), mesh_axes
            continue
        axes = mesh_axes
        mesh = equation.params.get("mesh") if equation.primitive.name == "shard_map" else None
        if mesh is not None and hasattr(mesh, "axis_names"):
            axes = tuple((str(n), int(s)) for n, s in zip(mesh.axis_names, mesh.axis_sizes))
        for value in equation.params.values():
            for sub in sub_jaxprs(value):
                yield from pallas_call_equations_in(sub, axes)


def mesh_kernel_equations_in(jaxpr: Any, container: Any = None) -> Iterator[tuple[Any, Any]]:
    """Each kernel of a (closed) jaxpr written on a mesh (``pl.kernel``, ``pl.core_map``).

    Yields ``(kernel equation, equation to compile)``: ``pl.kernel`` binds a
    primitive of arrays, compiled as it is; ``pl.core_map`` reads and writes refs,
    so the nearest enclosing equation of arrays (``pl.run_state``, a ``jit``) is
    compiled in its place. ``pallas_call`` equations are left to
    :func:`pallas_call_equations_in`.
    """
    names = jax_internals.mesh_kernel_primitive_names()
    inner = getattr(jaxpr, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        jaxpr = inner
    for equation in getattr(jaxpr, "eqns", ()):
        of_arrays = not any(_is_ref(v) for v in equation.invars)
        if equation.primitive.name in names:
            yield equation, (equation if of_arrays else container)
            continue
        if equation.primitive is jax_internals.pallas_call_primitive():
            continue
        for value in equation.params.values():
            for sub in sub_jaxprs(value):
                yield from mesh_kernel_equations_in(sub, equation if of_arrays else container)


def _is_ref(var: Any) -> bool:
    return type(getattr(var, "aval", None)).__name__ == "AbstractRef"


def mesh_kernel_name(equation: Any) -> str:
    """The name a ``pl.kernel`` / ``pl.core_map`` equation was given, else its primitive's."""
    name = equation.params.get("name")
    return str(name) if name else equation.primitive.name


def mesh_kernel_on_tensor_cores(equation: Any) -> bool:
    """Whether a mesh kernel runs on TensorCores (not a SparseCore or GPU mesh)."""
    meshes = list(equation.params.get("meshes") or ()) or [equation.params.get("mesh")]
    return all(type(mesh).__name__ == "TensorCoreMesh" for mesh in meshes)
