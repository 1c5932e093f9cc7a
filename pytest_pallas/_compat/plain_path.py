"""The plain path: a kernel the TPU interpreter would run no differently, run as one XLA
loop instead.

JAX's TPU interpreter (``pltpu.InterpretParams``) runs every load, store and grid step of a
kernel as a host callback that copies data; JAX's plain interpreter (``interpret=True``,
``hlo_interpreter.pallas_call_hlo_interpret``) discharges the kernel's refs into values and
runs its grid as one XLA while loop, several times cheaper. For a kernel that
``checks.plain_equivalence`` proves the TPU interpreter could give no other verdict for,
the bind (``pallas_call_hooks.forced_interpreter_when_called``) hands the call
:func:`plain_params` and its lowering runs :func:`_run_plain`: JAX's plain interpreter's
discharge of the kernel body (``kernel_to_hlo_jaxpr``, its block slicing), in the grid loop
the TPU interpreter runs, so that what one computes the other computes:

- the grid's "parallel" axes in the TPU interpreter's seeded shuffled order (its own
  ``_get_randomized_grid_coordinates``; the plain interpreter goes in order);
- an output block's buffer kept from one grid step to the next, the next block starting
  from what the previous one left in it (the plain interpreter reads the block back from
  the output array), written back to the output at every step;
- fresh memory (outputs, scratch, ``pl.run_scoped`` buffers, the padding of a ragged last
  block) filled by the TPU interpreter's own fill (``utils.get_uninitialized_array``: NaN,
  the integer maximum, True; the chip's poison under ``pl.enable_poison_buffers``), where
  the plain interpreter fills the integer minimum and False;
- on a chip of two TensorCores per device (v4, v5p), each core's share of the grid (the
  TPU interpreter's split of the "parallel" axes) with buffers and scratch of its own,
  one core after the other: a kernel that sets up its scratch only at the grid's first
  step reads fresh memory on the second core, as there;
- a block index out of bounds, or an output block visited again after the grid left it,
  which the TPU interpreter stops with an error, is noticed in the loop: the kernel's
  callback then tells :func:`plain_path_doubts`' listeners, and the test runs again with
  every kernel in the TPU interpreter (``supervision.kernel_run``).

A kernel whose plain run JAX cannot build (an internal error while tracing or lowering it)
is lowered by the TPU interpreter instead, that kernel alone. The parameters of a plain
kernel are the run's TPU interpreter parameters (a subclass of ``pltpu.InterpretParams``,
so the call keeps the TPU interpreter's effects and jit caches keep the two apart).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import io_callback
from jax.experimental.pallas import tpu as pltpu

from . import jax_internals
from .jax_internals import INTERPRETER_MODULE, JaxInternalsChanged, scan_operand_counts

_HLO_INTERPRETER = "jax._src.pallas.hlo_interpreter"
_INTERPRETER_UTILS = "jax._src.pallas.mosaic.interpret.utils"
_PALLAS_CORE = "jax._src.pallas.core"
_PALLAS_PRIMITIVES = "jax._src.pallas.primitives"
_MOSAIC_CORE = "jax._src.pallas.mosaic.core"
_CORE = "jax._src.core"
_MLIR = "jax._src.interpreters.mlir"
_PARTIAL_EVAL = "jax._src.interpreters.partial_eval"
_STATE_DISCHARGE = "jax._src.state.discharge"


@dataclasses.dataclass(frozen=True)
class Decision:
    """Where one bound kernel runs: ``interpreter`` is ``"plain"`` or ``"tpu"``; ``reason``
    says why the TPU interpreter (empty for the plain one)."""

    kernel: str
    interpreter: str
    reason: str = ""


_routed_class: Any = None


def _routed_params_class() -> Any:
    """``RoutedInterpretParams``: ``pltpu.InterpretParams`` and a ``plain`` field. The run's
    forced parameters are one (``plain=False``: route each kernel); a kernel bound for the
    plain path gets ``plain=True``. Unequal to any ``pltpu.InterpretParams``, so a program
    traced with routing is never served from JAX's caches to a run without (the forced
    parameters are part of jit's key)."""
    global _routed_class
    if _routed_class is None:
        base = pltpu.InterpretParams
        if not dataclasses.is_dataclass(base):
            raise JaxInternalsChanged(
                "pltpu.InterpretParams is no longer a dataclass; the plain path is off.")

        @dataclasses.dataclass(frozen=True, kw_only=True)
        class RoutedInterpretParams(base):  # type: ignore[misc, valid-type]
            plain: bool = False

        RoutedInterpretParams.__module__ = __name__
        RoutedInterpretParams.__qualname__ = "RoutedInterpretParams"
        globals()["RoutedInterpretParams"] = RoutedInterpretParams
        _routed_class = RoutedInterpretParams
    return _routed_class


def routing_params(params: Any) -> Any:
    """``params`` (a ``pltpu.InterpretParams``) as the forced parameters of a run that runs
    the kernels it can in the plain path (see :func:`kernels_routed`)."""
    cls = _routed_params_class()
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    return cls(**fields, plain=False)


def tpu_only(params: Any) -> Any:
    """The ``pltpu.InterpretParams`` of ``params`` without routing: every kernel in the TPU
    interpreter."""
    if not is_routed(params):
        return params

    names = {f.name for f in dataclasses.fields(pltpu.InterpretParams)}
    return pltpu.InterpretParams(**{name: getattr(params, name) for name in names})


def is_routed(params: Any) -> bool:
    return _routed_class is not None and isinstance(params, _routed_class)


def plain_params(params: Any) -> Any:
    """The parameters of one kernel bound for the plain path."""
    return dataclasses.replace(params, plain=True)


def is_plain(params: Any) -> bool:
    return is_routed(params) and params.plain


# --- Routing at the bind -----------------------------------------------------------------


@dataclasses.dataclass
class _Router:
    decide: Callable[[dict[str, Any]], Decision]
    # Each kernel's decision, by its jaxpr, grid mapping and parameters: a kernel bound again
    # (an eager call's inner jit) is not decided, nor recorded, twice; a transformed one
    # (vmap, jvp) is decided afresh.
    decided: dict[Any, tuple[Any, Decision]] = dataclasses.field(default_factory=dict)


_routers: list[_Router] = []
_lock = threading.RLock()


def routed(params: dict[str, Any]) -> dict[str, Any]:
    """A ``pallas_call``'s params as bound: a kernel whose interpreter parameters route it
    (:func:`routing_params`) runs in the plain path (:func:`plain_params`) where the active
    router decides so, else in the TPU interpreter. Called where the bind decides the
    interpreter; anything else is returned as it is."""
    interpret = params.get("interpret")
    if not is_routed(interpret):
        return params
    forced = dataclasses.replace(interpret, plain=False)
    with _lock:
        router = _routers[-1] if _routers else None
    if router is None:
        return {**params, "interpret": forced}
    jaxpr, grid_mapping = params.get("jaxpr"), params.get("grid_mapping")
    try:
        key = (id(jaxpr), id(grid_mapping), forced)
        hash(key)
    except TypeError:
        key = None
    known = router.decided.get(key) if key is not None else None
    if known is not None:
        decision = known[1]
    else:
        decision = router.decide({**params, "interpret": forced})
        if key is not None:
            router.decided[key] = ((jaxpr, grid_mapping), decision)  # the ids stay theirs
        with _lock:
            for each in _decision_recorders:
                each.append(decision)
    plain = decision.interpreter == "plain"
    return {**params, "interpret": plain_params(forced) if plain else forced}


@contextlib.contextmanager
def kernels_routed(decide: Callable[[dict[str, Any]], Decision]) -> Iterator[bool]:
    """Inside the block, a kernel bound with routing parameters (:func:`routing_params`)
    runs in the plain path when ``decide(params)`` says so, and ``pallas_call``'s lowering
    runs such a kernel as :func:`_run_plain`. Yields False (every kernel in the TPU
    interpreter) where this JAX's pieces moved."""
    try:
        _routed_params_class()
        mlir = jax_internals.private_attribute(_MLIR)
        primitive = jax_internals.pallas_call_primitive()
        entry = mlir._lowerings[primitive]
        lowering = entry.rule
        for module, name in _PIECES:
            jax_internals.private_attribute(module, name)
    except (JaxInternalsChanged, AttributeError, KeyError):
        yield False
        return

    @functools.wraps(lowering)
    def lowered(ctx: Any, *in_nodes: Any, interpret: Any, **params: Any) -> Any:
        if not is_plain(interpret):
            return lowering(ctx, *in_nodes, interpret=interpret, **params)
        tpu = dataclasses.replace(interpret, plain=False)
        try:
            if any(type(aval).__name__ != "ShapedArray" for aval in ctx.avals_in):
                raise NotImplementedError("an operand that is not an array (a ref)")
            closed = _plain_jaxpr(ctx.avals_in, tpu, params)
            return mlir.lower_fun(_evaluated(closed), multiple_results=True)(ctx, *in_nodes)
        except Exception as error:  # noqa: BLE001  # JAX cannot build it: the TPU interpreter
            _tell_fallback(params, error)
            return lowering(ctx, *in_nodes, interpret=tpu, **params)

    router = _Router(decide)
    with _lock:
        _routers.append(router)
    mlir.register_lowering(primitive, lowered, inline=entry.inline)
    try:
        yield True
    finally:
        mlir.register_lowering(primitive, lowering, inline=entry.inline)
        with _lock:
            _routers[:] = [r for r in _routers if r is not router]


_decision_recorders: list[list[Decision]] = []


@contextlib.contextmanager
def decisions_recorded() -> Iterator[list[Decision]]:
    """Collect the :class:`Decision` of every kernel bound inside the block (and a kernel's
    fallback to the TPU interpreter at its lowering, as a second decision)."""
    found: list[Decision] = []
    with _lock:
        _decision_recorders.append(found)
    try:
        yield found
    finally:
        with _lock:
            _decision_recorders[:] = [r for r in _decision_recorders if r is not found]


def _tell_fallback(params: dict[str, Any], error: BaseException) -> None:
    first = (str(error).strip().splitlines() or [""])[0][:160]
    decision = Decision(jax_internals.kernel_name(params), "tpu",
                        f"JAX's plain interpreter cannot run it ({type(error).__name__}: "
                        f"{first})")
    with _lock:
        for each in _decision_recorders:
            each.append(decision)


# --- Doubts: what the TPU interpreter would have stopped ----------------------------------


_doubt_listeners: list[Callable[[str], None]] = []


@contextlib.contextmanager
def plain_path_doubts(listener: Callable[[str], None]) -> Iterator[None]:
    """Inside the block, ``listener(kernel)`` hears each plain-path kernel whose run met what
    the TPU interpreter stops with an error (a block index out of bounds, an output block
    revisited): its values are not the TPU interpreter's verdict. Called from XLA's
    callback thread; a compiled kernel calls whichever listener is active when it runs."""
    with _lock:
        _doubt_listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _doubt_listeners[:] = [each for each in _doubt_listeners if each is not listener]


def _doubted(kernel: str) -> None:
    with _lock:
        listeners = tuple(_doubt_listeners)
    for each in listeners:
        each(kernel)


# --- The loop ----------------------------------------------------------------------------

# What _run_plain reads of JAX, checked before the lowering is replaced.
_PIECES = (
    (_HLO_INTERPRETER, "kernel_to_hlo_jaxpr"),
    (_HLO_INTERPRETER, "_dynamic_slice"),
    (_HLO_INTERPRETER, "_dynamic_update_slice"),
    (INTERPRETER_MODULE, "_get_randomized_grid_coordinates"),
    (INTERPRETER_MODULE, "_get_grid_point"),
    (INTERPRETER_MODULE, "remove_memory_space_p"),
    (_INTERPRETER_UTILS, "get_uninitialized_array"),
    (_INTERPRETER_UTILS, "pad_to_block_dimension"),
    (_INTERPRETER_UTILS, "get_indices"),
    (_PALLAS_CORE, "_get_block_shape"),
    (_PALLAS_CORE, "grid_env"),
    (_PALLAS_CORE, "Squeezed"),
    (_PALLAS_CORE, "Blocked"),
    (_PALLAS_PRIMITIVES, "run_scoped_p"),
    (_PARTIAL_EVAL, "convert_constvars_jaxpr"),
    (_STATE_DISCHARGE, "discharge_state"),
    (_MOSAIC_CORE, "CompilerParams"),
    (_CORE, "eval_jaxpr"),
)


def _plain_jaxpr(avals_in: Any, interpret_params: Any, params: dict[str, Any]) -> Any:
    """The plain run of one kernel, traced: a closed jaxpr of its operands."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals_in]
    return jax.make_jaxpr(functools.partial(
        _run_plain, interpret_params=interpret_params, **params))(*shapes)


def _evaluated(closed: Any) -> Callable[..., Any]:
    """The traced plain run as a function of the call's operands, which may carry a memory
    space (``pltpu.HBM``) that the TPU interpreter strips as well."""
    evaluate = jax_internals.private_attribute(_CORE, "eval_jaxpr")
    strip = jax_internals.private_attribute(INTERPRETER_MODULE, "remove_memory_space_p")
    return lambda *args: evaluate(closed.jaxpr, closed.consts, *(strip.bind(a) for a in args))


def _run_plain(*args: Any, jaxpr: Any, grid_mapping: Any, compiler_params: Any,
               interpret_params: Any, name: Any = None, **_: Any) -> list[Any]:
    """One kernel's run as the TPU interpreter runs it (see the module docstring), for a
    kernel ``checks.plain_equivalence`` admitted: a static grid, no mesh, no aliased
    operand, blocked or squeezed block dimensions, no input written; on a chip of two
    TensorCores per device, each core's share of the grid in turn."""
    hlo = jax_internals.private_attribute(_HLO_INTERPRETER)
    tpu = jax_internals.private_attribute(INTERPRETER_MODULE)
    utils = jax_internals.private_attribute(_INTERPRETER_UTILS)
    core = jax_internals.private_attribute(_PALLAS_CORE)
    mosaic_params = (compiler_params if compiler_params is not None
                     else jax_internals.private_attribute(_MOSAIC_CORE, "CompilerParams")())
    memory = interpret_params.uninitialized_memory
    grid = tuple(int(size) for size in grid_mapping.grid)
    num_index = grid_mapping.num_index_operands
    num_inputs, num_outputs = grid_mapping.num_inputs, grid_mapping.num_outputs
    mappings = tuple(grid_mapping.block_mappings)
    scalars, inputs = list(args[:num_index]), list(args[num_index:])
    block_shapes = [core._get_block_shape(m.block_shape) for m in mappings]
    squeezed = [tuple(isinstance(d, core.Squeezed) for d in m.block_shape) for m in mappings]
    blocked = [tuple(isinstance(d, core.Blocked) for d in m.block_shape) for m in mappings]
    discharged, consts, scratch_avals = hlo.kernel_to_hlo_jaxpr(jaxpr, (), grid_mapping)

    inputs = [utils.pad_to_block_dimension(x, shape, memory)
              for x, shape in zip(inputs, block_shapes[:num_inputs])]
    out_mappings, out_shapes = mappings[num_inputs:], block_shapes[num_inputs:]
    outputs = [utils.pad_to_block_dimension(
        utils.get_uninitialized_array(m.array_aval.shape, m.array_aval.dtype, memory),
        shape, memory) for m, shape in zip(out_mappings, out_shapes)]
    kernel_refs = jaxpr.invars[num_index:]
    # Fresh for each core's share: the arrays are values, so every share starts from these.
    buffers = [utils.get_uninitialized_array(v.aval.shape, v.aval.dtype, memory)
               for v in kernel_refs[num_inputs:num_inputs + num_outputs]]
    scratch = [utils.get_uninitialized_array(a.shape, a.dtype, memory) for a in scratch_avals]
    # How many blocks each operand's array has along each dimension (the padded array's).
    block_counts = [tuple(-(-int(size) // int(block)) if is_blocked else int(size)
                          for size, block, is_blocked in zip(m.array_aval.shape, shape, kinds))
                    for m, shape, kinds in zip(mappings, block_shapes, blocked)]
    visited = [jnp.zeros((max(1, math.prod(counts)),), jnp.bool_)
               for counts in block_counts[num_inputs:]]
    coordinates = tpu._get_randomized_grid_coordinates(
        grid, mosaic_params, interpret_params.random_seed)
    steps = math.prod(grid)
    # The TPU interpreter's share of the grid for each TensorCore of a device: consecutive
    # iterations, as many points of the "parallel" subgrid each (rounded up), each core with
    # buffers and scratch of its own. Cores write disjoint output blocks unless the kernel
    # races, so running them one after the other computes what running them at once does.
    cores = int(interpret_params.num_cores_per_device)
    parallel = tpu._get_parallel_dim_semantics(mosaic_params, len(grid))
    subgrid = tpu._get_parallel_subgrid_size(parallel, grid)
    per_core = -(-subgrid // cores) * (steps // subgrid)
    shares = min(cores, -(-steps // per_core))

    def local_grid_env(point: tuple[Any, ...]) -> Any:
        if grid_mapping.local_grid_env is not None:
            return grid_mapping.local_grid_env(point, grid)
        return tuple(core.GridAxis(index, size) for axis, (index, size)
                     in enumerate(zip(point, grid)) if axis not in grid_mapping.vmapped_dims)

    def block_indices(starts: Any, shape: tuple[int, ...], kinds: tuple[bool, ...]) -> list:
        return [jnp.asarray(s, jnp.int32) // b if k else jnp.asarray(s, jnp.int32)
                for s, b, k in zip(starts, shape, kinds)]

    def out_of_bounds(indices: list, counts: tuple[int, ...]) -> Any:
        bad = jnp.bool_(False)
        for index, count in zip(indices, counts):
            bad = bad | (index < 0) | (index >= count)
        return bad

    def step(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        i, outs, buffers, scratch, last, visited, doubt = carry
        loop_index = utils.get_indices(grid, i)
        point_array = tpu._get_grid_point(loop_index, coordinates)
        point = tuple(point_array[axis] for axis in range(len(grid)))
        with core.grid_env(local_grid_env(point)):
            starts = [m.compute_start_indices_interpret(point, *scalars) for m in mappings]
        indices = [block_indices(s, shape, kinds)
                   for s, shape, kinds in zip(starts, block_shapes, blocked)]
        for index, counts in zip(indices, block_counts):
            doubt = doubt | out_of_bounds(index, counts)
        blocks = [hlo._dynamic_slice(s, shape, x, sq) for s, shape, x, sq
                  in zip(starts, block_shapes, inputs, squeezed)]
        with core.grid_env(local_grid_env(point)):
            new = _evaluate(discharged, consts, *scalars, *blocks, *buffers, *scratch,
                            fill=functools.partial(utils.get_uninitialized_array,
                                                   uninitialized_memory=memory))
        first_buffer = num_index + num_inputs
        buffers = new[first_buffer:first_buffer + num_outputs]
        scratch = new[first_buffer + num_outputs:]
        outs = [hlo._dynamic_update_slice(s, shape, o, b, sq) for s, shape, o, b, sq
                in zip(starts[num_inputs:], out_shapes, outs, buffers, squeezed[num_inputs:])]
        new_last, new_visited = [], []
        for index, counts, before, seen in zip(indices[num_inputs:], block_counts[num_inputs:],
                                               last, visited):
            block = jnp.int32(0)
            for position, count in zip(index, counts):
                block = block * count + jnp.clip(position, 0, count - 1)
            # The TPU interpreter stops at a block visited again after the grid left it.
            doubt = doubt | ((block != before) & seen[block])
            new_last.append(block)
            new_visited.append(seen.at[block].set(True))
        return i + 1, outs, buffers, scratch, new_last, new_visited, doubt

    def share(core_index: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
        # One loop over the cores' shares, not one per share: the grid step is traced and
        # lowered once whatever the number of cores.
        outputs, doubt = carry
        first = core_index * per_core
        end = jnp.minimum(first + per_core, steps)
        carry = (first, outputs, buffers, scratch, [jnp.int32(-1)] * num_outputs, visited,
                 doubt)
        _, outputs, _, _, _, _, doubt = lax.while_loop(lambda c: c[0] < end, step, carry)
        return outputs, doubt

    if shares == 1:
        outputs, doubt = share(jnp.int32(0), (outputs, jnp.bool_(False)))
    else:
        outputs, doubt = lax.fori_loop(0, shares, share, (outputs, jnp.bool_(False)))
    kernel = jax_internals.kernel_name({"jaxpr": jaxpr, "name": name})

    def tell() -> None:
        io_callback(functools.partial(_doubted, kernel), None, ordered=False)

    lax.cond(doubt, tell, lambda: None)
    return [lax.slice(o, (0,) * o.ndim, tuple(m.array_aval.shape))
            for o, m in zip(outputs, out_mappings)]


# Primitives whose equations _evaluate traces again: a program id or a grid size read inside a
# nested jaxpr stays an equation when the kernel is discharged (outside any grid point), and
# JAX's plain interpreter then fails to lower it ("MLIR translation rule for primitive
# 'program_id' not found"); a pl.run_scoped buffer is filled here as the TPU interpreter fills
# it (the plain interpreter's lowering of run_scoped fills the integer minimum and False).
_GRID_READS = frozenset({"program_id", "num_programs", "run_scoped"})
_INLINED_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
                  "core_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
                  "custom_vjp_call": "call_jaxpr"}


def _nested_reads_grid(eqn: Any) -> bool:
    """Whether ``eqn`` allocates scoped buffers or a jaxpr nested in it reads the grid."""
    if eqn.primitive.name == "run_scoped":
        return True
    return any(_jaxpr_reads_grid(sub) for value in eqn.params.values()
               for sub in _sub_jaxprs(value))


@functools.lru_cache(maxsize=1024)
def _jaxpr_reads_grid(jaxpr: Any) -> bool:
    return any(eqn.primitive.name in _GRID_READS or _nested_reads_grid(eqn)
               for eqn in jaxpr.eqns)


def _sub_jaxprs(value: Any) -> Iterator[Any]:
    if hasattr(value, "eqns"):
        yield value
    elif hasattr(value, "jaxpr") and hasattr(getattr(value, "jaxpr"), "eqns"):
        yield value.jaxpr
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _sub_jaxprs(item)


def _inner(value: Any) -> tuple[Any, Any]:
    """(Jaxpr, consts) of a Jaxpr or ClosedJaxpr."""
    if hasattr(value, "jaxpr") and hasattr(value, "consts"):
        return value.jaxpr, value.consts
    return value, ()


def _evaluate(jaxpr: Any, consts: Any, *args: Any, fill: Callable[..., Any]) -> list[Any]:
    """``jaxpr`` evaluated into the current trace under the current grid point: as
    ``core.eval_jaxpr``, but a nested jaxpr that reads the grid (:data:`_GRID_READS`) is
    traced again here (through ``lax.switch``, ``lax.scan``, ``lax.while_loop`` or inline),
    so that its program ids are this grid point's and its scoped buffers start as ``fill``
    makes them."""
    env: dict[Any, Any] = {}

    def read(atom: Any) -> Any:
        return atom.val if type(atom).__name__ == "Literal" else env[atom]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name, params = eqn.primitive.name, eqn.params
        if not _nested_reads_grid(eqn):
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))
        elif name == "cond":
            index, *operands = invals
            branches = [functools.partial(_evaluate_closed, branch, fill=fill)
                        for branch in params["branches"]]
            outs = lax.switch(index, branches, *operands)
        elif name == "scan":
            outs = _scan(params, invals, fill)
        elif name == "while":
            outs = _while(params, invals, fill)
        elif name == "run_scoped":
            outs = _run_scoped(params, invals, fill)
        elif name in _INLINED_CALLS:
            inner, inner_consts = _inner(params[_INLINED_CALLS[name]])
            outs = _evaluate(inner, inner_consts, *invals, fill=fill)
        else:
            raise JaxInternalsChanged(f"the plain path cannot trace {name!r} again")
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for var, value in zip(eqn.outvars, outs):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _evaluate_closed(closed: Any, *args: Any, fill: Callable[..., Any]) -> list[Any]:
    inner, consts = _inner(closed)
    return _evaluate(inner, consts, *args, fill=fill)


def _scan(params: dict[str, Any], invals: list[Any], fill: Callable[..., Any]) -> list[Any]:
    num_consts, num_carry = scan_operand_counts(params)
    consts, init, xs = invals[:num_consts], invals[num_consts:num_consts + num_carry], \
        invals[num_consts + num_carry:]

    def body(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        out = _evaluate_closed(params["jaxpr"], *consts, *carry, *x, fill=fill)
        return list(out[:num_carry]), list(out[num_carry:])

    carry, ys = lax.scan(body, list(init), list(xs), length=params["length"],
                         reverse=params["reverse"], unroll=params.get("unroll", 1))
    return [*carry, *ys]


def _while(params: dict[str, Any], invals: list[Any], fill: Callable[..., Any]) -> list[Any]:
    cond_n, body_n = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts, init = invals[:cond_n], invals[cond_n:cond_n + body_n], \
        invals[cond_n + body_n:]
    return list(lax.while_loop(
        lambda carry: _evaluate_closed(params["cond_jaxpr"], *cond_consts, *carry,
                                       fill=fill)[0],
        lambda carry: list(_evaluate_closed(params["body_jaxpr"], *body_consts, *carry,
                                            fill=fill)),
        list(init)))


def _run_scoped(params: dict[str, Any], invals: list[Any], fill: Callable[..., Any]
                ) -> list[Any]:
    """A ``pl.run_scoped`` whose body JAX's discharge left with refs: its buffers discharged
    into values that start as ``fill`` makes them (the TPU interpreter's fill)."""
    pe = jax_internals.private_attribute(_PARTIAL_EVAL)
    discharge = jax_internals.private_attribute(_STATE_DISCHARGE, "discharge_state")
    core = jax_internals.private_attribute(_CORE)
    body = params["jaxpr"]
    body, body_consts = _inner(body)
    if body_consts:
        raise JaxInternalsChanged("a discharged pl.run_scoped body closes over constants")
    noconst = pe.convert_constvars_jaxpr(body)
    closed = discharge(core.ClosedJaxpr(noconst, ()), should_discharge=True)
    allocations = closed.jaxpr.invars[len(invals):]
    init = [fill(v.aval.shape, v.aval.dtype) for v in allocations]
    return _evaluate(closed.jaxpr, closed.consts, *invals, *init, fill=fill)[:len(body.outvars)]
