"""The project's own model of a ``pallas_call``: its operands, blocks, scratch and
scoped allocations as plain values (``PallasCallInfo``), read once from the
equation's params by ``describe_pallas_call``. Checks, the grid coverage and the
estimate read this model, not JAX's params.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._compat import jax_internals
from .._compat.jax_internals import CORE_MODULE, SOURCE_INFO_MODULE, JaxInternalsChanged
from . import index_maps
from .block_reads import reads_before_writing
from .jaxpr_analysis import sub_jaxprs

if TYPE_CHECKING:
    import numpy as np


@dataclasses.dataclass(frozen=True)
class BlockOperand:
    """One input or output of a pallas_call, as its BlockSpec maps it."""

    role: str  # "input" or "output"
    index: int  # position among the flat inputs (or outputs)
    origin: str  # Pallas' own name: "args[0]", "outputs[1]", ...
    parameter: str | None  # the kernel parameter that receives the block
    block_dims: tuple[tuple[str, int], ...]  # ("blocked" | "squeezed" | "element" | ..., size)
    array_shape: tuple[int, ...]
    dtype: np.dtype
    memory_space: str  # "vmem", "smem", "any", "hbm", "semaphore", ...
    buffer_count: int | None  # pl.Buffered(n), or None for the default
    revisit_any: bool  # pl.Buffered(revisit=pl.RevisitMode.ANY)
    trivial_window: bool  # whole array and an index map of zeros
    aliased: bool  # output aliased to an input (or input aliased to an output)
    index_map_reads_scalar_prefetch: bool
    index_map_axes: frozenset[int]  # grid axes the index map depends on
    # An output whose block the kernel may read before writing it whole (block_reads).
    read_before_written: bool = True
    _index_map: Any = dataclasses.field(repr=False, compare=False, default=None)
    _num_grid_axes: int = dataclasses.field(repr=False, compare=False, default=0)

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The block's size along every array dimension (a squeezed dimension counts 1)."""
        return tuple(size for _, size in self.block_dims)

    @property
    def ref_shape(self) -> tuple[int, ...]:
        """The shape of the Ref the kernel sees (squeezed dimensions dropped)."""
        return tuple(size for kind, size in self.block_dims if kind != "squeezed")

    def block_indices(self, grid_points: np.ndarray) -> np.ndarray:
        """The index map evaluated at each row of ``grid_points`` (shape (P, len(grid)))."""
        return _evaluate_index_map(self._index_map, self._num_grid_axes, grid_points)


@dataclasses.dataclass(frozen=True)
class ScratchOperand:
    index: int
    parameter: str | None
    shape: tuple[int, ...]
    dtype: Any  # a numpy dtype, or JAX's semaphore dtype
    memory_space: str


@dataclasses.dataclass(frozen=True)
class ScopedAllocation:
    shape: tuple[int, ...]
    dtype: Any
    memory_space: str
    where: str


@dataclasses.dataclass(frozen=True)
class ScopedRegion:
    """``pl.run_scoped`` allocations live together; children run one after another."""

    allocations: tuple[ScopedAllocation, ...]
    children: tuple[ScopedRegion, ...]


@dataclasses.dataclass(frozen=True)
class PallasCallInfo:
    """A pallas_call equation's params, as plain values."""

    name: str  # the pallas_call's name=, else the kernel function's name
    source: str | None  # "kernel_fn at file.py:12"
    grid: tuple[int | None, ...]  # None for a dynamic grid dimension
    dimension_semantics: tuple[str, ...]  # per grid axis; vmapped axes are "parallel"
    vmapped_axes: tuple[int, ...]
    num_scalar_prefetch: int
    operands: tuple[BlockOperand, ...]
    scratch: tuple[ScratchOperand, ...]
    scoped: ScopedRegion  # pl.run_scoped allocations in the kernel body
    vmem_limit_bytes: int | None
    for_tensor_core: bool  # False for GPU compiler params or a SparseCore mesh
    # A DMA signals a regular semaphore (pltpu.SemaphoreType.REGULAR, TPU v6+), not a DMA one.
    dma_signals_regular_semaphore: bool = False

    @property
    def title(self) -> str:
        source = jax_internals.short_source(self.source) if self.source else None
        if source and not source.startswith(self.name):
            return f"'{self.name}' ({source})"
        return f"'{source or self.name}'"


def describe_pallas_call(params: dict[str, Any]) -> PallasCallInfo:
    """Turn a pallas_call equation's params into a :class:`PallasCallInfo`."""
    try:
        grid_mapping = params["grid_mapping"]
        kernel_jaxpr = params["jaxpr"]
        block_mappings = tuple(grid_mapping.block_mappings)
        grid = tuple(grid_mapping.grid)
        num_inputs = grid_mapping.num_inputs
        num_index = grid_mapping.num_index_operands
        vmapped = tuple(grid_mapping.vmapped_dims)
        scratch_avals = tuple(grid_mapping.scratch_avals)
    except (KeyError, AttributeError) as error:
        raise JaxInternalsChanged(
            f"pallas_call params no longer carry the grid mapping as pytest-pallas expects "
            f"({error!r}); the TPU-fidelity checks cannot read this JAX's kernels."
        ) from error
    debug_info = getattr(kernel_jaxpr, "debug_info", None)
    source = getattr(debug_info, "func_src_info", None)
    name = params.get("name") or getattr(debug_info, "func_name", None) or "<kernel>"
    arg_names = getattr(debug_info, "arg_names", None)
    if arg_names is not None and len(arg_names) != len(kernel_jaxpr.invars):
        arg_names = None

    def parameter(position: int) -> str | None:
        return None if arg_names is None else arg_names[position]

    compiler_params = params.get("compiler_params")
    tpu_params = isinstance(compiler_params, pltpu.CompilerParams)
    mesh = params.get("mesh")
    for_tensor_core = (compiler_params is None or tpu_params) and (
        mesh is None or type(mesh).__name__ == "TensorCoreMesh"
    )
    user_semantics = compiler_params.dimension_semantics if tpu_params else None
    user_rank = len(grid) - len(vmapped)
    if user_semantics is None:
        user_semantics = ("arbitrary",) * user_rank
    user_semantics = tuple(str(getattr(s, "value", s)) for s in user_semantics)
    if len(user_semantics) == user_rank:
        it = iter(user_semantics)
        semantics = tuple(
            "parallel" if axis in vmapped else next(it) for axis in range(len(grid))
        )
    else:  # Mosaic rejects this mismatch itself; check what can be checked.
        semantics = ("arbitrary",) * len(grid)

    aliases = tuple(params.get("input_output_aliases") or ())
    aliased_inputs = {i - num_index for i, _ in aliases}
    aliased_outputs = {o for _, o in aliases}
    operands = []
    for position, mapping in enumerate(block_mappings):
        is_input = position < num_inputs
        index = position if is_input else position - num_inputs
        index_map = mapping.index_map_jaxpr
        pipeline_mode = getattr(mapping, "pipeline_mode", None)
        operands.append(
            BlockOperand(
                role="input" if is_input else "output",
                index=index,
                origin=str(mapping.origin),
                parameter=parameter(num_index + position),
                block_dims=tuple(_block_dim(dim, pl) for dim in mapping.block_shape),
                array_shape=tuple(mapping.array_aval.shape),
                dtype=mapping.array_aval.dtype,
                memory_space=memory_space_name(mapping.transformed_block_aval.memory_space),
                buffer_count=getattr(pipeline_mode, "buffer_count", None),
                revisit_any=getattr(pipeline_mode, "revisit", None) == pl.RevisitMode.ANY,
                trivial_window=bool(mapping.has_trivial_window()),
                aliased=(index in aliased_inputs) if is_input else (index in aliased_outputs),
                index_map_reads_scalar_prefetch=_reads_inputs_from(index_map.jaxpr, len(grid)),
                index_map_axes=_axes_reaching_outputs(index_map.jaxpr, len(grid)),
                read_before_written=is_input or _reads_block_first(kernel_jaxpr,
                                                                   num_index + position),
                _index_map=index_map,
                _num_grid_axes=len(grid),
            )
        )
    first_scratch = len(kernel_jaxpr.invars) - len(scratch_avals)
    scratch = tuple(
        ScratchOperand(
            index=i,
            parameter=parameter(first_scratch + i),
            shape=tuple(getattr(aval, "shape", ())),
            dtype=getattr(aval, "dtype", None),
            memory_space=memory_space_name(getattr(aval, "memory_space", None)),
        )
        for i, aval in enumerate(scratch_avals)
    )
    return PallasCallInfo(
        name=str(name),
        source=source,
        grid=tuple(g if isinstance(g, (int, np.integer)) else None for g in grid),
        dimension_semantics=semantics,
        vmapped_axes=vmapped,
        num_scalar_prefetch=num_index,
        operands=tuple(operands),
        scratch=scratch,
        scoped=ScopedRegion((), _scoped_regions(kernel_jaxpr)),
        vmem_limit_bytes=compiler_params.vmem_limit_bytes if tpu_params else None,
        for_tensor_core=bool(for_tensor_core),
        dma_signals_regular_semaphore=_dma_signals_regular_semaphore(kernel_jaxpr),
    )


# The dtype names of JAX's semaphore refs: SemaphoreType.REGULAR's, and SemaphoreType.DMA's.
_REGULAR_SEMAPHORE = "semaphore"


def _reads_block_first(kernel_jaxpr: Any, position: int) -> bool:
    """Whether the kernel may read its parameter ``position`` (an output's block) before
    writing it whole; True where the kernel's parameters are not its blocks alone."""
    invars = getattr(kernel_jaxpr, "invars", ())
    if position >= len(invars):
        return True
    return reads_before_writing(kernel_jaxpr, invars[position])


def _dma_signals_regular_semaphore(jaxpr: Any) -> bool:
    """Whether a DMA of the kernel (``dma_start``) takes a regular semaphore."""
    for eqn in getattr(jaxpr, "eqns", ()):
        if eqn.primitive.name == "dma_start" and any(
                str(getattr(getattr(v, "aval", None), "dtype", "")) == _REGULAR_SEMAPHORE
                for v in eqn.invars):
            return True
        for value in eqn.params.values():
            if any(_dma_signals_regular_semaphore(sub) for sub in sub_jaxprs(value)):
                return True
    return False


def _block_dim(dim: Any, pl: Any) -> tuple[str, int]:
    if isinstance(dim, pl.Squeezed):
        return ("squeezed", 1)
    kind = {
        "Blocked": "blocked",
        "Element": "element",
        "BoundedSlice": "bounded",
        "Indirect": "indirect",
    }.get(type(dim).__name__)
    if kind is None:
        raise JaxInternalsChanged(f"unknown Pallas block dimension {dim!r}")
    return (kind, int(dim.block_size))


def memory_space_name(memory_space: Any) -> str:
    if memory_space is None:
        return "vmem"  # Mosaic's choice for a pallas_call block on a TensorCore
    value = getattr(memory_space, "value", memory_space)
    if not isinstance(value, str):  # jax 0.12's pl.HOST: an enum member whose value is 2
        value = str(getattr(memory_space, "name", value)).lower()
    return {"default": "vmem", "semaphore_mem": "semaphore"}.get(value, value)


def _reads_inputs_from(jaxpr: Any, first: int) -> bool:
    watched = set(jaxpr.invars[first:])
    if not watched:
        return False
    used = {v for eqn in jaxpr.eqns for v in eqn.invars if not _is_literal(v)}
    used |= {v for v in jaxpr.outvars if not _is_literal(v)}
    return bool(watched & used)


def _axes_reaching_outputs(jaxpr: Any, num_axes: int) -> frozenset[int]:
    # Data flow through the index map: an equation's outputs depend on all
    # its inputs (conservative for higher-order equations).
    depends: dict[Any, frozenset[int]] = {
        var: frozenset({axis}) for axis, var in enumerate(jaxpr.invars[:num_axes])
    }
    for eqn in jaxpr.eqns:
        reached = frozenset().union(
            *(depends.get(v, frozenset()) for v in eqn.invars if not _is_literal(v))
        )
        for out in eqn.outvars:
            depends[out] = reached
    return frozenset().union(
        *(depends.get(v, frozenset()) for v in jaxpr.outvars if not _is_literal(v))
    )


def _is_literal(atom: Any) -> bool:
    return type(atom).__name__ == "Literal"


def _evaluate_index_map(index_map: Any, num_grid_axes: int, grid_points: np.ndarray) -> np.ndarray:
    """The block indices of ``index_map`` at each grid point: one row per point."""
    points = np.asarray(grid_points, dtype=np.int32)
    points = points.reshape(max(1, len(points)), num_grid_axes)
    columns = None
    if len(index_map.in_avals) == num_grid_axes:  # no scalar prefetch operand to read
        try:
            columns = index_maps.evaluate(index_map.jaxpr, index_map.consts,
                                          [points[:, a] for a in range(num_grid_axes)])
        except index_maps.NotEvaluated:
            columns = None
    if columns is None:
        columns = _evaluate_index_map_in_jax(index_map, num_grid_axes, points)
    if not columns:
        return np.zeros((points.shape[0], 0), dtype=np.int64)
    return np.stack([np.broadcast_to(np.asarray(c), (points.shape[0],)) for c in columns],
                    axis=1).astype(np.int64)


def _evaluate_index_map_in_jax(index_map: Any, num_grid_axes: int, points: np.ndarray
                               ) -> list[Any]:
    """JAX's own evaluation, for an index map ``index_maps`` does not model (it reads a
    scalar prefetch operand, say, which is taken as zeros)."""
    evaluate = jax_internals.private_attribute(CORE_MODULE, "eval_jaxpr")
    extra = [
        np.zeros(getattr(aval, "shape", ()), getattr(aval, "dtype", np.int32))
        for aval in index_map.in_avals[num_grid_axes:]
    ]

    def one_point(*axes: Any) -> tuple[Any, ...]:
        return tuple(evaluate(index_map.jaxpr, index_map.consts, *axes, *extra))

    # Index maps are evaluated while the kernel is being traced (an observer
    # runs inside the trace), so in JAX's eager context.
    with jax_internals.eager_evaluation(), jax.ensure_compile_time_eval():
        if num_grid_axes == 0:
            outs = [jnp.broadcast_to(o, (points.shape[0],)) for o in one_point()]
        else:
            outs = jax.vmap(one_point)(*(jnp.asarray(points[:, a]) for a in range(num_grid_axes)))
        return [np.asarray(o) for o in outs]


def _scoped_regions(jaxpr: Any) -> tuple[ScopedRegion, ...]:
    regions: list[ScopedRegion] = []
    for eqn in getattr(jaxpr, "eqns", ()):
        if eqn.primitive.name == "run_scoped":
            body = eqn.params["jaxpr"]
            body = getattr(body, "jaxpr", body)
            where = _summarize_source(eqn)
            allocations = tuple(
                ScopedAllocation(
                    shape=tuple(getattr(v.aval, "shape", ())),
                    dtype=getattr(v.aval, "dtype", None),
                    memory_space=memory_space_name(getattr(v.aval, "memory_space", None)),
                    where=where,
                )
                for v in body.invars
            )
            regions.append(ScopedRegion(allocations, _scoped_regions(body)))
            continue
        nested: list[ScopedRegion] = []
        for value in eqn.params.values():
            for sub in sub_jaxprs(value):
                nested.extend(_scoped_regions(sub))
        if nested:
            regions.append(ScopedRegion((), tuple(nested)))
    return tuple(regions)


def _summarize_source(eqn: Any) -> str:
    try:
        return "pl.run_scoped at " + str(
            jax_internals.private_attribute(SOURCE_INFO_MODULE, "summarize")(eqn.source_info)
        )
    except Exception:  # noqa: BLE001  # a description only: never fail a check over it
        return "pl.run_scoped"
