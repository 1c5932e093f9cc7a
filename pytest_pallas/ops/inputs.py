"""What the conformance suite feeds each operation: Hypothesis strategies of ``Case``s.

A case is drawn as sizes (from the buckets of ``strategies.SIZE_BUCKETS``, by
each dimension's kind in the op's signature, narrowed by the implementation's
``@supports`` domain), a dtype, a value profile, a value seed and the op's
``params``; the arrays are made by NumPy from those (or by the op's ``inputs``
builder). Its repr is what a failing property prints: the dimensions, dtype,
profile, seed and the first few values of each argument, enough to rebuild it
by hand.

Distinct compilations per op are bounded by the product of the bucket sizes
of its dimensions times its dtypes and parameter values (``compilation_bound``).

Every function takes the op's ``Operation`` record itself: the suite hands the record
down from its door, and nothing here looks an op up by its name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import strategies
from ..tiling import LANES, native_sublanes
from .domains import Domain
from .operation import SHAPE, Operation
from .structural_sweep import PROFILES, assignments

# Buckets of the kinds a signature does not give (attention's head and sequence sizes are
# the records' ``sizes``).
_EXTRA_BUCKETS = {
    "devices": (2, 4, 8),
}

_INTEGER_PROFILES = ("normal", "large", "ties", "extremes")


def bucket(kind: str) -> tuple[int, ...]:
    return _EXTRA_BUCKETS.get(kind) or strategies.SIZE_BUCKETS[kind]


def dimension_bucket(op: Operation, dim: str) -> tuple[int, ...]:
    """The sizes ``dim`` of ``op`` is drawn from: the record's ``sizes``, else its kind's."""
    return op.sizes.get(dim) or bucket(op.dimension_kind(dim))


class Case:
    """One input of an operation, and everything needed to rebuild it.

    A plain class rather than a dataclass: Hypothesis prints dataclasses
    field by field, whole arrays included, and a failing example should read
    as one line (``__repr__``).
    """

    def __init__(self, op: Operation, dims: dict[str, Any], dtype: str, profile: str,
                 seed: int, args: tuple[np.ndarray, ...],
                 kwargs: dict[str, Any] | None = None,
                 blocks: dict[str, int] | None = None) -> None:
        self.operation = op
        self.dims, self.dtype, self.profile, self.seed = dims, dtype, profile, seed
        self.args = args
        self.kwargs = dict(kwargs or {})
        # Block sizes for the implementation's declared block keywords (@supports(blocks=)):
        # the implementation gets them, the oracle does not.
        self.blocks = dict(blocks or {})

    @property
    def op_name(self) -> str:
        return self.operation.name

    def with_args(self, args: tuple[np.ndarray, ...]) -> Case:
        return Case(self.operation, self.dims, self.dtype, self.profile, self.seed, args,
                    self.kwargs, self.blocks)

    @property
    def reduction_length(self) -> int | None:
        return self.operation.reduction_length(self.dims)

    def __repr__(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        kwargs = "".join(f", {k}={v!r}" if not isinstance(v, str) else f", {k}={v}"
                         for k, v in {**self.kwargs, **self.blocks}.items())
        previews = "; ".join(
            f"arg{i} {a.shape} {a.dtype}: {np.array2string(a.ravel()[:4], precision=4)}"
            for i, a in enumerate(self.args)
        )
        return (f"Case({self.op_name}: {dims}, dtype={self.dtype}, values={self.profile}, "
                f"seed={self.seed}{kwargs} | {previews})")


def _sizes_for(op: Operation, dim: str, domain: Domain, kind: str | None = None) -> tuple[int, ...]:
    sizes = bucket(kind) if kind is not None else dimension_bucket(op, dim)
    return strategies.restrict_sizes(
        sizes, multiple_of=domain.multiple_of.get(dim, 1), max_size=domain.max_size.get(dim),
    )


def _dtypes_for(op: Operation, domain: Domain) -> tuple[str, ...]:
    names = op.dtypes
    if domain.dtypes is not None:
        names = tuple(d for d in names if d in domain.dtypes)
    return names


# --- the size budget of one example ------------------------------------------------------
#
# A declared restriction can push every size of a bucket up: @supports(multiple_of=
# {"shape": 256}) on the rank-free add made every axis 256, 512 or 768, and a rank-3
# example 768^3 float32 values (1.8 GB per argument; one run sat 25 minutes at 5 GB).
# So the sizes a property may draw are trimmed, largest first, until the largest
# example they allow fits the budget; the restriction still holds (only sizes that
# honour it remain), and a restriction whose smallest example is over the budget is
# an error naming it.

# All arguments of one example, counted as 4-byte values: five times the largest example of
# any op's whole contract domain (batched_matmul, 3.1 MiB), a few seconds interpreted.
EXAMPLE_BUDGET_BYTES = 16 * 2**20


def fit_size_budget(op: Operation, candidates: dict[str, tuple[int, ...]],
                    budget_bytes: int = EXAMPLE_BUDGET_BYTES) -> dict[str, tuple[int, ...]]:
    """``candidates`` (sizes each dimension may take) without the sizes that let an example
    of ``op`` go over ``budget_bytes``: the largest size of the dimension with the largest
    one goes first, until the example of every dimension's largest size fits.

    For an elementwise op the dimensions are its axes by position (``"shape0"``, ...).
    """
    sizes = {dim: tuple(sorted(values)) for dim, values in candidates.items()}

    def largest_bytes() -> int:
        biggest = {dim: values[-1] for dim, values in sizes.items()}
        return 4 * sum(math.prod(shape) for shape in op.argument_shapes(_as_dims(op, biggest)))

    while largest_bytes() > budget_bytes:
        trimmable = [dim for dim, values in sizes.items() if len(values) > 1]
        if not trimmable:
            raise ValueError(
                f"{op.name}: the smallest example the declared domain allows "
                f"({', '.join(f'{d}={v[0]}' for d, v in sizes.items())}) takes "
                f"{largest_bytes() / 2**20:.0f} MiB, over the suite's budget of "
                f"{budget_bytes / 2**20:.0f} MiB per example; declare smaller multiples or a "
                "max_size in @supports")
        widest = max(trimmable, key=lambda dim: sizes[dim][-1])
        sizes[widest] = sizes[widest][:-1]
    return sizes


def _as_dims(op: Operation, sizes: dict[str, int]) -> dict[str, Any]:
    if op.is_elementwise:
        return {SHAPE: tuple(sizes[f"shape{i}"] for i in range(len(sizes)))}
    return dict(sizes)


def _elementwise_sizes(op: Operation, rank: int, domain: Domain) -> dict[str, tuple[int, ...]]:
    """The sizes of each axis of a rank-``rank`` example of an elementwise op, in the budget."""
    return fit_size_budget(op, {f"shape{i}": _sizes_for(op, SHAPE, domain, kind)
                                for i, kind in enumerate(_ELEMENTWISE_KINDS[rank])})


def _elementwise_ranks(op: Operation, domain: Domain) -> tuple[int, ...]:
    """The ranks whose smallest example inside ``domain`` fits the budget."""
    ranks = []
    for rank in sorted(_ELEMENTWISE_KINDS):
        try:
            _elementwise_sizes(op, rank, domain)
        except ValueError:
            if not ranks:
                raise
            break  # a higher rank is larger still
        ranks.append(rank)
    return tuple(ranks)


def _budgeted_sizes(op: Operation, domain: Domain) -> dict[str, tuple[int, ...]]:
    """The sizes of each dimension of ``op`` inside ``domain`` and the budget."""
    return fit_size_budget(op, {dim: _sizes_for(op, dim, domain) for dim in op.dimensions})


def _profiles_for(op: Operation, dtype: str) -> list[str]:
    integer = np.issubdtype(strategies.as_dtype(dtype), np.integer)
    return [p for p in op.profiles if not integer or p in _INTEGER_PROFILES]


# The kinds of the axes of an elementwise op's array of rank 1, 2 or 3.
_ELEMENTWISE_KINDS = {1: ("minor",), 2: ("second_minor", "minor"),
                      3: ("leading", "second_minor", "minor")}


@st.composite
def cases(draw, op: Operation, domain: Domain = Domain()) -> Case:
    """Inputs of ``op`` inside ``domain``, covering the whole contract domain by default."""
    dtype = draw(st.sampled_from(_dtypes_for(op, domain)))
    profile = draw(st.sampled_from(_profiles_for(op, dtype)))
    seed = draw(st.integers(0, 2**31 - 1))
    if op.is_elementwise:
        rank = draw(st.sampled_from(_elementwise_ranks(op, domain)))
        sizes = _elementwise_sizes(op, rank, domain)
        dims: dict[str, Any] = {SHAPE: tuple(draw(st.sampled_from(sizes[f"shape{i}"]))
                                             for i in range(rank))}
    else:
        sizes = _budgeted_sizes(op, domain)
        dims = {dim: draw(st.sampled_from(sizes[dim])) for dim in op.dimensions}
    kwargs = {name: draw(st.sampled_from(values)) for name, values in op.params.items()}
    case = make_case(op, dims, dtype, profile, seed, kwargs)
    choices = block_choices(op, domain, case.dims, dtype)
    case.blocks = {keyword: draw(st.sampled_from(sizes)) for keyword, sizes in choices.items()}
    case.blocks = {keyword: size for keyword, size in case.blocks.items() if size is not None}
    return case


@st.composite
def same_signature(draw, case: Case) -> Case:
    """Another input of ``case``'s signature (sizes, dtype, params and blocks): new values.

    The implementation is compiled once per signature, so a second draw of values on the
    same signature costs one kernel call, not a compilation (``VALUES_PER_SIGNATURE``)."""
    op = case.operation
    profile = draw(st.sampled_from(_profiles_for(op, case.dtype)))
    seed = draw(st.integers(0, 2**31 - 1))
    sibling = make_case(op, case.dims, case.dtype, profile, seed, case.kwargs)
    sibling.blocks = dict(case.blocks)
    return sibling


# Value draws per drawn signature in the value property: the profile's examples are
# signatures, and each is checked on this many inputs (a compilation, and with libtpu the TPU
# compiler's verdict, costs 10 to 100 times a call of an interpreted kernel on these sizes;
# the sweep and structural cases fix the shapes every run must see, so the draws add new
# shapes run after run rather than many in one run). Five: the dev profile's 10 value checks
# are 2 signatures; the warm main job with the compile check, 37.8 s median at two per
# signature, 30.4 s at five (4 alternating pairs, docs/main-job.md#time).
VALUES_PER_SIGNATURE = 5


# --- blocks: several grid steps on small inputs -----------------------------------------------
#
# A kernel whose default blocks span a whole dimension up to 512 runs one grid step on every
# size the suite draws (at most 40 rows, 384 lanes, k = 640), so its multi-block code (an
# accumulator carried across k steps, an online softmax across kv blocks, a ragged last block)
# never runs. An implementation that declares its block keywords (@supports(blocks=...)) gets
# small legal blocks instead: the sweep takes the one that splits each dimension into two
# steps (the second ragged where the size allows), the draws that one, the dimension's
# smallest legal block (the most steps) or the implementation's default.


def block_multiple(op: Operation, dim: str, dtype: str, multiple: int | None) -> int:
    """The multiple a block of ``dim`` must be: the declared one, else the TPU tile of the
    dimension's kind (lanes 128, the dtype's native sublanes, 1 for a batch-like axis)."""
    if multiple is not None:
        return multiple

    kind = op.dimension_kind(dim)
    if kind in ("minor", "reduction"):
        return LANES
    if kind == "second_minor":
        return native_sublanes(strategies.as_dtype(dtype))
    return 1


def _two_step_block(size: int, multiple: int, ragged: bool) -> int | None:
    """The smallest legal block that splits ``size`` into two steps (more where the tile
    forces it, or where the block must divide ``size``), None when ``size`` fits one tile."""
    if size <= multiple:
        return None
    if not ragged:
        dividing = [block for block in range(multiple, size, multiple) if size % block == 0]
        return max(dividing, default=None)
    half = -(-size // 2)
    block = -(-half // multiple) * multiple
    return block if block < size else None


def block_choices(op: Operation, domain: Domain, dims: dict[str, Any],
                  dtype: str) -> dict[str, tuple[int | None, ...]]:
    """Per declared block keyword, the blocks an example may take: the two-step block first
    (the sweep's), then the smallest legal one, then None (the implementation's default)."""
    choices: dict[str, tuple[int | None, ...]] = {}
    for keyword, (dim, declared) in domain.blocks.items():
        size = dims.get(dim)
        if not isinstance(size, int):
            continue
        multiple = block_multiple(op, dim, dtype, declared)
        two_steps = _two_step_block(size, multiple, domain.ragged_blocks)
        smallest = multiple if multiple < size and (
            domain.ragged_blocks or size % multiple == 0) else None
        choices[keyword] = tuple(dict.fromkeys((two_steps, smallest, None)))
    return choices


def make_case(op: Operation, dims: dict[str, Any], dtype: str, profile: str, seed: int,
              kwargs: dict[str, Any]) -> Case:
    dims, kwargs = op.constrained(dims, kwargs)
    args = op.build_arguments(dims, dtype, profile, seed)
    return Case(op, dims=dims, dtype=dtype, profile=profile, seed=seed, args=args, kwargs=kwargs)


# --- the sweep: value profiles and dtypes tried on purpose ----------------------------------
#
# Ten drawn examples miss a bug that shows on one value profile or one dtype only in
# about one run in four (softmax without its max subtraction, which overflows on "large"
# alone, went unseen for 6 of 23 seeds; tests/test_suite_power.py). So before its drawn
# examples the value property tries each profile on the op's first dtype and the most
# stressful profile on each other dtype, on two shapes in turn (ragged past several tiles,
# and several whole tiles: ``_SWEEP_SIZES``): Hypothesis explicit examples, the same in
# every run. Sweep case i takes value i + i // 2 (cyclically) of each of the op's params,
# so that a param of two values takes each on both shapes (causal and not, each with
# several kv blocks). The
# whole-tiles shape has one batch element (batch axes step in the ragged shape, with 2) and
# a k of three tiles: each extra batch element or k tile is interpreted work in every case.

SWEEP_SLOTS = 12  # the most sweep cases of any built-in op over its whole domain
_STRESS_PROFILES = ("large", "offset", "extremes")


class SweepSlot:
    """The ``data`` of one explicit example of the value property: sweep case ``index``."""

    def __init__(self, index: int) -> None:
        self.index = index
        # The case this slot ran: itself, unless --pallas-sweep-first moved another case
        # ahead. Hypothesis prints the slot of a failing example: it names the case.
        self.case = index

    def __repr__(self) -> str:
        return f"sweep case {self.case + 1}"


def sweep(op: Operation, domain: Domain = Domain()) -> list[tuple[str, str]]:
    """The (dtype, value profile) pairs the value property tries on purpose for ``op``."""
    dtypes = _dtypes_for(op, domain)
    if not dtypes:
        return []
    pairs = [(dtypes[0], profile) for profile in _profiles_for(op, dtypes[0])
             if profile != "normal"]
    for dtype in dtypes[1:]:
        profiles = _profiles_for(op, dtype)
        stress = next((p for p in _STRESS_PROFILES if p in profiles), None)
        if stress is not None:
            pairs.append((dtype, stress))
    return pairs


def sweep_slots(op: Operation) -> int:
    """How many sweep cases ``op`` has over its whole domain (the explicit examples it needs)."""
    return sweep_count(op, Domain())


def sweep_count(op: Operation, domain: Domain) -> int:
    """How many sweep cases ``op`` has inside ``domain``: its (dtype, profile) pairs, then its
    structural cases (``ops.structural_sweep``)."""
    return len(sweep(op, domain)) + len(_structural(op, domain))


def _structural(op: Operation, domain: Domain) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    if op.is_elementwise or not _dtypes_for(op, domain):
        return []

    sizes = _budgeted_sizes(op, domain)
    ragged = {dim: _sweep_size(sizes[dim], op.dimension_kind(dim), 0, own_sizes=dim in op.sizes,
                               multiple_of=domain.multiple_of.get(dim, 1))
              for dim in op.dimensions}
    return assignments(op, sizes, ragged)


def _structural_case(op: Operation, domain: Domain, index: int) -> Case | None:
    """Structural sweep case ``index`` of ``op``: the op's first dtype, a revealing profile."""
    structural = _structural(op, domain)
    if index >= len(structural):
        return None

    dtype = _dtypes_for(op, domain)[0]
    profiles = [p for p in PROFILES if p in _profiles_for(op, dtype)] or _profiles_for(op, dtype)
    dims, kwargs = structural[index]
    seed = len(sweep(op, domain)) + index
    case = make_case(op, dims, dtype, profiles[index % len(profiles)], seed, kwargs)
    case.blocks = {keyword: sizes[0] for keyword, sizes
                   in block_choices(op, domain, case.dims, dtype).items() if sizes[0] is not None}
    return case


def sweep_order(op: Operation, domain: Domain, first: int | None) -> list[int]:
    """The order the sweep cases of ``op`` run in: case ``first`` (1-based, as failures
    number them) first when ``op`` has it, then the others in turn."""
    order = list(range(sweep_count(op, domain)))
    if first is not None and 1 <= first <= len(order):
        order.insert(0, order.pop(first - 1))
    return order


# The sweep's two shapes, taken in turn by its cases (even cases the first, odd ones the
# second), per kind of dimension: a size ragged past several tiles (200 lanes; 29 = 3 x 8 + 5
# sublanes, 16 + 13 in 16-bit types; k = 300) and a size of several whole tiles (384 = 3 x 128
# lanes; 32 = 4 x 8 = 2 x 16 sublanes; k = 512 = 4 x 128 = 2 x 256). A kernel that blocks a
# dimension only when its tile divides it runs several steps only on the second; a kernel
# that mishandles a ragged last block across several tiles fails only on the first. Each is
# taken only inside the implementation's domain and no larger than the largest size the
# budget leaves (grid_coverage.py reports the kernel grid axes that still never ran more
# than one step).
_SWEEP_SIZES = {
    "minor": (200, 384),
    "second_minor": (29, 32),
    "reduction": (300, 384),
    "leading": (2, 1),
}
SWEEP_SHAPES = 2


def _sweep_size(sizes: tuple[int, ...], kind: str, shape: int = 0, *, own_sizes: bool = False,
                multiple_of: int = 1) -> int:
    """The size of one dimension in sweep shape ``shape`` (0: ragged, 1: whole tiles), among
    ``sizes`` (the dimension's bucket inside the domain and the budget)."""
    if kind == "devices":
        return sizes[0]  # the fewest: a run may have no more devices than that
    wanted = _SWEEP_SIZES.get(kind, ())
    if not own_sizes and wanted:
        size = wanted[shape]
        if size % multiple_of == 0 and size <= sizes[-1]:
            return size
    if shape == 1 and kind != "leading":
        return sizes[-1]  # the most tiles the bucket has
    # A ragged size past one tile where the bucket has one; else the second size (2 batch
    # elements, 100 keys), or the only one a domain leaves.
    return sizes[3] if len(sizes) > 3 else sizes[min(1, len(sizes) - 1)]


def sweep_case(op: Operation, domain: Domain, index: int) -> Case | None:
    """Sweep case ``index`` of ``op`` inside ``domain``; None past the op's last one."""
    pairs = sweep(op, domain)
    if index >= len(pairs):
        return _structural_case(op, domain, index - len(pairs))
    dtype, profile = pairs[index]
    shape = index % SWEEP_SHAPES
    if op.is_elementwise:
        rank = min(2, max(_elementwise_ranks(op, domain)))
        sizes = _elementwise_sizes(op, rank, domain)
        dims: dict[str, Any] = {SHAPE: tuple(
            _sweep_size(sizes[f"shape{i}"], kind, shape, own_sizes=SHAPE in op.sizes,
                        multiple_of=domain.multiple_of.get(SHAPE, 1))
            for i, kind in enumerate(_ELEMENTWISE_KINDS[rank]))}
    else:
        sizes = _budgeted_sizes(op, domain)
        dims = {dim: _sweep_size(sizes[dim], op.dimension_kind(dim), shape,
                                 own_sizes=dim in op.sizes,
                                 multiple_of=domain.multiple_of.get(dim, 1))
                for dim in op.dimensions}
    kwargs = {name: values[(index + index // SWEEP_SHAPES) % len(values)]
              for name, values in op.params.items()}
    case = make_case(op, dims, dtype, profile, index, kwargs)
    case.blocks = {keyword: sizes[0] for keyword, sizes
                   in block_choices(op, domain, case.dims, dtype).items() if sizes[0] is not None}
    return case


def argument_shapes(op: Operation, dims: dict[str, Any]) -> list[tuple[int, ...]]:
    return op.argument_shapes(dims)


def compilation_bound(op: Operation, domain: Domain = Domain()) -> int:
    """The most distinct input signatures (shapes x dtypes) the suite can draw for ``op``."""
    dtypes = len(_dtypes_for(op, domain))
    if op.is_elementwise:
        per_rank = [math.prod(len(_sizes_for(op, SHAPE, domain, k)) for k in kinds)
                    for kinds in _ELEMENTWISE_KINDS.values()]
        return dtypes * sum(per_rank)
    shapes = math.prod(len(_sizes_for(op, dim, domain)) for dim in op.dimensions)
    extra = math.prod(len(values) for values in op.params.values())
    return dtypes * shapes * extra
