"""``Operation``: everything the conformance suite knows about one op, in one record.

An op is declared once, and the suite (drawing inputs, calling the
implementation, judging the result, the report, the benchmarks' baseline and
cost model) reads only the record::

    >>> import numpy as np
    >>> from pytest_pallas import Operation
    >>> def rms_norm_reference(x, w, *, eps):
    ...     return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    >>> RMS_NORM = Operation("my_rms_norm", signature="(rows,cols),(cols)->(rows,cols)",
    ...                      oracle=rms_norm_reference, reduction="cols",
    ...                      params={"eps": (1e-6,)})
    >>> RMS_NORM.dimensions
    ('rows', 'cols')
    >>> RMS_NORM.dimension_kind("rows"), RMS_NORM.dimension_kind("cols")
    ('second_minor', 'minor')

The signature is NumPy's generalized-ufunc notation: a dimension's name is
shared by every argument that has it. Each dimension is drawn from the size
bucket of its kind (``strategies.SIZE_BUCKETS``): the last dimension of an
argument is a lane dimension (``minor``), the one before it a sublane
dimension (``second_minor``), others batch-like (``leading``); a
``reduction`` dimension the result does not keep (matmul's k) is drawn long
enough to tell float32 from bfloat16 accumulation (``reduction``), and a
collective op gets a ``devices`` dimension. An op whose
arguments are all scalars in the signature (``"(),()->()"``) is elementwise:
it is drawn on whole arrays of rank 1 to 3, as one dimension named
``shape``.

Adding a built-in op is one record in ``pytest_pallas/ops/builtins.py`` plus its
kernel module in ``reference_kernels/`` (see that module's docstring).

Callables may be given as ``"module:attr"`` strings, imported on first use,
so that a record costs no import of JAX or of its kernel until a test runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..dtypes import as_dtype
from .error_models import ErrorModel

__all__ = ["Deferred", "Operation", "OperationError", "parse_signature"]

FLOAT_DTYPES = ("float32", "bfloat16")
ALL_PROFILES = ("normal", "large", "ties", "small", "extremes")
# Products and reductions skip "extremes": finfo.max/4 overflows float32 in any correct kernel
# while the float64 oracle does not.
REDUCTION_PROFILES = ("normal", "large", "ties", "small")
_KNOWN_PROFILES = ALL_PROFILES + ("neg_inf",)
DEVICES = "devices"
SHAPE = "shape"


class OperationError(ValueError):
    """A malformed ``Operation``: its message is one line naming the problem and the fix."""


class Deferred:
    """A parameter value imported on first use: ``Deferred("jax.nn:gelu")`` prints as ``gelu``.

    Lets a record name ``jax.nn.gelu`` as a value of ``params`` without importing JAX.

    >>> Deferred("math:sqrt").resolve()(4.0)
    2.0
    >>> Deferred("math:sqrt")
    sqrt
    """

    def __init__(self, target: str) -> None:
        self.target = target

    def resolve(self) -> Any:
        return load(self.target)

    def __repr__(self) -> str:
        return self.target.rpartition(":")[2]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Deferred) and other.target == self.target

    def __hash__(self) -> int:
        return hash(self.target)


def load(target: Any) -> Any:
    """``"module:attr"`` -> the attribute (imported now); anything else is returned as is."""
    if not isinstance(target, str):
        return target
    module_name, _, attribute = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments as the implementation and the oracle get them (Deferred imported)."""
    return {k: v.resolve() if isinstance(v, Deferred) else v for k, v in params.items()}


# --- signatures --------------------------------------------------------------------------

_NAME = r"[A-Za-z_][A-Za-z_0-9]*"
CORE_MODULE = rf"\((?:\s*{_NAME}\s*(?:,\s*{_NAME}\s*)*)?,?\s*\)"
_SIGNATURE = re.compile(rf"^\s*{CORE_MODULE}(?:\s*,\s*{CORE_MODULE})*\s*->\s*{CORE_MODULE}\s*$")


def parse_signature(signature: str) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """``"(m,k),(k,n)->(m,n)"`` -> ``((("m", "k"), ("k", "n")), ("m", "n"))``.

    >>> parse_signature("(),()->()")
    (((), ()), ())
    """
    if not isinstance(signature, str) or not _SIGNATURE.match(signature):
        raise OperationError(
            f"signature {signature!r} is not a NumPy gufunc signature; write the arguments' "
            "dimensions and the result's, e.g. '(m,k),(k,n)->(m,n)' or '(),()->()'."
        )
    inputs, _, output = signature.partition("->")

    def cores(text: str) -> list[tuple[str, ...]]:
        return [tuple(n.strip() for n in group.split(",") if n.strip())
                for group in re.findall(r"\(([^)]*)\)", text)]

    outputs = cores(output)
    return tuple(cores(inputs)), outputs[0]


# --- the record ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Operation:
    """One op of the conformance suite: its signature, oracle, domain and tolerances.

    Only ``name``, ``signature`` and ``oracle`` are required; see
    docs/your-own-op.md.

    Args:
      name: the op's name (``--pallas-impl NAME=...``, the report's key).
      signature: NumPy gufunc signature of the arguments and the result, e.g.
        ``"(rows,cols),(cols)->(rows,cols)"``.
      oracle: the float64 NumPy version: float64 (or exact integer) arrays in,
        the result out, with ``params`` as keyword arguments. A collective op's
        oracle gets the global arrays (the devices' blocks stacked along axis
        0) and ``devices=n``.
      dtypes: the dtypes drawn (the first argument's, and the result's).
      reduction: the dimension the op reduces over (widens the tolerance), or a
        tuple of dimensions whose product is the reduction length (paged
        attention's pages_per_sequence * page_size).
      params: keyword argument name -> the values drawn, one per example.
      exact: results compare bit for bit (integer dtypes always do).
      profiles: the value profiles drawn (``strategies.generate_values``);
        default all five, or without "extremes" for an op with a reduction.
      arg_dtypes: argument position -> a fixed dtype (e.g. int32 indices).
      inputs: ``inputs(dims, dtype, rng) -> tuple of arguments`` for inputs
        with structure (index tables, group sizes); an argument returned as
        None is drawn by the value profile.
      vmap: whether the op is checked under ``jax.vmap``.
      collective: the keyword that receives the mesh axis name: the op is
        called inside ``shard_map`` over 2 to 8 devices.
      dimensions: the order the dimensions are drawn and printed in (default:
        their order in the signature, ``devices`` first).
      sizes: dimension -> its size bucket, instead of its kind's.
      allowance: ``allowance(case, matmul_precision) -> (atol, reason)``, an
        error a correct kernel may add beyond the default tolerance; or an
        ``ops.error_models.ErrorModel``, whose ``reduction_length`` (when set)
        sizes the default's accumulation term instead of ``reduction``. The
        case has ``args``, ``kwargs``, ``dtype`` and ``dims``, in the suite and
        in ``assert_allclose(op=...)`` alike (``error_model``).
      low_precision_matmul: a bfloat16 input makes an inner matmul's operands
        bfloat16 (attention's probabilities times v): judged at that precision.
      profile_adjustments: value profile -> ``f(args) -> args`` applied after
        the "ties" values are drawn: the op's own profiles (attention's "offset").
      shapes: ``shapes(dims) -> (argument shapes, result shape)``, the global
        shapes, for an op the signature's names cannot size alone (a collective
        whose result is not its block's shape; q of (b, g * r, d) heads in
        groups). The signature still gives the dimensions and their kinds.
      constrain: ``constrain(dims, params) -> (dims, params)``, applied to every
        drawn case before its arguments are built: the facts that tie
        dimensions and parameters together, which the signature cannot say
        (kv heads dividing query heads; s = t under a causal mask; a parameter
        that depends on a dimension, such as a softmax scale of 1/sqrt(d)). It
        gets the drawn values and returns the ones the case uses (and prints);
        a changed dimension should only move to a size already drawable for it.
      sweep_pairs: pairs of dimensions or params whose values interact (page size and
        pages per sequence, query heads and kv heads): the sweep runs every combination
        of each pair that ``constrain`` keeps, where it runs every other structural
        value (a dimension of the record's ``sizes``, the device count, a param) once.
      needs_tpu_interpreter: the kernels use DMAs, semaphores or remote copies,
        which only the TPU interpreter simulates.
      reference, xla, cost: the reference kernel, the plain-XLA version (the
        benchmarks' baseline) and the cost model ``cost(*args, **params) ->
        pl.CostEstimate``. Without ``cost``, the cost is ``pl.estimate_cost`` of
        ``xla``.
    """

    name: str
    signature: str
    oracle: Callable | str
    dtypes: tuple[str, ...] = FLOAT_DTYPES
    reduction: str | tuple[str, ...] | None = None
    params: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
    exact: bool = False
    profiles: tuple[str, ...] | None = None
    arg_dtypes: Mapping[int, str] = dataclasses.field(default_factory=dict)
    inputs: Callable | str | None = None
    vmap: bool = True
    collective: str | None = None
    dimensions: tuple[str, ...] | None = None
    sizes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    allowance: Callable | str | None = None
    low_precision_matmul: bool = False
    profile_adjustments: Mapping[str, Callable | str] = dataclasses.field(default_factory=dict)
    needs_tpu_interpreter: bool = False
    shapes: Callable | str | None = None
    constrain: Callable | str | None = None
    sweep_pairs: tuple[tuple[str, str], ...] = ()
    reference: Callable | str | None = None
    xla: Callable | str | None = None
    cost: Callable | str | None = None

    # Derived from the signature by __post_init__: each argument's core dimensions (per
    # device, for a collective) and the result's.
    arguments: tuple[tuple[str, ...], ...] = dataclasses.field(
        init=False, repr=False, compare=False)
    result: tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Check the record and normalize its containers (a frozen dataclass: each field set
        once, here, through ``object.__setattr__``)."""
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z_][\w.\-]*", self.name):
            raise OperationError(f"Operation name {self.name!r} must be a non-empty identifier, "
                                 "e.g. 'my_rms_norm'.")
        where = f"Operation {self.name!r}"
        try:
            args, out = parse_signature(self.signature)
        except OperationError as error:
            raise OperationError(f"{where}: {error}") from None
        self._normalize_containers(where)
        set_ = object.__setattr__
        set_(self, "arguments", args)
        set_(self, "result", out)
        set_(self, "dimensions", self._dimension_names(where))
        self._check_dimension_references(where)
        self._check_sweep_pairs_and_params(where)
        for index in self.arg_dtypes:
            if not isinstance(index, int) or not 0 <= index < len(args):
                raise OperationError(
                    f"{where}: arg_dtypes key {index!r} is not an argument position "
                    f"(0 to {len(args) - 1}).")
        set_(self, "profiles", self._checked_profiles(where))
        if not isinstance(self.oracle, str):
            self._check_oracle(where)

    def _normalize_containers(self, where: str) -> None:
        """Tuples and dicts of their own in place of what the caller passed."""
        set_ = object.__setattr__
        set_(self, "dtypes", _names_tuple(where, "dtypes", self.dtypes))
        if self.reduction is not None and not isinstance(self.reduction, str):
            set_(self, "reduction", _names_tuple(where, "reduction", self.reduction))
        set_(self, "params", {k: tuple(v) for k, v in dict(self.params).items()})
        set_(self, "arg_dtypes", dict(self.arg_dtypes))
        set_(self, "sizes", {k: tuple(v) for k, v in dict(self.sizes).items()})
        set_(self, "profile_adjustments", dict(self.profile_adjustments))

    def _dimension_names(self, where: str) -> tuple[str, ...]:
        """The op's dimensions, in the order they are drawn: ``dimensions`` if given (the
        signature's, reordered), else as they first appear in the signature."""
        args, out = self.arguments, self.result
        names = _first_appearance(args, out)
        if self.collective:
            names = (DEVICES, *[n for n in names if n != DEVICES])
        if self.is_elementwise:
            names = (SHAPE,)
        elif set(out) - set(n for a in args for n in a):
            raise OperationError(
                f"{where}: the result's dimension(s) {', '.join(sorted(set(out) - set(names)))} "
                f"appear in no argument of signature {self.signature!r}.")
        if self.dimensions is not None:
            if sorted(self.dimensions) != sorted(names):
                raise OperationError(
                    f"{where}: dimensions={tuple(self.dimensions)} must list exactly the "
                    f"signature's: {', '.join(names)}.")
            names = tuple(self.dimensions)
        return names

    def _check_dimension_references(self, where: str) -> None:
        """``reduction`` and ``sizes`` name dimensions of the signature."""
        for field, dims in (("reduction", list(self.reduction_dimensions)),
                            ("sizes", list(self.sizes))):
            for dim in dims:
                if dim not in self.dimensions:
                    raise OperationError(
                        f"{where}: {field} names dimension {dim!r}, which signature "
                        f"{self.signature!r} does not have; its dimensions are "
                        f"{', '.join(self.dimensions)}.")

    def _check_sweep_pairs_and_params(self, where: str) -> None:
        names = self.dimensions
        object.__setattr__(self, "sweep_pairs", tuple(tuple(pair) for pair in self.sweep_pairs))
        for pair in self.sweep_pairs:
            unknown = [n for n in pair if n not in names and n not in self.params]
            if len(pair) != 2 or unknown:
                raise OperationError(
                    f"{where}: sweep_pairs entry {pair!r} must be two of its dimensions "
                    f"({', '.join(names)}) or params ({', '.join(self.params) or 'none'}).")
        for name, values in self.params.items():
            if not values:
                raise OperationError(f"{where}: params[{name!r}] is empty; give the values "
                                     f"to draw, e.g. params={{{name!r}: (1e-6,)}}.")

    def _checked_profiles(self, where: str) -> tuple[str, ...]:
        """The value profiles drawn: ``profiles``, or the defaults for a reduction or not."""
        profiles = self.profiles
        if profiles is None:
            profiles = REDUCTION_PROFILES if self.reduction else ALL_PROFILES
        profiles = _names_tuple(where, "profiles", profiles)
        unknown = [p for p in profiles if p not in _KNOWN_PROFILES
                   and p not in self.profile_adjustments]
        if unknown:
            raise OperationError(
                f"{where}: unknown value profile(s) {', '.join(unknown)}; known: "
                f"{', '.join(_KNOWN_PROFILES)} (or one of profile_adjustments).")
        return profiles

    # --- derived facts -----------------------------------------------------------------

    @property
    def reduction_dimensions(self) -> tuple[str, ...]:
        """The dimensions whose sizes multiply to the reduction length (none, one or more)."""
        if not self.reduction:
            return ()
        return (self.reduction,) if isinstance(self.reduction, str) else tuple(self.reduction)

    def reduction_length(self, dims: Mapping[str, Any]) -> int | None:
        """The number of terms each result element sums, for these sizes (None: no reduction)."""
        if not self.reduction:
            return None
        length = 1
        for dim in self.reduction_dimensions:
            length *= int(dims[dim])
        return length

    @property
    def is_elementwise(self) -> bool:
        return not any(self.arguments) and not self.result

    def dimension_kind(self, dim: str) -> str:
        """Which size bucket ``dim`` is drawn from: lane, sublane, batch, reduction, devices."""
        if dim == DEVICES and self.collective:
            return "devices"
        if dim in self.reduction_dimensions and dim not in self.result:
            return "reduction"  # contracted away: long enough to tell accumulations apart
        kind = "leading"
        for core in (*self.arguments, self.result):
            if dim in core:
                position = len(core) - 1 - core.index(dim)
                if position == 0:
                    return "minor"
                if position == 1:
                    kind = "second_minor"
        return kind

    def argument_shapes(self, dims: Mapping[str, Any]) -> list[tuple[int, ...]]:
        """The arguments' shapes for these dimension sizes (a collective's: global arrays)."""
        if self.shapes is not None:
            return [tuple(int(n) for n in shape) for shape in load(self.shapes)(dict(dims))[0]]
        if self.is_elementwise:
            return [tuple(dims[SHAPE])] * len(self.arguments)
        return [self._global(tuple(int(dims[n]) for n in core), dims) for core in self.arguments]

    def result_shape(self, dims: Mapping[str, Any]) -> tuple[int, ...]:
        if self.shapes is not None:
            return tuple(int(n) for n in load(self.shapes)(dict(dims))[1])
        if self.is_elementwise:
            return tuple(dims[SHAPE])
        return self._global(tuple(int(dims[n]) for n in self.result), dims)

    def _global(self, shape: tuple[int, ...], dims: Mapping[str, Any]) -> tuple[int, ...]:
        if not self.collective or not shape:
            return shape
        return (int(dims[DEVICES]) * shape[0], *shape[1:])

    # --- the callables -------------------------------------------------------------------

    def load_oracle(self) -> Callable:
        return load(self.oracle)

    def load_reference(self) -> Callable:
        if self.reference is None:
            raise LookupError(f"op {self.name!r} has no reference kernel")
        return load(self.reference)

    def load_xla(self) -> Callable | None:
        return load(self.xla) if self.xla is not None else None

    def load_inputs(self) -> Callable | None:
        return load(self.inputs) if self.inputs is not None else None

    def constrained(self, dims: Mapping[str, Any], params: Mapping[str, Any]
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The dimensions and parameter values a case uses: ``constrain`` applied, if any."""
        dims, params = dict(dims), dict(params)
        if self.constrain is None:
            return dims, params
        dims, params = load(self.constrain)(dims, params)
        return dict(dims), dict(params)

    def build_arguments(self, dims: Mapping[str, Any], dtype: str, profile: str,
                        seed: int) -> tuple[Any, ...]:
        """The arguments for these sizes, dtype, value profile and seed: the ``inputs``
        builder's structured arguments, the others drawn by the value profile, then the
        profile's adjustment."""
        # lazy: strategies imports Hypothesis; the records load at start-up (--pallas-impl)
        from ..strategies import VALUE_PROFILES, generate_values

        shapes = self.argument_shapes(dims)
        built: tuple[Any, ...] = (None,) * len(shapes)
        builder = self.load_inputs()
        if builder is not None:
            built = tuple(builder(dict(dims), dtype, np.random.default_rng(seed)))
            if len(built) != len(shapes):
                raise ValueError(f"the inputs builder of {self.name} returned {len(built)} "
                                 f"arguments; its signature {self.signature!r} has {len(shapes)}")
        # An op's own profile (attention's "offset"): integer values, adjusted afterwards.
        drawn = profile if profile in VALUE_PROFILES + ("neg_inf",) else "ties"
        args = tuple(
            np.asarray(given) if given is not None
            else generate_values(shape, self.arg_dtypes.get(i, dtype), seed=seed + i,
                                 profile=drawn)
            for i, (shape, given) in enumerate(zip(shapes, built))
        )
        adjust = self.profile_adjustments.get(profile)
        if adjust is not None:
            args = tuple(load(adjust)(args))
        return args

    def estimate_cost(self, *args: Any, **params: Any) -> Any:
        """The cost of one call: the record's model, else ``pl.estimate_cost`` of ``xla``."""
        if self.cost is not None:
            return load(self.cost)(*args, **params)
        xla = self.load_xla()
        if xla is None:
            return None
        # lazy: JAX; ops load in a conftest, before JAX starts
        from jax.experimental import pallas as pl

        return pl.estimate_cost(xla, *args, **params)

    def error_model(self, case: Any, matmul_precision: str) -> Any:
        """What the op adds to the comparator's default tolerance on ``case`` (``args``,
        ``kwargs``, ``dtype``, ``dims``), on a backend whose float32 dot runs at
        ``matmul_precision``: an ``ops.error_models.ErrorModel`` with the record's
        ``allowance``, the reduction length (the allowance's, else ``reduction``'s over
        ``case.dims``; None where a dimension is unknown), the precision its inner matmul
        rounds in (``low_precision_matmul``) and whether it compares bit for bit. The
        conformance suite and ``assert_allclose(op=...)`` both judge by it."""
        found = load(self.allowance)(case, matmul_precision) if self.allowance else (0.0, "")
        model = found if isinstance(found, ErrorModel) else ErrorModel(float(found[0]), found[1])
        length = model.reduction_length
        if length is None and all(dim in case.dims for dim in self.reduction_dimensions):
            length = self.reduction_length(case.dims)
        # An inner matmul of operands rounded to the input dtype (attention's probabilities
        # times v, as JAX's own flash attention does): with bfloat16 inputs it has bfloat16
        # operands wherever it runs.
        low = self.low_precision_matmul and case.dtype == "bfloat16"
        integer = np.issubdtype(as_dtype(case.dtype), np.integer)
        return dataclasses.replace(
            model, reduction_length=length,
            matmul_precision="bfloat16" if low else matmul_precision,
            exact=True if self.exact or integer else None)

    def dimensions_of(self, inputs: Sequence[Any], given: Mapping[str, Any] | None = None
                      ) -> dict[str, int]:
        """The dimension sizes ``inputs`` (the op's arguments) show: each argument's core
        dimensions are its trailing axes. ``given`` adds sizes the shapes do not say (a
        collective's ``devices``: its arguments are global arrays)."""
        dims = {name: int(size) for name, size in dict(given or {}).items()
                if name in self.dimensions}
        if self.collective or self.shapes is not None or self.is_elementwise:
            return dims
        for core, arg in zip(self.arguments, inputs):
            shape = np.shape(arg)
            if core and len(shape) >= len(core):
                for name, size in zip(core, shape[len(shape) - len(core):]):
                    dims.setdefault(name, int(size))
        return dims

    def __repr__(self) -> str:
        return f"Operation({self.name!r}, signature={self.signature!r})"

    # --- validation ------------------------------------------------------------------------

    def _check_oracle(self, where: str) -> None:
        """Call the oracle once on small float64 inputs: it must take them and return the
        signature's result shape."""
        if not callable(self.oracle):
            raise OperationError(f"{where}: oracle is a {type(self.oracle).__name__}, not a "
                                 "function; give the float64 NumPy version of the op.")
        try:
            inspect.signature(self.oracle).bind(
                *self.arguments, **{k: None for k in self.params},
                **({DEVICES: 2} if self.collective else {}))
        except TypeError as error:
            raise OperationError(
                f"{where}: the oracle {_name(self.oracle)} cannot be called with "
                f"{len(self.arguments)} argument(s) (signature {self.signature!r})"
                f"{' and keywords ' + ', '.join(self.params) if self.params else ''}: {error}."
            ) from None
        except ValueError:  # a builtin without a signature: the trial call decides
            pass
        dims: dict[str, Any] = {}
        for i, name in enumerate(self.dimensions):
            dims[name] = (2, 3) if name == SHAPE else (2 if name == DEVICES else 3 + i)
        try:
            dims, kwargs = self.constrained(dims, {k: v[0] for k, v in self.params.items()})
            args = self.build_arguments(dims, self.dtypes[0], "normal", 0)
            if self.collective:
                kwargs[DEVICES] = dims[DEVICES]
            result = self.oracle(*(np.asarray(a, np.float64)
                                   if not np.issubdtype(np.asarray(a).dtype, np.integer) else a
                                   for a in args), **resolve_params(kwargs))
            shape = tuple(np.shape(result))
        except Exception as error:  # the user's oracle: any failure is a declaration problem
            raise OperationError(
                f"{where}: the oracle {_name(self.oracle)} failed on inputs of signature "
                f"{self.signature!r} ({type(error).__name__}: {error})."
            ) from None
        expected = self.result_shape(dims)
        if shape != expected:
            shapes = ", ".join(str(tuple(np.shape(a))) for a in args)
            raise OperationError(
                f"{where}: the oracle {_name(self.oracle)} returned shape {shape} for arguments "
                f"{shapes}, but signature {self.signature!r} says {expected}; fix the "
                "signature or the oracle.")


def _first_appearance(args: Sequence[Sequence[str]], out: Sequence[str]) -> tuple[str, ...]:
    names: list[str] = []
    for core in (*args, out):
        for name in core:
            if name not in names:
                names.append(name)
    return tuple(names)


def _names_tuple(where: str, field: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value) or not value:
        raise OperationError(f"{where}: {field} must be a non-empty tuple of names, e.g. "
                             f"{field}=('float32', 'bfloat16').")
    return tuple(value)


def _name(function: Any) -> str:
    return getattr(function, "__qualname__", None) or repr(function)
