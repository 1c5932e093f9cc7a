"""Where an implementation's arithmetic runs: its traced program in, findings out.

``--pallas-judge`` (contract §8) judges an implementation as a Pallas kernel. This module
reads the program the implementation traces to (``jax.make_jaxpr`` of it on the suite's
inputs) and says:

* whether it makes any Pallas kernel at all (a ``pallas_call``; ``pl.kernel`` and
  ``pl.core_map`` count too);
* how much of the op's work (its cost model's FLOPs and transcendentals, from its
  ``Operation`` record) runs outside the kernels: products (``dot_general``, convolutions),
  reductions, transcendental functions and elementwise arithmetic, counted through every
  nested program (``jit``/``pjit``, ``vmap``'s batched primitives, ``shard_map`` bodies times
  their devices, ``custom_jvp``/``custom_vjp``, ``scan`` bodies times their length, the
  costliest branch of a ``cond``). Layout work is free: pad, slice, reshape, transpose,
  casts, concatenation, broadcasts, gathers and scatters of indices, selects;
* which host callbacks it makes (``pure_callback``, ``io_callback``, a debug callback that
  is not a print), in the kernels or around them.

Each finding is one line naming the problem. ``judge_program`` takes a closed jaxpr and the
op's work and returns a ``ProgramVerdict``; it never raises on a program it cannot read
(the traversal reads only a jaxpr's equations, their primitives' names and params).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._compat import jax_internals
from .jaxpr_analysis import sub_jaxprs

# The share of the op's work (FLOPs plus transcendentals) that may run outside the kernels:
# a kernel's wrapper may scale, mask or normalise around the kernel, but the op's products,
# reductions and transcendental functions belong inside.
OUTSIDE_SHARE = 0.05

# Free: moving, reshaping, casting, selecting or indexing data computes none of the op.
LAYOUT_PRIMITIVES = frozenset({
    "pad", "slice", "dynamic_slice", "dynamic_update_slice", "reshape", "transpose",
    "convert_element_type", "bitcast_convert_type", "reduce_precision", "concatenate",
    "gather", "scatter", "broadcast_in_dim", "squeeze", "expand_dims", "rev", "select_n",
    "copy", "copy_p", "iota", "sharding_constraint", "device_put", "split", "stop_gradient",
    "optimization_barrier", "mesh_cast", "reshard", "pvary", "axis_index", "empty",
    "ppermute", "all_gather", "all_to_all", "psum_scatter", "clamp", "sort",
    "random_bits", "random_seed", "random_wrap", "random_unwrap", "threefry2x32",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor", "is_finite",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "population_count",
    "argsort", "top_k", "stack", "unstack", "tile", "platform_index", "cond", "while", "scan",
    "pjit", "jit",
    "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
    "custom_vmap_call", "shard_map", "remat", "checkpoint", "custom_lin", "name",
    # Inside a kernel body: reading and writing refs, grid positions, hints.
    "get", "swap", "load", "masked_load", "masked_swap", "program_id", "num_programs",
    "multiple_of", "bitcast", "run_scoped", "dma_start", "dma_wait", "semaphore_read",
    "semaphore_signal", "semaphore_wait", "delay", "barrier",
})

# Products: 2 FLOPs per multiply-add.
PRODUCT_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated", "ragged_dot_general",
                                "ragged_dot"})

# Reductions: one FLOP per element reduced.
REDUCTION_PRIMITIVES = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin",
    "cumlogsumexp", "reduce", "reduce_window", "reduce_window_sum", "reduce_window_max",
    "psum", "pmax", "pmin", "reduce_precision_sum",
})

# Transcendental functions: one per output element.
TRANSCENDENTAL_PRIMITIVES = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin",
    "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc",
    "erf_inv", "lgamma", "digamma", "igamma", "igammac", "rsqrt", "sqrt", "cbrt", "pow",
    "bessel_i0e", "bessel_i1e", "polygamma", "zeta", "random_gamma_grad", "igamma_grad_a",
})

# Host callbacks: the program leaves the device and runs Python.
CALLBACK_PRIMITIVES = frozenset({"pure_callback", "io_callback", "debug_callback",
                                 "callback", "python_callback"})
# A debug callback that only prints computes nothing the result could use.
PRINT_PRIMITIVES = frozenset({"debug_print"})


@dataclasses.dataclass(frozen=True)
class Finding:
    """One reason an implementation is not judged a Pallas kernel of the op."""

    check: str      # "no-kernel", "outside-kernels", "host-callback", "state", "input-impact",
    #                 "result-type", "faster-than-roofline"
    message: str    # one line, naming the problem

    def line(self) -> str:
        return f"[judge: {self.check}] {self.message}"


@dataclasses.dataclass(frozen=True)
class ProgramVerdict:
    """What the traced program of one call says about where its arithmetic runs."""

    kernels: int                     # pallas_call equations in the program
    outside_flops: float             # FLOPs + transcendentals outside the kernels
    op_work: float                   # the op's work: FLOPs + transcendentals of its cost
    #                                  model, at least the size of its arguments and result
    host_callbacks: tuple[str, ...]  # one description per callback found
    findings: tuple[Finding, ...]

    @property
    def share_in_kernels(self) -> float:
        """The share of the op's work inside Pallas kernels, 0 to 1 (0 with no kernel)."""
        if self.kernels == 0:
            return 0.0
        if self.op_work <= 0:
            return 1.0 if self.outside_flops == 0 else 0.0
        return max(0.0, 1.0 - self.outside_flops / self.op_work)


@dataclasses.dataclass
class _Tally:
    kernels: int = 0
    outside: float = 0.0
    largest: tuple[float, str] = (0.0, "")  # the costliest outside equation, for the message
    callbacks: list[str] = dataclasses.field(default_factory=list)
    integers: bool = False  # whether integer arithmetic counts (see judge_program)


def op_work(cost: Any) -> float:
    """FLOPs plus transcendentals of a ``pl.CostEstimate`` (0 for None)."""
    if cost is None:
        return 0.0
    return float(getattr(cost, "flops", 0) or 0) + float(getattr(cost, "transcendentals", 0)
                                                         or 0)


def judge_program(closed_jaxpr: Any, *, work: float, elements: int,
                  integer_op: bool = False, share: float = OUTSIDE_SHARE) -> ProgramVerdict:
    """Judge the traced program of one call of an implementation.

    ``work`` is the op's FLOPs plus transcendentals for this call (``op_work`` of its cost
    model); ``elements`` the size of its arguments and result together, the floor of the
    work an op with little arithmetic (a copy, a gather of devices' blocks, a tiny matmul)
    is measured against. Integer arithmetic is index arithmetic (offsets, group ends, device
    ids), free, unless the op itself computes on integers (``integer_op``: an int32 add);
    integer scalars are free even then.
    """
    tally = _Tally(integers=integer_op)
    _walk(closed_jaxpr, 1.0, tally)
    reference = max(work, float(elements))
    budget = share * reference
    findings: list[Finding] = []
    if tally.kernels == 0:
        findings.append(Finding("no-kernel", "the implementation runs no Pallas kernel (no "
                                "pallas_call, pl.kernel or pl.core_map): the op runs in XLA"))
    if tally.outside > budget:
        percent = 100.0 * tally.outside / reference if reference else math.inf
        findings.append(Finding(
            "outside-kernels",
            f"{_count(tally.outside)} FLOPs run outside the Pallas kernels, {percent:.0f}% of "
            f"the op's {_count(reference)} (at most {100 * share:.0f}% may); the costliest is "
            f"{tally.largest[1]}"))
    for callback in dict.fromkeys(tally.callbacks):
        findings.append(Finding("host-callback", f"{callback}: the result is computed on the "
                                "host, not in a kernel"))
    return ProgramVerdict(tally.kernels, tally.outside, reference,
                          tuple(dict.fromkeys(tally.callbacks)), tuple(findings))


def _count(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def _equations(jaxpr: Any) -> Any:
    inner = getattr(jaxpr, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        jaxpr = inner
    return getattr(jaxpr, "eqns", ())


def _size(aval: Any) -> float:
    shape = getattr(aval, "shape", ())
    return float(math.prod(int(n) for n in shape)) if shape is not None else 1.0


def _equation_flops(equation: Any, integers: bool) -> float:
    """The arithmetic one equation does, by its primitive (0 for layout work and, unless
    ``integers``, for integer arithmetic)."""
    name = equation.primitive.name
    kinds = "fc"
    if integers and any(getattr(getattr(v, "aval", None), "shape", ()) for v in equation.outvars):
        kinds = "fciu"  # integer scalars are device ids and offsets, even in an integer op
    if name not in PRODUCT_PRIMITIVES and not any(
            _kind(v) in kinds for v in (*equation.invars, *equation.outvars)):
        return 0.0  # a product counts whatever its dtype: int8 matmuls are the op's work
    if name in PRODUCT_PRIMITIVES:
        out = sum(_size(v.aval) for v in equation.outvars)
        contracted = 1.0
        numbers = equation.params.get("dimension_numbers")
        if name == "dot_general" and numbers is not None:
            (lhs_contracting, _), _ = numbers
            lhs_shape = equation.invars[0].aval.shape
            contracted = float(math.prod(int(lhs_shape[d]) for d in lhs_contracting))
        elif len(equation.invars) > 1:  # a convolution: the kernel's size per output
            rhs = equation.invars[1].aval
            contracted = _size(rhs) / max(1, int(rhs.shape[0]) if rhs.shape else 1)
        return 2.0 * out * contracted
    if name in REDUCTION_PRIMITIVES:
        return sum(_size(getattr(v, "aval", None)) for v in equation.invars
                   if _kind(v) in kinds)
    if name in TRANSCENDENTAL_PRIMITIVES or name not in LAYOUT_PRIMITIVES:
        # Elementwise arithmetic (add, mul, div, max, ...) and anything unknown: one per
        # output element of a numeric result (not of a PRNG key or a semaphore).
        return sum(_size(var.aval) for var in equation.outvars if _kind(var) in kinds)
    return 0.0


def _kind(var: Any) -> str:
    """NumPy's kind letter of a variable's dtype ("f", "i", ...; "" for a PRNG key, a
    semaphore or a literal without one); bfloat16 reads as "f"."""
    dtype = getattr(getattr(var, "aval", None), "dtype", None)
    if dtype is None:
        return ""
    try:
        if np.issubdtype(dtype, np.inexact):
            return "f"
        return np.dtype(dtype).kind
    except TypeError:  # an extended dtype
        return ""


def _describe(equation: Any) -> str:
    shapes = ", ".join(f"{getattr(v.aval, 'dtype', '?')}{list(getattr(v.aval, 'shape', ()))}"
                       for v in equation.outvars)
    return f"{equation.primitive.name} -> {shapes}"


def _callback_description(equation: Any, *, in_kernel: bool) -> str | None:
    name = equation.primitive.name
    if name in PRINT_PRIMITIVES or name not in CALLBACK_PRIMITIVES:
        return None
    callback = equation.params.get("callback")
    function = getattr(callback, "callback_func", None) or getattr(callback, "callback", None)
    if name == "debug_callback" and _only_prints(function):
        return None
    what = getattr(function, "__qualname__", None) or getattr(function, "__name__", None)
    where = "inside a kernel" if in_kernel else "outside the kernels"
    if what:
        return f"{name}({what}) {where}"
    return f"{name} {where}"


def _only_prints(function: Any) -> bool:
    """Whether a debug callback is one of JAX's printers (``jax.debug.print``)."""
    module = getattr(function, "__module__", "") or ""
    qualname = getattr(function, "__qualname__", "") or ""
    return module.startswith("jax") and ("print" in qualname or "format" in qualname)


# Kernels that are not ``pallas_call`` equations: ``pl.core_map`` and ``pl.kernel`` (which
# traces to ``mpmd_map`` on jax 0.10), by their primitives' names.
MESH_KERNEL_PRIMITIVES = frozenset({"core_map", "mpmd_map"})


def _is_kernel(equation: Any) -> bool:
    return (equation.primitive is jax_internals.pallas_call_primitive()
            or equation.primitive.name in MESH_KERNEL_PRIMITIVES)


def _kernel_bodies(equation: Any) -> list[Any]:
    if equation.primitive is jax_internals.pallas_call_primitive():
        return [equation.params.get("jaxpr")]
    return [sub for value in equation.params.values() for sub in sub_jaxprs(value)]


def _walk(jaxpr: Any, times: float, tally: _Tally) -> None:
    for equation in _equations(jaxpr):
        name = equation.primitive.name
        if _is_kernel(equation):
            tally.kernels += 1
            for body in _kernel_bodies(equation):
                _callbacks_in_kernel(body, tally)
            continue
        callback = _callback_description(equation, in_kernel=False)
        if callback is not None:
            tally.callbacks.append(callback)
            continue
        subs = [sub for value in equation.params.values() for sub in sub_jaxprs(value)]
        if subs:
            repeat = times
            if name == "scan":
                repeat *= float(equation.params.get("length", 1) or 1)
            elif name == "shard_map":
                mesh = equation.params.get("mesh")
                repeat *= float(math.prod(int(n) for n in getattr(mesh, "axis_sizes", ()))
                                or 1)
            if name == "cond":  # one branch runs: the costliest counts
                worst: _Tally | None = None
                for sub in subs:
                    branch = _Tally(integers=tally.integers)
                    _walk(sub, repeat, branch)
                    tally.kernels += branch.kernels
                    tally.callbacks += branch.callbacks
                    if worst is None or branch.outside > worst.outside:
                        worst = branch
                if worst is not None:
                    _add(tally, worst.outside, worst.largest)
                continue
            for sub in subs:
                _walk(sub, repeat, tally)
            continue
        flops = _equation_flops(equation, tally.integers) * times
        if flops:
            _add(tally, flops, (flops, _describe(equation)))


def _add(tally: _Tally, flops: float, largest: tuple[float, str]) -> None:
    tally.outside += flops
    if largest[0] > tally.largest[0]:
        tally.largest = largest


def _callbacks_in_kernel(kernel_jaxpr: Any, tally: _Tally) -> None:
    for equation in _equations(kernel_jaxpr):
        callback = _callback_description(equation, in_kernel=True)
        if callback is not None:
            tally.callbacks.append(callback)
        for value in equation.params.values():
            for sub in sub_jaxprs(value):
                _callbacks_in_kernel(sub, tally)


def kernel_work(closed_jaxpr: Any) -> float:
    """The arithmetic inside the program's Pallas kernels: each kernel body's (a loop's
    body once, a ``scan``'s times its length) times its grid's steps.

    The measure of an op's work where no cost model states it (a kernel of the real-kernel
    corpora): its kernels' own arithmetic, floating-point and integer alike.
    """
    total = 0.0
    for equation, times in _equations_with_repeats(closed_jaxpr, 1.0):
        if not _is_kernel(equation):
            continue
        grid = getattr(equation.params.get("grid_mapping"), "grid", ()) or ()
        steps = float(math.prod(int(n) for n in grid if isinstance(n, int)) or 1)
        body = _Tally(integers=True)
        for kernel_body in _kernel_bodies(equation):
            _walk(kernel_body, 1.0, body)
        total += body.outside * steps * times
    return total


def _equations_with_repeats(jaxpr: Any, times: float) -> Iterator[tuple[Any, float]]:
    for equation in _equations(jaxpr):
        yield equation, times
        if _is_kernel(equation):
            continue
        repeat = times
        if equation.primitive.name == "scan":
            repeat *= float(equation.params.get("length", 1) or 1)
        for value in equation.params.values():
            for sub in sub_jaxprs(value):
                yield from _equations_with_repeats(sub, repeat)


def faster_than_roofline(roofline_seconds: float | None, measured_seconds: float
                         ) -> Finding | None:
    """A measured time below the least the chip's roofline allows for the op's FLOPs and
    bytes: a timer that stopped before the work did (a result not waited for, a patched
    clock, a cached result), never a fast kernel. None when it is not."""
    if roofline_seconds is None or roofline_seconds <= 0:
        return None
    if measured_seconds >= roofline_seconds:
        return None
    return Finding("faster-than-roofline", (
        f"measured {measured_seconds:.3g} s per call, below the {roofline_seconds:.3g} s the "
        "chip's roofline allows for the op's FLOPs and bytes: the timer did not measure the "
        "work (a result not waited for, a patched clock, a replayed result)"))
