"""SparseCore kernels (``pl.kernel`` over a ``plsc.VectorSubcoreMesh`` or
``plsc.ScalarSubcoreMesh``) in JAX's TPU interpreter, every instance of them.

JAX's interpreter (0.10.2 to 0.12) runs such a kernel as one instance: its mesh becomes a grid
of "core" and "subcore" axes that are not "parallel", so one interpreter core walks the whole
grid, and ``lax.axis_index`` of any mesh axis answers that core's id (0). A kernel whose 32
subcores each write their own row wrote row 0, 32 times: a correct kernel failed. And the
SparseCore's own primitives (``plsc.subcore_barrier``, ``load_gather``, ``store_scatter``,
``parallel_loop``, ...) have no rule there.

Here each instance is an interpreter core of its own, as JAX already does for a
``TensorCoreMesh``: ``mesh.size`` cores, each running its one grid point on its own thread.
``axis_index`` of the core axis answers ``core_id // subcores``, of the subcore axis
``core_id % subcores``. The memory spaces are the chip's (``tpu_info.SparseCoreInfo``, JAX's
docstrings): VMEM (TileSPMEM) and SMEM are each subcore's own, as the interpreter gives each
core its own; VMEM_SHARED (Spmem) is one per SparseCore, shared by its subcores (the
interpreter would give each core its own: here every subcore reads and writes its
SparseCore's first subcore's); HBM is the device's. ``plsc.subcore_barrier`` waits for the
subcores of one SparseCore and orders their accesses for the race detector;
``plsc.fetch_and_add`` adds to another subcore's SMEM atomically. The SparseCore's value
primitives run on the CPU by ``sparsecore_primitives``.

What cannot run as the chip does skips the test at the kernel's trace, before it computes
anything, with one line naming the limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import types
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import callback
from jax.experimental.pallas import tpu as pltpu

from .interpreter_threads import per_core_programs_compiled_once
from .jax_internals import JaxInternalsChanged, attributes_replaced, private_attribute
from .pytest_internals import skip_at_test
from .sparsecore_copies import copy_rows, plan_copy
from .sparsecore_lowering import mosaic_refusal
from .sparsecore_primitives import sparsecore_values_on_the_cpu

SC_CORE = "jax._src.pallas.mosaic.sc_core"
SC_PRIMITIVES = "jax._src.pallas.mosaic.sc_primitives"
INTERPRETER = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"
PALLAS_CALL = "jax._src.pallas.pallas_call"

# Set on the interpreter's shared memory (one object per running kernel) by a SparseCore
# kernel's instances as they start: the subcores per SparseCore, for VMEM_SHARED and barriers.
_SUBCORES = "_pytest_pallas_subcores"
_BARRIERS = "_pytest_pallas_subcore_barriers"


class SparseCoreLimit(NotImplementedError):
    """A SparseCore kernel that JAX's TPU interpreter cannot run as the chip does."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """A SparseCore kernel's instances: ``cores`` SparseCores of ``subcores`` subcores each
    (1 on a scalar subcore mesh), and the mesh's axis names for them."""

    cores: int
    subcores: int
    core_axis: str
    subcore_axis: str | None
    kernel: Any  # the kernel's jaxpr, as the interpreter is handed it
    name: str

    @property
    def instances(self) -> int:
        return self.cores * self.subcores

    def axis_sizes(self) -> dict[str, int]:
        sizes = {self.core_axis: self.cores}
        if self.subcore_axis is not None:
            sizes[self.subcore_axis] = self.subcores
        return sizes


def layout_of(mesh: Any, jaxpr: Any = None, name: str | None = None) -> Layout | None:
    """The :class:`Layout` of a kernel over ``mesh``; None for any other mesh (or none)."""
    try:
        sc_core = private_attribute(SC_CORE)
    except JaxInternalsChanged:
        return None
    if isinstance(mesh, sc_core.VectorSubcoreMesh):
        return Layout(int(mesh.num_cores), int(mesh.num_subcores), mesh.core_axis_name,
                      mesh.subcore_axis_name, jaxpr, name or "")
    if isinstance(mesh, sc_core.ScalarSubcoreMesh):
        return Layout(int(mesh.num_cores), 1, mesh.axis_name, None, jaxpr, name or "")
    return None


# The layout of the SparseCore kernel whose interpretation is being traced on this thread:
# the interpreter traces a kernel's every core (thread_map's trace too) inside its lowering.
_TRACING = threading.local()


def _tracing() -> Layout | None:
    return getattr(_TRACING, "layout", None)


def interpreting_sparsecore_kernel() -> bool:
    """Whether the TPU interpreter is tracing a SparseCore kernel on this thread, with every
    instance run here (inside :func:`sparsecore_kernels_interpreted`)."""
    return _tracing() is not None


# --- what the chip has that the interpreter cannot model -----------------------------------


def _sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """The jaxprs among an equation's params: open ones, and closed ones' (jax 0.12 has no
    ClosedJaxpr class of its own)."""
    for value in params.values():
        values = value if isinstance(value, (tuple, list)) else (value,)
        for item in values:
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):
                yield item.jaxpr


def unsupported(jaxpr: Any, layout: Layout) -> str | None:
    """What of ``jaxpr`` (a SparseCore kernel's, sub-jaxprs included) the interpreter cannot
    run as the chip does, in a few words; None when it can run it all."""
    state_types = private_attribute("jax._src.state.types")
    tpu_core = private_attribute("jax._src.pallas.mosaic.core")
    dma_start = private_attribute("jax._src.pallas.mosaic.primitives", "dma_start_p")
    pending = [jaxpr]
    while pending:
        current = pending.pop()
        for eqn in current.eqns:
            if eqn.primitive is dma_start:
                plan = plan_copy(eqn)
                if plan is not None and plan.limit is not None:
                    return plan.limit
            if eqn.primitive.name == "run_scoped" and layout.subcores > 1:
                for var in eqn.params["jaxpr"].invars:
                    aval = var.aval
                    if (isinstance(aval, state_types.AbstractRef)
                            and aval.memory_space is tpu_core.MemorySpace.VMEM_SHARED):
                        return ("a VMEM_SHARED buffer allocated inside the kernel "
                                "(pl.run_scoped), one per SparseCore for its subcores")
            pending.extend(_sub_jaxprs(eqn.params))
    return None


# --- the interpreter's callbacks added for SparseCores -------------------------------------


def _interpreter() -> Any:
    return private_attribute(INTERPRETER)


def _mark_sparsecore_kernel(token: Any, *, subcores: int) -> Any:
    """Tell the running kernel's shared memory how many subcores a SparseCore has."""
    shared = _interpreter()._get_shared_memory()
    setattr(shared, _SUBCORES, subcores)
    return token


class _SubcoreBarrier:
    """One SparseCore's ``plsc.subcore_barrier``: its subcores wait for each other, then each
    goes on with what the others did before it (their vector clocks joined)."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.generation = 0
        self.condition = threading.Condition()

    def wait(self, shared: Any, on_release: Any) -> None:
        with self.condition:
            generation = self.generation
            self.arrived += 1
            if self.arrived == self.parties:
                on_release()
                self.arrived = 0
                self.generation += 1
                self.condition.notify_all()
                return
        while True:
            shared.check_failed()  # another core failed: stop waiting, as its semaphores do
            with self.condition:
                if self.generation != generation:
                    return
                self.condition.wait(timeout=0.1)


def _subcore_barrier(token: Any, device_id: Any, local_core_id: Any, *, subcores: int) -> Any:
    shared = _interpreter()._get_shared_memory()
    device, core = int(device_id), int(local_core_id) // subcores
    with shared.lock:
        barriers = getattr(shared, _BARRIERS, None)
        if barriers is None:
            barriers = {}
            setattr(shared, _BARRIERS, barriers)
        barrier = barriers.setdefault((device, core), _SubcoreBarrier(subcores))
    first = shared.get_global_core_id(device, core * subcores)

    def release() -> None:
        if shared.detect_races:
            shared.update_clocks(first, first + subcores)

    barrier.wait(shared, release)
    return token


def _fetch_and_add(token: Any, device_id: Any, local_core_id: Any, buffer_id: Any,
                   index: Any, value: Any, subcore: Any, *, subcores: int,
                   memory_space: str) -> tuple[Any, Any]:
    """``plsc.fetch_and_add``: add ``value`` at ``index`` of subcore ``subcore``'s SMEM buffer
    (of this subcore's SparseCore), atomically; the value before."""
    shared = _interpreter()._get_shared_memory()
    target = int(local_core_id) // subcores * subcores + int(subcore)
    key = (memory_space, int(buffer_id), int(device_id), target)
    where = tuple(int(i) for i in np.atleast_1d(index))
    with shared.lock:
        content = shared.mem[key].content
        old = np.array(content[where])
        content[where] = old + np.asarray(value, content.dtype)
    return token, old


# --- the interpreter's evaluation of a SparseCore kernel -----------------------------------


def _is_mesh_axis_index(eqn: Any, layout: Layout) -> bool:
    if eqn.primitive is not lax.axis_index_p:
        return False
    name = eqn.params["axis_name"]
    names = name if isinstance(name, tuple) else (name,)
    return all(n in layout.axis_sizes() for n in names)


class _Evaluation:
    """Evaluates one jaxpr of a SparseCore kernel: the SparseCore's equations here, runs of
    the others by the interpreter's own evaluation (``original``)."""

    def __init__(self, original: Any, layout: Layout, ctx: Any) -> None:
        self.original, self.layout, self.ctx = original, layout, ctx
        sc = private_attribute(SC_PRIMITIVES)
        self.rules = {
            sc.barrier_p: self.barrier,
            sc.parallel_loop_p: self.parallel_loop,
            sc.gather_p: self.gather,
            sc.scatter_p: self.scatter,
            sc.load_p: self.load,
            sc.swap_p: self.store,
            sc.fetch_and_add_p: self.fetch_and_add,
        }
        self.dma_start = private_attribute("jax._src.pallas.mosaic.primitives", "dma_start_p")

    def ours(self, eqn: Any) -> bool:
        if eqn.primitive is self.dma_start:
            return plan_copy(eqn) is not None
        return eqn.primitive in self.rules or _is_mesh_axis_index(eqn, self.layout)

    def run(self, jaxpr: Any, args: tuple, token: Any) -> tuple[Any, list]:
        core = private_attribute("jax._src.core")
        env = dict(zip([*jaxpr.constvars, *jaxpr.invars], args))

        def read(var: Any) -> Any:
            return var.val if isinstance(var, core.Literal) else env[var]

        piece: list = []
        for eqn in [*jaxpr.eqns, None]:
            if eqn is not None and not self.ours(eqn):
                piece.append(eqn)
                continue
            if piece:
                token = self._run_piece(piece, env, read, token)
                piece = []
            if eqn is None:
                break
            invals = [read(var) for var in eqn.invars]
            if eqn.primitive is self.dma_start:
                token, outs = self.copy(eqn, invals, token)
            elif eqn.primitive in self.rules:
                token, outs = self.rules[eqn.primitive](eqn, invals, token)
            else:
                outs = [self.axis_index(eqn)]
            for var, value in zip(eqn.outvars, outs):
                if not isinstance(var, core.DropVar):
                    env[var] = value
        return token, [read(var) for var in jaxpr.outvars]

    def _run_piece(self, piece: list, env: dict, read: Any, token: Any) -> Any:
        """The equations of ``piece`` by the interpreter's evaluation, as a jaxpr of their own
        (only what the evaluation reads of one: its variables and equations)."""
        core = private_attribute("jax._src.core")
        inputs, defined, seen = [], set(), set()
        for eqn in piece:
            for var in eqn.invars:
                if isinstance(var, core.Literal) or var in defined or var in seen:
                    continue
                seen.add(var)
                inputs.append(var)
            defined.update(eqn.outvars)
        outputs = [var for eqn in piece for var in eqn.outvars
                   if not isinstance(var, core.DropVar)]
        part = types.SimpleNamespace(constvars=[], invars=inputs, outvars=outputs, eqns=piece)
        token, values = self.original(part, *(read(var) for var in inputs),
                                      ctx=self.ctx, token=token)
        env.update(zip(outputs, values))
        return token

    # -- the rules ---------------------------------------------------------------------------

    def axis_index(self, eqn: Any) -> Any:
        layout, core_id = self.layout, self.ctx.local_core_id
        position = {layout.core_axis: core_id // layout.subcores}
        if layout.subcore_axis is not None:
            position[layout.subcore_axis] = core_id % layout.subcores
        name = eqn.params["axis_name"]
        index = jnp.int32(0)
        for n in (name if isinstance(name, tuple) else (name,)):
            index = index * layout.axis_sizes()[n] + position[n]
        return jnp.asarray(index, jnp.int32)

    def _callback(self, function: Any, result: Any, token: Any, *args: Any, **params: Any
                  ) -> Any:
        interpreter = _interpreter()
        token_type = interpreter.TOKEN_SHAPE_DTYPE
        wrapped = interpreter.fail_on_exception(functools.partial(function, **params))
        shapes = token_type if result is None else (token_type, result)
        return callback.io_callback(wrapped, shapes, token, *args)

    def barrier(self, eqn: Any, invals: list, token: Any) -> tuple[Any, list]:
        token = self._callback(_subcore_barrier, None, token, self.ctx.device_id,
                               self.ctx.local_core_id, subcores=self.layout.subcores)
        return token, []

    def parallel_loop(self, eqn: Any, invals: list, token: Any) -> tuple[Any, list]:
        """``plsc.parallel_loop``: its iterations in order, one after the other (a schedule the
        chip may take: they are independent by the loop's contract)."""
        lower, upper, step, consts, carry = eqn.params["tree"].unflatten(invals)
        body_jaxpr = eqn.params["jaxpr"]
        interpret = _interpreter()._interpret_jaxpr  # this wrapper, for the body's own
        step = jnp.asarray(step, jnp.int32)
        upper = jnp.asarray(upper, jnp.int32)

        def more(state: Any) -> Any:
            _, index, _ = state
            return jnp.where(step > 0, index < upper, index > upper)

        def iteration(state: Any) -> Any:
            token, index, values = state
            token, values = interpret(body_jaxpr, *consts, index, *values, ctx=self.ctx,
                                      token=token)
            return token, index + step, list(values)

        start = (token, jnp.asarray(lower, jnp.int32), list(carry))
        token, _, out = lax.while_loop(more, iteration, start)
        return token, list(out)

    def _memory_space(self, aval: Any, what: str) -> Any:
        interpreter = _interpreter()
        space = interpreter._get_memory_space_and_raise_if_hbm(aval, what)
        return interpreter.TPU_MEMORY_SPACE_IDXS[space]

    def _read(self, eqn: Any, ref: Any, transforms: Any, token: Any, aval: Any = None
              ) -> tuple[Any, Any]:
        """The whole of ``ref`` (of ``aval``, the equation's first operand's by default) seen
        through ``transforms``, by the interpreter's own read."""
        state = private_attribute("jax._src.state")
        interpreter = _interpreter()
        aval = eqn.invars[0].aval if aval is None else aval
        view = state.transform_type(tuple(transforms), aval)
        space = self._memory_space(aval, eqn.primitive.name)
        return jax.experimental.io_callback(
            functools.partial(interpreter.get, source_info=eqn.source_info),
            (interpreter.TOKEN_SHAPE_DTYPE, jax.ShapeDtypeStruct(view.shape, view.dtype)),
            token, self.ctx.device_id, self.ctx.local_core_id, space, ref, tuple(transforms))

    def _write(self, eqn: Any, ref: Any, transforms: Any, value: Any, token: Any) -> Any:
        interpreter = _interpreter()
        space = self._memory_space(eqn.invars[0].aval, eqn.primitive.name)
        token, _ = jax.experimental.io_callback(
            functools.partial(interpreter.swap, source_info=eqn.source_info),
            (interpreter.TOKEN_SHAPE_DTYPE, jax.ShapeDtypeStruct(value.shape, value.dtype)),
            token, self.ctx.device_id, self.ctx.local_core_id, space, ref, tuple(transforms),
            value, None)
        return token

    def _undefined(self, dtype: Any) -> Any:
        """What a lane the chip leaves undefined holds here: the interpreter's poison."""
        utils = private_attribute("jax._src.pallas.mosaic.interpret.utils")
        return utils.get_uninitialized_value(dtype,
                                             self.ctx.interpret_params.uninitialized_memory)

    def gather(self, eqn: Any, invals: list, token: Any) -> tuple[Any, list]:
        """``plsc.load_gather``: ``ref[indices[0][k], indices[1][k], ...]`` in lane ``k``; a
        lane the mask leaves out is undefined."""
        ref, transforms, indices, mask = eqn.params["tree"].unflatten(invals)
        token, whole = self._read(eqn, ref, transforms, token)
        out = whole[tuple(indices)]
        if mask is not None:
            out = jnp.where(mask, out, jnp.asarray(self._undefined(out.dtype), out.dtype))
        return token, [out]

    def scatter(self, eqn: Any, invals: list, token: Any) -> tuple[Any, list]:
        """``plsc.store_scatter`` and ``addupdate_scatter``: lane ``k`` of ``x`` to (added to)
        ``ref[indices[0][k], ...]``; lanes the mask leaves out write nothing."""
        ref, transforms, indices, x, mask = eqn.params["tree"].unflatten(invals)
        token, whole = self._read(eqn, ref, transforms, token)
        indices = list(indices)
        if mask is not None:  # out of range: the scatter drops it
            indices[0] = jnp.where(mask, indices[0], whole.shape[0])
        at = whole.at[tuple(indices)]
        new = at.add(x, mode="drop") if eqn.params["add"] else at.set(x, mode="drop")
        return self._write(eqn, ref, transforms, new, token), []

    def load(self, eqn: Any, invals: list, token: Any) -> tuple[Any, list]:
        """``plsc.load_expanded``: the ``i``-th set lane of the mask holds the ``i``-th element
        of ``ref``; the others are undefined."""
        has_mask = eqn.params["has_mask"]
        ref, *rest = invals
        flat, mask = (rest[:-1], rest[-1]) if has_mask else (rest, None)
        transforms = eqn.params["tree"].unflatten(flat)
        token, whole = self._read(eqn, ref, transforms, token)
        if mask is None:
            return token, [whole]
        flat_mask = mask.reshape(-1)
        source = jnp.cumsum(flat_mask.astype(jnp.int32)) - 1
        picked = whole.reshape(-1)[jnp.clip(source, 0, whole.size - 1)]
        undefined = jnp.asarray(self._undefined(whole.dtype), whole.dtype)
        return token, [jnp.where(flat_mask, picked, undefined).reshape(whole.shape)]

    def store(self, eqn: Any, invals: list, token: Any) -> tuple[Any, list]:
        """``plsc.store_compressed``, ``addupdate`` and ``addupdate_compressed``: the
        ``i``-th set lane of the mask to (added to) the ``i``-th element of ``ref``; without a
        mask, every lane to its own. Returns what ``ref`` held."""
        has_mask = eqn.params["has_mask"]
        ref, x, *rest = invals
        flat, mask = (rest[:-1], rest[-1]) if has_mask else (rest, None)
        transforms = eqn.params["tree"].unflatten(flat)
        token, whole = self._read(eqn, ref, transforms, token)
        if mask is None:
            new = whole + x if eqn.params["add"] else x
        else:
            flat_mask = mask.reshape(-1)
            target = jnp.where(flat_mask, jnp.cumsum(flat_mask.astype(jnp.int32)) - 1,
                               whole.size)
            at = whole.reshape(-1).at[target]
            values = x.reshape(-1)
            new = (at.add(values, mode="drop") if eqn.params["add"]
                   else at.set(values, mode="drop")).reshape(whole.shape)
        return self._write(eqn, ref, transforms, new.astype(whole.dtype), token), [whole]

    def _index_values(self, eqn: Any, index: Any, var: Any, token: Any) -> tuple[Any, Any]:
        """The values of an indexed copy's index (an array, a ref, a ref's view, or
        ``plsc.Indices`` of one), read where a ref holds them."""
        state_types = private_attribute("jax._src.state.types")
        if hasattr(index, "ignored_value") and hasattr(index, "values"):
            return self._index_values(eqn, index.values, var.values, token)
        if isinstance(index, state_types.TransformedRef):
            return self._read(eqn, index.ref, index.transforms, token, aval=var.ref.aval)
        if isinstance(getattr(var, "aval", None), state_types.AbstractRef):
            return self._read(eqn, index, (), token, aval=var.aval)
        return token, jnp.asarray(index)

    def _copy_space(self, aval: Any) -> Any:
        interpreter = _interpreter()
        space = interpreter._forward_any_to_hbm(getattr(aval, "memory_space", None))
        if space is None:  # as the interpreter's own copies read it
            space = private_attribute("jax._src.pallas.mosaic.core").MemorySpace.HBM
        return interpreter.TPU_MEMORY_SPACE_IDXS[space]

    def copy(self, eqn: Any, invals: list, token: Any) -> tuple[Any, list]:
        """An indexed or adding ``dma_start`` (``sparsecore_copies``), run whole as it
        starts; its wait is the interpreter's."""
        primitives = private_attribute("jax._src.pallas.mosaic.primitives")
        discharge = private_attribute("jax._src.state.discharge")
        plan = plan_copy(eqn)
        tree = eqn.params["tree"]
        src, dst, dst_sem, src_sem, _ = tree.unflatten(invals)
        src_var, dst_var, *_ = tree.unflatten(eqn.invars)
        split = primitives._get_ref_and_transforms
        (src_ref, src_transforms), (dst_ref, dst_transforms) = split(src), split(dst)
        sides = [list(src_transforms), list(dst_transforms)]
        if plan.side is not None:
            transforms = tuple(sides[plan.side])
            var_transforms = split((src_var, dst_var)[plan.side])[1]
            index = transforms[plan.transform].indices[plan.entry]
            index_var = var_transforms[plan.transform].indices[plan.entry]
            token, values = self._index_values(eqn, index, index_var, token)
            indexer = transforms[plan.transform]
            entries = list(indexer.indices)
            entries[plan.entry] = values.reshape(-1)
            sides[plan.side][plan.transform] = dataclasses.replace(
                indexer, indices=tuple(entries))
        semaphores = []
        for semaphore in (dst_sem, src_sem):
            if semaphore is None:
                semaphores.append(None)
                continue
            ref, transforms = split(semaphore)
            semaphores.append(discharge.transform_array(ref, transforms))
        token = self._callback(
            copy_rows, None, token, self.ctx.device_id, self.ctx.local_core_id,
            self._copy_space(split(src_var)[0].aval), src_ref, tuple(sides[0]),
            self._copy_space(split(dst_var)[0].aval), dst_ref, tuple(sides[1]),
            semaphores[0], semaphores[1], plan=plan, source_info=eqn.source_info)
        return token, []

    def fetch_and_add(self, eqn: Any, invals: list, token: Any) -> tuple[Any, list]:
        ref, value, *indices, subcore = invals
        index = jnp.stack([jnp.asarray(i, jnp.int32) for i in indices]) if indices else (
            jnp.zeros((0,), jnp.int32))
        space = self._memory_space(eqn.invars[0].aval, eqn.primitive.name)
        names = _interpreter().TPU_MEMORY_SPACE_NAMES
        token, old = self._callback(
            _fetch_and_add, jax.ShapeDtypeStruct((), value.dtype), token,
            self.ctx.device_id, self.ctx.local_core_id, ref, index, value, subcore,
            subcores=self.layout.subcores, memory_space=names[int(space)])
        return token, [old]


class _MemorySpaceIndices(dict):
    """The interpreter's memory-space table, which also knows a memory space tied to a mesh
    (``pltpu.VMEM(...) @ mesh``: a "VMEM@SC_VECTOR_SUBCORE" its table lacked) as the memory
    space it names. A semaphore tied to a mesh is left out: the interpreter tells semaphores
    by identity, and would take it for a buffer."""

    def __missing__(self, key: Any) -> int:
        base = getattr(key, "memory_space", None)
        semaphore = private_attribute("jax._src.pallas.mosaic.core").MemorySpace.SEMAPHORE
        if getattr(key, "mesh", None) is not None and base is not semaphore and base in self:
            return self[base]
        raise KeyError(key)


# --- the context manager --------------------------------------------------------------------


@contextlib.contextmanager
def sparsecore_kernels_interpreted(on_limit: Any = skip_at_test) -> Iterator[bool]:
    """Inside the block, JAX's TPU interpreter runs every instance of a SparseCore kernel (see
    the module docstring). A kernel it cannot run as the chip does is stopped at its trace by
    ``on_limit(message)`` (the running test skips), or :class:`SparseCoreLimit` where that
    returns. Yields False where this JAX has no SparseCore meshes or its interpreter moved;
    kernels then run as JAX runs them."""
    try:
        interpreter = _interpreter()
        pallas_call = private_attribute(PALLAS_CALL)
        original_lowering = pallas_call._pallas_call_lowering
        original_interpret = interpreter._interpret_jaxpr
        original_core_of = interpreter._local_core_id_or_zero_if_hbm
        params_class = private_attribute(
            "jax._src.pallas.mosaic.interpret.params", "InterpretParams")

        private_attribute(SC_CORE, "VectorSubcoreMesh")
        private_attribute(SC_PRIMITIVES, "barrier_p")
        shared_space = pltpu.MemorySpace.VMEM_SHARED.value
    except (JaxInternalsChanged, AttributeError, ImportError):
        yield False
        return

    def lowering(ctx: Any, *in_nodes: Any, interpret: Any, **params: Any) -> Any:
        layout = layout_of(params.get("mesh"), params.get("jaxpr"), params.get("name"))
        if layout is None or not isinstance(interpret, params_class):
            return original_lowering(ctx, *in_nodes, interpret=interpret, **params)
        refusal = mosaic_refusal(ctx, params)
        if refusal is not None:
            raise refusal  # what JAX raises on the chip, lowering the kernel for Mosaic
        limit = unsupported(params["jaxpr"], layout)
        if limit is not None:
            message = (f"pallas: JAX's TPU interpreter cannot run SparseCore kernel "
                       f"{layout.name or 'kernel'!r} as the chip does: {limit}")
            on_limit(message)
            raise SparseCoreLimit(message)
        grid = params["grid_mapping"].grid
        compiler_params = params.get("compiler_params") or pltpu.CompilerParams()
        params = {**params, "compiler_params": compiler_params.replace(
            dimension_semantics=("parallel",) * len(grid))}
        interpret = dataclasses.replace(interpret, num_cores_or_threads=layout.instances)
        previous = _tracing()
        _TRACING.layout = layout
        try:
            return original_lowering(ctx, *in_nodes, interpret=interpret, **params)
        finally:
            _TRACING.layout = previous

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        layout = _tracing()
        if layout is None:
            return original_interpret(jaxpr, *args, ctx=ctx, token=token)
        evaluation = _Evaluation(original_interpret, layout, ctx)
        top = jaxpr is layout.kernel
        if not top and not any(evaluation.ours(eqn) for eqn in jaxpr.eqns):
            return original_interpret(jaxpr, *args, ctx=ctx, token=token)
        if top:
            token = evaluation._callback(_mark_sparsecore_kernel, None, token,
                                         subcores=layout.subcores)
        return evaluation.run(jaxpr, args, token)

    def local_core_id_or_zero_if_hbm(local_core_id: int, memory_space: str) -> int:
        if memory_space == shared_space:
            subcores = getattr(interpreter._shared_memory, _SUBCORES, None)
            if subcores:  # one VMEM_SHARED per SparseCore: its first subcore's
                return int(local_core_id) // subcores * subcores
        return original_core_of(local_core_id, memory_space)

    with (attributes_replaced(pallas_call, {"_pallas_call_lowering": lowering}),
          attributes_replaced(interpreter, {
              "TPU_MEMORY_SPACE_IDXS": _MemorySpaceIndices(interpreter.TPU_MEMORY_SPACE_IDXS),
              "_interpret_jaxpr": interpret_jaxpr,
              "_local_core_id_or_zero_if_hbm": local_core_id_or_zero_if_hbm}),
          sparsecore_values_on_the_cpu(),
          # 16 to 64 cores of one program: compiled once, not per core and call.
          per_core_programs_compiled_once()):
        yield True
