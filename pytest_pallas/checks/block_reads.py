"""Whether a kernel may read an output block before writing all of it, from its jaxpr.

Pallas TPU writes an output block back to HBM each time the grid leaves it and never reads it
back, so a block the grid comes back to holds stale memory until the kernel writes it. A
kernel that reads the block first (an accumulator: ``o_ref[...] += x``) computes from that
memory on a revisit; one that only writes it (a two-pass kernel that writes each block again,
whole, on its last pass) is right, its last write-back being the block's value. The walk is
conservative: a computation it cannot follow into (a DMA, a primitive it does not know) counts
as a read, and a write counts as whole only when it is unconditional and covers the block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax import tree_util

# Loads from a ref; addupdate reads the block to add to it.
_READS = frozenset({"get", "addupdate"})
# Calls whose body takes the caller's operands as its own inputs, in order.
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint",
                    "custom_jvp_call", "custom_vjp_call", "scan"})


def reads_before_writing(jaxpr: Any, ref: Any) -> bool:
    """Whether ``jaxpr`` may read the ref ``ref`` (one of its inputs) before an unconditional
    store of the whole ref."""
    for position, eqn in enumerate(jaxpr.eqns):
        if not any(var is ref for var in eqn.invars):
            continue
        name = eqn.primitive.name
        if name == "swap" and eqn.invars[0] is ref:
            if _old_value_used(jaxpr, position):
                return True
            if _stores_whole_ref(eqn):
                return False
            continue
        if name in _READS and eqn.invars[0] is ref:
            return True
        nested = _nested_refs(eqn, ref)
        # A nested store does not count as the block written: it may be conditional.
        if nested is None or any(reads_before_writing(sub, var) for sub, var in nested):
            return True
    return False


def _old_value_used(jaxpr: Any, position: int) -> bool:
    """Whether the value a swap returns (the ref's old contents) is read afterwards."""
    old = jaxpr.eqns[position].outvars[0]
    if type(old).__name__ == "DropVar":
        return False
    later = [var for eqn in jaxpr.eqns[position + 1:] for var in eqn.invars]
    return any(var is old for var in (*later, *jaxpr.outvars))


def _stores_whole_ref(eqn: Any) -> bool:
    """Whether a swap stores into every element of its ref: no view, no mask, every index
    a full slice."""
    try:
        leaves = eqn.invars[2:]
        if len(leaves) != eqn.params["tree"].num_leaves:
            return False  # a masked store carries its mask too
        transforms = tree_util.tree_unflatten(eqn.params["tree"], leaves)
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    if not transforms:
        return True
    if len(transforms) != 1 or type(transforms[0]).__name__ != "NDIndexer":
        return False
    shape = tuple(eqn.invars[0].aval.shape)
    indices = tuple(transforms[0].indices)
    return len(indices) == len(shape) and all(
        _full_slice(index, size) for index, size in zip(indices, shape))


def _full_slice(index: Any, size: int) -> bool:
    if type(index).__name__ != "Slice" or getattr(index, "stride", 1) != 1:
        return False
    start = index.start
    start = getattr(start, "val", start)  # a Literal holds its value
    return isinstance(index.size, int) and index.size == size and _is_zero(start)


def _is_zero(value: Any) -> bool:
    try:
        return int(value) == 0 and getattr(value, "shape", ()) == ()
    except (TypeError, ValueError):
        return False  # a traced start


def _nested_refs(eqn: Any, ref: Any) -> list[tuple[Any, Any]] | None:
    """The computations nested in ``eqn`` that receive ``ref``, each with the name it has
    there; None for an equation the walk cannot follow."""
    positions = [i for i, var in enumerate(eqn.invars) if var is ref]
    params, name = eqn.params, eqn.primitive.name
    try:
        if name == "cond":  # operand 0 is the branch index
            return [(_open(branch), _open(branch).invars[i - 1])
                    for branch in params["branches"] for i in positions]
        if name in _CALLS:
            body = _open(params.get("jaxpr") or params["call_jaxpr"])
            return _matched(body, body.invars, eqn.invars, positions)
        if name == "run_scoped":  # the caller's refs are the body's constants
            body = _open(params["jaxpr"])
            return _matched(body, body.constvars, eqn.invars, positions)
        if name == "while":
            return _while_refs(params, positions)
    except (KeyError, IndexError, AttributeError):
        return None
    return None


def _matched(body: Any, inner: Sequence[Any], outer: Sequence[Any],
             positions: list[int]) -> list[tuple[Any, Any]] | None:
    if len(inner) != len(outer):
        return None
    return [(body, inner[i]) for i in positions]


def _while_refs(params: dict[str, Any], positions: list[int]) -> list[tuple[Any, Any]]:
    cond, body = _open(params["cond_jaxpr"]), _open(params["body_jaxpr"])
    cond_consts, body_consts = params["cond_nconsts"], params["body_nconsts"]
    found = []
    for i in positions:
        if i < cond_consts:
            found.append((cond, cond.invars[i]))
        elif i < cond_consts + body_consts:
            found.append((body, body.invars[i - cond_consts]))
        else:  # a loop carry: both see it
            carry = i - cond_consts - body_consts
            found += [(cond, cond.invars[cond_consts + carry]),
                      (body, body.invars[body_consts + carry])]
    return found


def _open(jaxpr: Any) -> Any:
    """A ClosedJaxpr's jaxpr; a Jaxpr as it is."""
    return getattr(jaxpr, "jaxpr", jaxpr)
