"""Which kernels the TPU interpreter could give no other verdict for than the plain path
(``_compat.plain_path``): read from a ``pallas_call``'s params when it is bound.

A kernel goes to the plain path only if all of these hold; anything not proved keeps the
TPU interpreter (:func:`why_tpu_interpreter` names the first that fails):

1. the run's own TPU interpreter parameters route it (not a kernel's own
   ``pltpu.InterpretParams``), without race detection (on v4 and v5p, whose TPU
   interpreter runs "parallel" axes on two cores, the plain path runs each core's share);
2. nothing only the TPU interpreter runs or checks: every primitive of the kernel body and
   its index maps, nested jaxprs included, is one both interpreters evaluate alike
   (:data:`PLAIN_PRIMITIVES`: XLA's own operations, loads and stores, program ids, loops,
   conditionals, ``pl.run_scoped`` of VMEM or SMEM buffers); so no DMA, semaphore, barrier,
   remote ref, device id, TPU PRNG, ``pl.debug_print``, ``core_map`` (a mesh), ref view
   (reshape, bitcast) or strided access. Block operands and scratch live in VMEM or SMEM
   (not ``pl.ANY``/HBM, not semaphores), their block dimensions are blocked or squeezed, the
   grid is static and no output is aliased to an input;
3. the kernel never writes an input or scalar-prefetch ref (on the chip and in the TPU
   interpreter those are copies; the plain path writes through);
4. every load and store is in bounds, proved by interval arithmetic over the jaxpr: program
   ids range over the grid, ``num_programs`` is the grid size, loop counters over their trip
   counts, and integer arithmetic carries intervals; an index read from memory is unknown,
   so not proved. The TPU interpreter stops an access out of bounds; the plain path's
   ``dynamic_slice`` would clamp it. Block indices are checked by the plain path itself as
   it runs (``_compat.plain_path``).

Uninitialised memory reads the same in both: the plain path fills it with the TPU
interpreter's own fill.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax import tree_util

from .._compat import jax_internals
from .._compat.plain_path import Decision
from .jaxpr_analysis import sub_jaxprs
from .kernel_model import memory_space_name

# Primitives both interpreters evaluate alike: XLA operations the TPU interpreter binds as
# they are, and the Pallas and state primitives the plain path discharges as the TPU
# interpreter runs them. Anything else keeps the TPU interpreter.
_ELEMENTWISE = frozenset("""
    abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp clz
    convert_element_type copy copy_p cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1
    floor ge gt
    integer_pow is_finite le lgamma log log1p logistic lt max min mul ne neg nextafter not or
    population_count pow reduce_precision rem round rsqrt select_n shift_left
    shift_right_arithmetic shift_right_logical sign sin sinh sqrt square sub tan tanh xor
    bitcast_convert_type reciprocal mulhi real imag complex conj bessel_i0e bessel_i1e igamma
    igammac igamma_grad_a polygamma zeta regularized_incomplete_beta
""".split())
_STRUCTURAL = frozenset("""
    broadcast_in_dim concatenate pad reshape rev slice squeeze transpose expand_dims iota
    dynamic_slice dynamic_update_slice split gather scatter scatter-add scatter-sub scatter-mul
    scatter-min scatter-max tile stack unstack top_k conv_general_dilated optimization_barrier
    reduce_window_sum reduce_window_max reduce_window_min
    reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor argmax argmin
    cumsum cummax cummin cumprod cumlogsumexp sort dot_general
""".split())
_KERNEL = frozenset("""
    get swap program_id num_programs multiple_of cond scan while pjit jit closed_call
    custom_jvp_call custom_vjp_call run_scoped
""".split())
PLAIN_PRIMITIVES = _ELEMENTWISE | _STRUCTURAL | _KERNEL

_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr"}
_INT32 = (-2**31, 2**31 - 1)


class NotPlain(Exception):
    """Why a kernel keeps the TPU interpreter, in a few words."""


def decide(params: dict[str, Any]) -> Decision:
    """Where the kernel of a ``pallas_call`` bound with ``params`` runs (module docstring)."""
    kernel = jax_internals.kernel_name(params)
    try:
        reason = why_tpu_interpreter(params)
    except Exception as error:  # noqa: BLE001  # a kernel this reading does not know
        reason = f"its jaxpr could not be read ({type(error).__name__}: {error})"
    return Decision(kernel, "tpu" if reason else "plain", reason or "")


def why_tpu_interpreter(params: dict[str, Any]) -> str | None:
    """The first condition of the module docstring that the kernel fails, or None."""
    try:
        _check_call(params)
    except NotPlain as reason:
        return str(reason)
    return None


def _check_call(params: dict[str, Any]) -> None:
    forced = params.get("interpret")
    if getattr(forced, "detect_races", False):
        raise NotPlain("race detection (--pallas-detect-races)")
    if params.get("mesh") is not None:
        raise NotPlain("a kernel on a mesh (pl.core_map, pl.kernel)")
    compiler_params = params.get("compiler_params")
    if compiler_params is not None and type(compiler_params).__name__ != "CompilerParams":
        raise NotPlain(f"compiler params {type(compiler_params).__name__}")
    if params.get("input_output_aliases"):
        raise NotPlain("an output aliased to an input (input_output_aliases)")
    jaxpr = params["jaxpr"]
    if jaxpr.constvars:
        raise NotPlain("a kernel closing over constants")
    grid_mapping = params["grid_mapping"]
    grid = tuple(grid_mapping.grid)
    if not all(isinstance(size, int) for size in grid) or grid_mapping.num_dynamic_grid_bounds:
        raise NotPlain("a dynamic grid")
    if 0 in grid:
        raise NotPlain("an empty grid")
    operands = (grid_mapping.num_index_operands + len(grid_mapping.block_mappings)
                + len(grid_mapping.scratch_avals))
    if len(jaxpr.invars) != operands:
        raise NotPlain("kernel operands beyond its blocks and scratch (closed-over refs)")
    for mapping in grid_mapping.block_mappings:
        for dim in mapping.block_shape:
            if type(dim).__name__ not in ("Blocked", "Squeezed"):
                raise NotPlain(f"a {type(dim).__name__} block dimension")
        _check_memory_space(mapping.transformed_block_aval, "a block operand")
    num_index = grid_mapping.num_index_operands
    num_inputs = grid_mapping.num_inputs
    vmapped = tuple(grid_mapping.vmapped_dims)
    kernel_axes = [size for axis, size in enumerate(grid) if axis not in vmapped]
    reader = _Reader(kernel_axes)
    env: dict[Any, Any] = {}
    for position, var in enumerate(jaxpr.invars):
        if _is_semaphore(var.aval):
            raise NotPlain("a semaphore")
        _check_memory_space(var.aval, "an operand")
        env[var] = _Ref(read_only=position < num_index + num_inputs)
    reader.walk(jaxpr, env)
    for mapping in grid_mapping.block_mappings:
        index_map = mapping.index_map_jaxpr
        inner = index_map.jaxpr
        map_env: dict[Any, Any] = {}
        for axis, var in enumerate(inner.invars[:len(grid)]):
            map_env[var] = (0, max(0, grid[axis] - 1))
        for var in inner.invars[len(grid):]:
            map_env[var] = _Ref(read_only=True)
        for var, value in zip(inner.constvars, index_map.consts):
            map_env[var] = _constant(value)
        _Reader(list(grid)).walk(inner, map_env)


def _check_memory_space(aval: Any, what: str) -> None:
    name = memory_space_name(getattr(aval, "memory_space", None))
    if name not in ("vmem", "smem"):
        raise NotPlain(f"{what} in {name} memory")


def _is_semaphore(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    return "sem" in str(dtype).lower() or "semaphore" in type(dtype).__name__.lower()


@dataclasses.dataclass(frozen=True)
class _Ref:
    read_only: bool


def _constant(value: Any) -> tuple[int, int] | None:
    array = np.asarray(value)
    if array.size == 0 or array.dtype.kind not in "iub":
        return None
    return int(array.min()), int(array.max())


class _Reader:
    """Walks a kernel's jaxpr: the allowlist, writes to inputs and the bounds of every access.

    ``env`` maps each variable to a ``_Ref``, an interval ``(lo, hi)`` bounding every
    element of an integer or boolean value, or None (unknown)."""

    def __init__(self, kernel_axes: Sequence[int]) -> None:
        self.kernel_axes = list(kernel_axes)

    def walk(self, jaxpr: Any, env: dict[Any, Any]) -> list[Any]:
        def read(atom: Any) -> Any:
            if type(atom).__name__ == "Literal":
                return _constant(atom.val)
            return env.get(atom)

        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name not in PLAIN_PRIMITIVES:
                raise NotPlain(f"{name!r}, which only the TPU interpreter runs as the chip does")
            ins = [read(v) for v in eqn.invars]
            outs = self.equation(eqn, name, ins)
            for var, value in zip(eqn.outvars, outs):
                env[var] = value
        return [read(v) for v in jaxpr.outvars]

    def equation(self, eqn: Any, name: str, ins: list[Any]) -> list[Any]:
        params = eqn.params
        if name in ("get", "swap"):
            return self.access(eqn, name, ins)
        if name == "program_id":
            axis = params["axis"]
            if axis >= len(self.kernel_axes):
                raise NotPlain("a program id of an axis the grid lacks")
            return [(0, max(0, self.kernel_axes[axis] - 1))]
        if name == "num_programs":
            axis = params["axis"]
            if axis >= len(self.kernel_axes):
                raise NotPlain("a grid size of an axis the grid lacks")
            return [(self.kernel_axes[axis],) * 2]
        if name in _CALLS:
            division = _integer_division(params.get("name"), ins, eqn.outvars)
            if division is not None:
                return [division]
            inner, consts = _inner(params[_CALLS[name]])
            return self.call(inner, consts, ins)
        if name == "cond":
            return self.cond(params, ins)
        if name == "scan":
            return self.scan(params, ins)
        if name == "while":
            return self.while_loop(params, ins)
        if name == "run_scoped":
            return self.run_scoped(params, ins)
        if any(isinstance(value, _Ref) for value in ins):
            raise NotPlain(f"a ref passed to {name!r}")
        if any(True for value in params.values() for _ in sub_jaxprs(value)):
            raise NotPlain(f"{name!r} with a nested jaxpr")
        if len(eqn.outvars) != 1:
            return [None] * len(eqn.outvars)
        return [_transfer(name, params, ins, eqn.outvars[0].aval)]

    # --- calls and control flow ----------------------------------------------------------

    def call(self, jaxpr: Any, consts: Sequence[Any], ins: list[Any]) -> list[Any]:
        env = {var: _constant(value) for var, value in zip(jaxpr.constvars, consts)}
        env.update(zip(jaxpr.invars, ins))
        return self.walk(jaxpr, env)

    def cond(self, params: dict[str, Any], ins: list[Any]) -> list[Any]:
        branches = params["branches"]
        index, operands = ins[0], ins[1:]
        last = len(branches) - 1
        lo, hi = (0, last) if index is None else (min(max(index[0], 0), last),
                                                  min(max(index[1], 0), last))
        outs = None
        for branch in branches[lo:hi + 1]:
            inner, consts = _inner(branch)
            found = self.call(inner, consts, operands)
            outs = found if outs is None else [_join(a, b) for a, b in zip(outs, found)]
        return outs or []

    def scan(self, params: dict[str, Any], ins: list[Any]) -> list[Any]:
        inner, consts = _inner(params["jaxpr"])
        num_consts, num_carry = jax_internals.scan_operand_counts(params)
        length = int(params["length"])
        fixed, carry, xs = ins[:num_consts], ins[num_consts:num_consts + num_carry], \
            ins[num_consts + num_carry:]
        initial = list(carry)
        steps = {k: step for k, step in _counter_steps(inner, num_consts, num_carry).items()
                 if carry[k] is not None}
        carry = [_over_trip(c, steps.get(k), length) for k, c in enumerate(carry)]
        outs = self.loop_fixpoint(inner, consts, fixed, carry, xs, num_carry, steps)
        if length == 0:
            return [*initial, *[None] * (len(outs) - num_carry)]
        return [*(_join(a, b) for a, b in zip(initial, outs)), *outs[num_carry:]]

    def loop_fixpoint(self, inner: Any, consts: Sequence[Any], fixed: list[Any],
                      carry: list[Any], xs: list[Any], num_carry: int,
                      counters: dict[int, int]) -> list[Any]:
        """The body's outputs with carries that hold every value the loop gives them: a
        counter as :func:`_over_trip` bounds it, another carry joined with what the body
        returns until it stops growing (three tries), else unknown."""
        for attempt in range(4):
            outs = self.call(inner, consts, [*fixed, *carry, *xs])
            grown = [k for k in range(num_carry) if k not in counters
                     and not _within(outs[k], carry[k])]
            if not grown:
                return outs
            for k in grown:
                carry[k] = _join(carry[k], outs[k]) if attempt < 2 else None
        raise NotPlain("a loop whose carried values do not settle")

    def while_loop(self, params: dict[str, Any], ins: list[Any]) -> list[Any]:
        cond_jaxpr, cond_consts = _inner(params["cond_jaxpr"])
        body_jaxpr, body_consts = _inner(params["body_jaxpr"])
        cond_n, body_n = params["cond_nconsts"], params["body_nconsts"]
        cond_fixed, body_fixed = ins[:cond_n], ins[cond_n:cond_n + body_n]
        initial = list(ins[cond_n + body_n:])
        carry = list(initial)
        steps = _counter_steps(body_jaxpr, body_n, len(carry))
        invariant = _invariant_carries(body_jaxpr, body_n, len(carry))
        counters = {}
        for k, step in steps.items():
            limit = _loop_limit(cond_jaxpr, cond_n, k, cond_fixed, initial, invariant)
            if limit is None or step <= 0 or carry[k] is None or isinstance(limit, _Ref):
                carry[k] = None
                continue
            # While counter < limit, the body sees the counter up to limit - 1.
            carry[k] = (carry[k][0], max(carry[k][1], limit[1] - 1))
            counters[k] = step
        self.call(cond_jaxpr, cond_consts, [*cond_fixed, *carry])
        outs = self.loop_fixpoint(body_jaxpr, body_consts, body_fixed, carry, [],
                                  len(carry), counters)
        return [_join(a, b) for a, b in zip(initial, outs)]

    def run_scoped(self, params: dict[str, Any], ins: list[Any]) -> list[Any]:
        if params.get("collective_axes"):
            raise NotPlain("pl.run_scoped over collective axes")
        body, consts = _inner(params["jaxpr"])
        env: dict[Any, Any] = {var: _constant(value) for var, value in
                               zip(body.constvars[len(ins):], consts)}
        env.update(zip(body.constvars, ins))
        for var in body.invars:
            if _is_semaphore(var.aval):
                raise NotPlain("pl.run_scoped allocating a semaphore")
            _check_memory_space(var.aval, "a pl.run_scoped buffer")
            env[var] = _Ref(read_only=False)
        return self.walk(body, env)

    # --- loads and stores ----------------------------------------------------------------

    def access(self, eqn: Any, name: str, ins: list[Any]) -> list[Any]:
        ref = ins[0]
        if not isinstance(ref, _Ref):
            raise NotPlain(f"a {name} of something not a kernel ref")
        if name == "swap" and ref.read_only:
            raise NotPlain("a store into an input or scalar-prefetch ref, which on the chip "
                           "is a copy")
        first_index = 1 if name == "get" else 2
        transforms = tree_util.tree_unflatten(eqn.params["tree"], eqn.invars[first_index:])
        intervals = {id(var): value for var, value in
                     zip(eqn.invars[first_index:], ins[first_index:])}
        shape = tuple(eqn.invars[0].aval.shape)
        if len(transforms) > 1 or any(type(t).__name__ != "NDIndexer" for t in transforms):
            raise NotPlain("a ref view (reshape, bitcast, transpose or a second index)")
        if transforms:
            _check_indexer(transforms[0], shape, intervals)
        return [None]


def _check_indexer(indexer: Any, shape: tuple[int, ...], intervals: dict[Any, Any]) -> None:
    if tuple(getattr(indexer, "int_indexer_shape", ())) != ():
        raise NotPlain("an access indexed by an array")
    indices = tuple(indexer.indices)
    if len(indices) != len(shape):
        raise NotPlain("an access whose indices do not cover the ref")

    def bound(value: Any) -> tuple[int, int] | None:
        if isinstance(value, int):
            return (value, value)
        if type(value).__name__ == "Literal":
            return _constant(value.val)
        if getattr(getattr(value, "aval", None), "shape", None) != ():
            return None
        return intervals.get(id(value))

    for axis, (index, size) in enumerate(zip(indices, shape)):
        if type(index).__name__ == "Slice":
            if getattr(index, "stride", 1) != 1:
                raise NotPlain("a strided access")
            if not isinstance(index.size, int):
                raise NotPlain("an access of a size known only at run time")
            start = bound(index.start)
            if start is None:
                raise NotPlain(f"an access whose start along dimension {axis} is not known "
                               "before the kernel runs")
            if start[0] < 0 or start[1] + index.size > size:
                raise NotPlain(f"an access that may leave dimension {axis} "
                               f"(starts {start[0]}..{start[1]}, {index.size} long, of {size})")
            continue
        at = bound(index)
        if at is None:
            raise NotPlain(f"an access whose index along dimension {axis} is not known "
                           "before the kernel runs")
        if at[0] < 0 or at[1] >= size:
            raise NotPlain(f"an access that may leave dimension {axis} "
                           f"(index {at[0]}..{at[1]}, of {size})")


def _integer_division(name: Any, ins: list[Any], outvars: Sequence[Any]) -> Any:
    """``jnp.floor_divide`` and ``jnp.remainder`` (``//`` and ``%`` of traced integers) by a
    positive divisor, whose rounding corrections their jaxprs select by conditions that
    intervals alone cannot decide; None for anything else."""
    if name not in ("floor_divide", "remainder") or len(ins) != 2 or len(outvars) != 1:
        return None
    if any(value is None or isinstance(value, _Ref) for value in ins):
        return None
    (a, b), (c, d) = ins
    if c < 1:
        return None
    if name == "floor_divide":
        corners = [x // y for x in (a, b) for y in (c, d)]
        return _fits((min(corners), max(corners)), outvars[0].aval)
    if a >= 0 and b < c:
        return _fits((a, b), outvars[0].aval)
    return _fits((0, d - 1), outvars[0].aval)


def _inner(value: Any) -> tuple[Any, Sequence[Any]]:
    if hasattr(value, "jaxpr") and hasattr(value, "consts"):
        return value.jaxpr, value.consts
    return value, ()


# --- Intervals ---------------------------------------------------------------------------


def _join(a: Any, b: Any) -> Any:
    if a is None or b is None or isinstance(a, _Ref) or isinstance(b, _Ref):
        return a if a is b else None
    return min(a[0], b[0]), max(a[1], b[1])


def _within(inner: Any, outer: Any) -> bool:
    if outer is None:
        return True
    if inner is None or isinstance(inner, _Ref) or isinstance(outer, _Ref):
        return inner is outer
    return outer[0] <= inner[0] and inner[1] <= outer[1]


def _over_trip(value: Any, step: int | None, trips: int) -> Any:
    """A counter's values over ``trips`` iterations of ``step`` each, from ``value``."""
    if step is None or value is None or isinstance(value, _Ref):
        return value
    span = step * max(0, trips - 1)
    return value[0] + min(0, span), value[1] + max(0, span)


def _counter_steps(body: Any, num_consts: int, num_carry: int) -> dict[int, int]:
    """The carries a loop body adds a literal to each iteration: {carry: step}."""
    carried = body.invars[num_consts:num_consts + num_carry]
    defined = {eqn.outvars[0]: eqn for eqn in body.eqns if len(eqn.outvars) == 1}
    steps = {}
    for k, (var, out) in enumerate(zip(carried, body.outvars[:num_carry])):
        eqn = None if type(out).__name__ == "Literal" else defined.get(out)
        if eqn is None or eqn.primitive.name not in ("add", "sub"):
            continue
        a, b = eqn.invars
        literal = next((x for x in (a, b) if type(x).__name__ == "Literal"), None)
        if literal is None or var not in (a, b) or _constant(literal.val) is None:
            continue
        value = _constant(literal.val)[0]
        if eqn.primitive.name == "sub":
            if b is not literal:
                continue
            value = -value
        steps[k] = value
    return steps


def _invariant_carries(body: Any, num_consts: int, num_carry: int) -> set[int]:
    carried = body.invars[num_consts:num_consts + num_carry]
    return {k for k, (var, out) in enumerate(zip(carried, body.outvars[:num_carry]))
            if var is out}


def _loop_limit(cond: Any, num_consts: int, carry: int, consts: list[Any],
                carries: list[Any], invariant: set[int]) -> Any:
    """The interval of ``x`` when a while's condition is ``counter < x``, where ``x`` is a
    literal, a constant of the condition or a carry the body leaves alone; else None."""
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name != "lt":
        return None
    eqn = cond.eqns[0]
    if eqn.outvars[0] is not cond.outvars[0]:
        return None
    counter, limit = eqn.invars
    if counter is not cond.invars[num_consts + carry]:
        return None
    if type(limit).__name__ == "Literal":
        return _constant(limit.val)
    if limit not in cond.invars:
        return None
    position = cond.invars.index(limit)
    if position < num_consts:
        return consts[position]
    position -= num_consts
    return carries[position] if position in invariant and position != carry else None


def _fits(value: tuple[int, int], aval: Any) -> Any:
    try:
        dtype = np.dtype(aval.dtype)
    except TypeError:
        return None
    if dtype.kind == "b":
        return (max(0, min(value[0], 1)), max(0, min(value[1], 1)))
    if dtype.kind not in "iu":
        return None
    info = np.iinfo(dtype)
    if value[0] < info.min or value[1] > info.max:
        return None  # it may wrap around
    return value


def _transfer(name: str, params: dict[str, Any], ins: list[Any], aval: Any) -> Any:
    """The interval of an operation's result from its operands' (None: unknown). An interval
    bounds every element of a value."""
    if any(isinstance(v, _Ref) for v in ins):
        return None
    if name in _SAME_VALUES:
        value = ins[0]
    elif name == "iota":
        value = (0, max(0, int(params["shape"][params["dimension"]]) - 1))
    elif name in ("concatenate", "stack"):
        value = ins[0] if ins else None
        for each in ins[1:]:
            value = _join(value, each)
    elif name == "select_n":
        which, *cases = ins
        lo, hi = (0, len(cases) - 1) if which is None else (
            max(0, which[0]), min(len(cases) - 1, which[1]))
        value = None
        for k, case in enumerate(cases[lo:hi + 1]):
            value = case if k == 0 else _join(value, case)
    elif any(v is None for v in ins):
        value = None
    else:
        value = _arithmetic(name, ins, str(getattr(aval, "dtype", "")) == "bool")
    if value is None:
        return _fits((0, 1), aval) if str(getattr(aval, "dtype", "")) == "bool" else None
    return _fits(value, aval)


# Operations whose every result element is one of their (first) operand's elements.
_SAME_VALUES = frozenset("""
    broadcast_in_dim reshape squeeze expand_dims copy copy_p multiple_of slice transpose rev
    reduce_max reduce_min convert_element_type tile
""".split())


def _arithmetic(name: str, ins: list[tuple[int, int]], boolean: bool) -> tuple[int, int] | None:
    if boolean and name in ("and", "or", "not", "xor"):
        return _logic(name, ins)
    if name in ("add", "add_any"):
        (a, b), (c, d) = ins
        return a + c, b + d
    if name == "sub":
        (a, b), (c, d) = ins
        return a - d, b - c
    if name == "neg":
        (a, b), = ins
        return -b, -a
    if name == "mul":
        (a, b), (c, d) = ins
        corners = (a * c, a * d, b * c, b * d)
        return min(corners), max(corners)
    if name == "max":
        (a, b), (c, d) = ins
        return max(a, c), max(b, d)
    if name == "min":
        (a, b), (c, d) = ins
        return min(a, c), min(b, d)
    if name == "clamp":
        (lo, _), (a, b), (_, hi) = ins
        return min(max(a, lo), hi), min(max(b, lo), hi)
    if name == "abs":
        (a, b), = ins
        return (0 if a <= 0 <= b else min(abs(a), abs(b))), max(abs(a), abs(b))
    if name == "sign":
        (a, b), = ins
        return (a > 0) - (a < 0), (b > 0) - (b < 0)
    if name == "div":
        (a, b), (c, d) = ins
        if c < 1:
            return None  # a divisor that may be zero or negative
        corners = [int(x / y) for x in (a, b) for y in (c, d)]  # truncating, as lax.div
        return min(corners), max(corners)
    if name == "rem":
        (a, b), (c, d) = ins
        if c < 1:
            return None
        if a >= 0 and b < c:
            return a, b
        return (0 if a >= 0 else max(a, -(d - 1))), max(0, min(b, d - 1))
    if name in ("shift_right_arithmetic", "shift_right_logical"):
        (a, b), (c, d) = ins
        if a < 0 or c != d or c < 0:
            return None
        return a >> c, b >> c
    if name == "and":
        (a, b), (c, d) = ins
        mask = d if c == d and c >= 0 else b if a == b and a >= 0 else None
        return None if mask is None else (0, mask)
    return _comparison(name, ins)


def _logic(name: str, ins: list[tuple[int, int]]) -> tuple[int, int]:
    """Boolean ``and``, ``or``, ``not``, ``xor`` of values within [0, 1]."""
    if name == "not":
        (a, b), = ins
        return 1 - b, 1 - a
    (a, b), (c, d) = ins
    if name == "and":
        return int(a == 1 and c == 1), int(b == 1 and d == 1)
    if name == "or":
        return int(a == 1 or c == 1), int(b == 1 or d == 1)
    if a == b and c == d:
        return (a ^ c,) * 2
    return 0, 1


def _comparison(name: str, ins: list[tuple[int, int]]) -> tuple[int, int] | None:
    if name not in ("lt", "le", "gt", "ge", "eq", "ne"):
        return None
    (a, b), (c, d) = ins
    always = {"lt": b < c, "le": b <= c, "gt": a > d, "ge": a >= d,
              "eq": a == b == c == d, "ne": b < c or d < a}[name]
    never = {"lt": a >= d, "le": a > d, "gt": b <= c, "ge": b < c,
             "eq": b < c or d < a, "ne": a == b == c == d}[name]
    return (1, 1) if always else (0, 0) if never else (0, 1)
