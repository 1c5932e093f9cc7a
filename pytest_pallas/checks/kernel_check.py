"""Check a function's Pallas kernels against the TPU's rules, on any machine.

:func:`check_kernel` traces a function, finds every ``pallas_call`` in it
(nested in ``jit``, ``shard_map``, ``custom_vjp``, ... included), runs the
static checks of :mod:`pytest_pallas.checks.static_rules` on each, then lowers the
function for the TPU, which runs Mosaic's own lowering checks without a TPU.
:func:`checking_pallas_calls` runs the same static checks on every
``pallas_call`` traced while it is active (how the plugin checks the kernels
of a Pallas test), and :func:`kernel_exits_checked` fails on what the TPU
interpreter saw when each kernel ended (races, unbalanced semaphores, DMAs
never waited for). :func:`check_uninitialized_reads` runs a function twice in
the TPU interpreter, on NaN-poisoned and on zeroed memory: a result that
depends on what memory held before the kernel wrote it is a kernel reading
memory it never initialised.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas._compat import (
    device_kinds,
    gpu_interpreter,
    jax_internals,
    pallas_call_hooks,
    tpu_interpreter,
)
from pytest_pallas.checks import compile_check, jaxpr_analysis, kernel_model
from pytest_pallas.checks.chip_tracing import tracing_for_chip
from pytest_pallas.checks.mismatch import bitwise_differences
from pytest_pallas.checks.running import active_backend
from pytest_pallas.checks.runtime_rules import kernel_exit_violations
from pytest_pallas.checks.static_rules import (
    MAX_GRID_POINTS,
    check_pallas_call_info,
    is_output_race,
    settle_output_races,
)
from pytest_pallas.checks.violations import (
    UNINITIALIZED_READ,
    UNINITIALIZED_READ_FIX,
    KernelReport,
    TpuRuleViolation,
    Violation,
    compile_time_rules,
    raise_for,
    raised_by_the_lowering,
    rule_violation,
)
from pytest_pallas.checks.vmem_footprint import tpu_info_for

__all__ = [
    "CheckOptions",
    "TpuRuleViolation",
    "check_kernel",
    "check_uninitialized_reads",
    "checking_pallas_calls",
    "kernel_exits_checked",
    "PallasCallChecker",
    "pallas_call_checker",
]

MOSAIC_LOWERING = "mosaic-lowering"
# How a run names the static rules when a newer JAX turned them off.
STATIC_CHECKS = "the static TPU rules"


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """How strict the checks are.

    packed_sublanes: also require 16-row block multiples of 16-bit types,
        XLA's packed tiling (the TPU compiler accepts 8). 8- and 4-bit blocks
        need their native 32 or 64 rows either way.
    vmem_bound: "scoped" checks the VMEM footprint against the limit the
        kernel compiles under (``vmem_limit_bytes`` or the chip's default
        scoped limit); "capacity" only against the chip's VMEM.
    max_grid_points: grids up to this size have their index maps evaluated at
        every point; larger ones are judged from the axes each map reads.
    lower_for_tpu: ``check_kernel`` also lowers the function for the TPU.
    checks: which static rules run, by name (``checks.violations.static_rules()``); None,
        every registered one.
    """

    packed_sublanes: bool = False
    vmem_bound: str = "scoped"
    max_grid_points: int = MAX_GRID_POINTS
    lower_for_tpu: bool = True
    checks: tuple[str, ...] | None = None

    def static_options(self) -> dict[str, Any]:
        return {
            "checks": self.checks,
            "packed_sublanes": self.packed_sublanes,
            "vmem_bound": self.vmem_bound,
            "max_grid_points": self.max_grid_points,
        }


def check_kernel(
    fn: Callable[..., Any],
    *args: Any,
    chip: Any = None,
    check_options: CheckOptions | None = None,
    use_compiler: bool | None = None,
    **kwargs: Any,
) -> list[KernelReport]:
    """Check every Pallas kernel ``fn(*args, **kwargs)`` would run against the TPU's rules.

    ``args`` may be arrays or ``jax.ShapeDtypeStruct``s: nothing runs, the
    function is only traced (and compiled or lowered for the TPU). ``chip`` is
    a chip name (``"v5e"``, ``"v6e"``, ``"7x"``, ...) or a ``pltpu.TpuInfo``;
    by default the chip the Pallas test stands in for (``--pallas-chip``), v5e
    outside one. ``pltpu.TensorCoreMesh`` and ``pl.kernel`` see its TensorCores.

    With libtpu installed (the ``tpu`` extra) and a chip it knows, the TPU
    compiler judges each ``pallas_call`` (tiling, VMEM, what Mosaic lowers:
    :mod:`pytest_pallas.checks.compile_check`) and the static rules judge only the
    grid order (races on parallel axes, revisits), which no compiler checks;
    without it, the static rules judge everything and the function is lowered
    for the TPU. ``use_compiler`` forces one or the other (True without libtpu
    is an error); ``CheckOptions(lower_for_tpu=False)`` alone means the static
    rules alone. Each report's ``judged_by`` says which judged.

    Raises :class:`TpuRuleViolation` naming the kernel, the rule, the
    operand (or the compiler's message) and the fix; otherwise returns one
    :class:`KernelReport` per ``pallas_call`` (its VMEM footprint and limit,
    what was checked and what could not be).

        from jax.experimental.pallas.ops.tpu.matmul import matmul
        x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
        check_kernel(matmul, x, x, block_shape=(512, 512), chip="v5e")
    """
    options = check_options or CheckOptions()
    info = tpu_info_for(_chip_or_the_tests(chip))
    # lower_for_tpu=False asks for the static rules alone, unless use_compiler says otherwise.
    compiler_chip = _compiler_chip(
        info, use_compiler if use_compiler is not None or options.lower_for_tpu else False)
    static = options.static_options()
    target, args = _traced_arguments(fn, args, kwargs)
    # Trace and lower as the TPU would compile: pallas_call records at trace
    # time whatever interpreter a surrounding test forces, and would lower it
    # instead of Mosaic. pltpu.get_tpu_info() (emit_pipeline, rank-1 block
    # rules) must answer for the chip being checked. Observers a harness
    # installed would check the same kernels with their own options.
    device_kind = jax.devices()[0].device_kind
    with tracing_for_chip(device_kind, info):
        closed = jax.make_jaxpr(target)(*args)
        calls = list(jaxpr_analysis.pallas_call_equations_in(closed))
        # Which outputs the program keeps: a race on an output it drops is no bug.
        uses = [used for _, used in jaxpr_analysis.pallas_call_uses_in(closed)]
        reports = [
            settle_output_races(
                check_pallas_call_info(kernel_model.describe_pallas_call(params), info, **static),
                used)
            for (params, _, _), used in zip(calls, uses)
        ]
        if compiler_chip is not None:
            reports = [left_to_the_compiler(report) for report in reports]
        raise_for(reports)
        if compiler_chip is not None:
            _compile_each(calls, reports, compiler_chip)
        elif options.lower_for_tpu and reports:
            _lower_for_tpu(*_as_the_chip_compiles(target, args, closed), info,
                           _function_name(fn))
    return reports


def left_to_the_compiler(report: KernelReport) -> KernelReport:
    """``report`` without its tiling and VMEM findings, which the TPU compiler judges where it
    compiles the kernel (it is right where the two disagree): they stay as notes (the
    footprint too), and do not fail the kernel."""
    judged = [v for v in report.violations if v.rule in compile_time_rules()]
    if not judged:
        return report
    return dataclasses.replace(
        report, violations=[v for v in report.violations if v not in judged],
        skipped=[*report.skipped, *(f"static rule [{v.rule}] said: {v.problem} (the TPU "
                                    "compiler judged instead)" for v in judged)])


def _as_the_chip_compiles(target: Callable[..., Any], args: Sequence[Any],
                          closed: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """What lowering for the TPU lowers, and its arguments: the traced program with every
    pallas_call as Mosaic compiles it, even one built under a forced interpreter (jax 0.10
    records a forced interpreter in a pallas_call when it is built, so one made inside a
    Pallas test keeps it). ``target`` as it is where this JAX's jaxprs cannot be rewritten."""
    try:
        return jax_internals.as_compiled_for_the_chip(closed), tuple(jax.tree.leaves(args))
    except jax_internals.JaxInternalsChanged as error:
        jax_internals.feature_off("check_kernel's lowering of pallas_calls built under a "
                                "forced interpreter", error)
        return target, tuple(args)


def _compiler_chip(info: Any, use_compiler: bool | None) -> str | None:
    """The chip name to compile for, or None when the static rules judge alone."""

    if use_compiler is False:
        return None
    name = str(getattr(info.chip_version, "value", info.chip_version))
    available = compile_check.libtpu_version() is not None
    if use_compiler and not available:
        raise RuntimeError("check_kernel(use_compiler=True) needs libtpu: "
                           "pip install 'pytest-pallas[tpu]' (or jax[tpu]).")
    if use_compiler and name not in compile_check.COMPILER_CHIPS:
        raise ValueError(f"the TPU compiler knows no {name}; use one of "
                         f"{', '.join(compile_check.COMPILER_CHIPS)} or use_compiler=False.")
    if not available or name not in compile_check.COMPILER_CHIPS:
        return None
    return name


def _compile_each(calls: Sequence[Any], reports: list[KernelReport], chip: str) -> None:

    rejected = []
    for (params, avals, mesh_axes), report in zip(calls, reports):
        if not kernel_model.describe_pallas_call(params).for_tensor_core:
            continue  # the static report already says why it was skipped
        verdict = compile_check.verdict_for(params, avals, chip, mesh_axes)
        report.judged_by = f"TPU compiler (libtpu {compile_check.libtpu_version()}) for {chip}"
        report.compile_verdict = verdict
        report.checked.append(f"compiled for {chip}")
        if not verdict.compiled:
            violation = verdict.violation()
            report.violations.append(violation)
            rejected.append(violation)
    if rejected:
        raise rule_violation(rejected, by_the_compiler=True)


def _pallas_calls_in(target: Callable[..., Any], args: Sequence[Any]) -> list[tuple[Any, Any]]:
    """Every pallas_call tracing ``target(*args)`` makes, as ``PallasCallInfo``s, in order,
    each with which of its outputs the program uses."""
    closed = jax.make_jaxpr(target)(*args)
    return [(kernel_model.describe_pallas_call(params), used)
            for params, used in jaxpr_analysis.pallas_call_uses_in(closed)]


def _traced_arguments(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]):
    """``fn`` closed over its non-array arguments, and the array ones, which get traced.

    A positional argument is traced when every leaf of it is an array or a
    ``jax.ShapeDtypeStruct``; anything else (block sizes, flags) is passed as is,
    the way ``static_argnums`` would.
    """
    def is_array(leaf: Any) -> bool:
        return hasattr(leaf, "shape") and hasattr(leaf, "dtype")

    traced = [
        i
        for i, a in enumerate(args)
        if (leaves := jax.tree.leaves(a)) and all(is_array(x) for x in leaves)
    ]
    if len(traced) == len(args) and not kwargs:
        return fn, tuple(args)
    fixed = list(args)

    def target(*arrays: Any) -> Any:
        full = list(fixed)
        for position, array in zip(traced, arrays):
            full[position] = array
        return fn(*full, **kwargs)

    return target, tuple(args[i] for i in traced)


def _lower_for_tpu(target: Callable[..., Any], args: Sequence[Any], info: Any, name: str) -> None:
    try:
        jax.jit(target).trace(*args).lower(lowering_platforms=("tpu",))
    except Exception as error:  # Mosaic's reasons are in the message
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        summary = " ".join(lines[:3])
        if len(summary) > 600:
            summary = summary[:600] + " ..."
        raise rule_violation(
            [
                Violation(
                    MOSAIC_LOWERING,
                    f"in '{name}'",
                    None,
                    f"lowering for the TPU ({info.chip_version}) failed in Mosaic with "
                    f"{type(error).__name__}: {summary}",
                    "change what the message names (an operation, dtype or shape Mosaic "
                    "does not support on this chip); interpret mode accepts it but the TPU "
                    "compiler does not.",
                    raised=raised_by_the_lowering(error),
                )
            ],
            by_the_compiler=True,
        ) from error


def _function_name(fn: Callable[..., Any]) -> str:
    inner = getattr(fn, "func", fn)
    return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or repr(inner)


class PallasCallChecker:
    """An observer for ``_compat.pallas_call_hooks.observe_pallas_calls``: checks each
    pallas_call as traced (call it with the bind's params).

    Raises :class:`TpuRuleViolation` from inside the trace, which aborts it
    (so the broken kernel is never cached and fails again on the next call).
    Appends each report to ``reports`` if given. A pallas_call traced again
    with the same params (vmap, re-tracing) is checked once.

    With ``defer_output_races``, a race on an output is not raised at trace
    time: ``settle(params, used_outputs)`` (an observer for
    ``_compat.pallas_call_hooks.observe_pallas_call_uses``) raises it once the
    program shows that it uses that output, and drops it if it does not.

    With ``compiler_chip`` (the compile check runs for that chip beside this), call it with
    the operands' avals too: a broken kernel the TPU compiler accepts keeps the compiler's
    verdict on tiling and VMEM (:func:`left_to_the_compiler`); one it rejects raises the
    compiler's error first, in its words and the chip's exception type, as on the chip,
    where it never runs, then the static rules' reasons; one it does not judge keeps the
    static rules' verdict.
    """

    _KEPT = 512  # reports kept for kernels traced again; races pending for programs unlowered

    def __init__(self, chip: Any = "v5e", check_options: CheckOptions | None = None,
                 reports: list[KernelReport] | None = None, *,
                 defer_output_races: bool = False, compiler_chip: str | None = None) -> None:
        options = check_options or CheckOptions()
        self._compiler_chip = compiler_chip
        self._info = tpu_info_for(_chip_or_the_tests(chip))
        self._static = options.static_options()
        self._reports = reports
        self._defer_output_races = defer_output_races
        # The anchors' ids -> (the anchors, kept alive so ids stay unique; the report).
        self._seen: collections.OrderedDict[tuple[int, ...], tuple[Any, KernelReport]] = (
            collections.OrderedDict())
        # id(jaxpr) -> (the jaxpr, the report whose output races wait for its uses).
        self._pending: dict[int, tuple[Any, KernelReport]] = {}
        self._lock = threading.Lock()

    def __call__(self, params: dict[str, Any], avals: tuple[Any, ...] = ()) -> None:
        report = self._report(params)
        if report is None:
            return
        rejected_by_the_compiler = None
        if self._compiler_chip is not None and report.violations:
            verdict = self._compiler_verdict(params, avals)
            if verdict is not None and verdict.compiled:
                report = left_to_the_compiler(report)  # the compiler is right
            elif verdict is not None:
                rejected_by_the_compiler = verdict.violation()
        if self._reports is not None:
            self._reports.append(report)
        if rejected_by_the_compiler is not None:
            # On the chip the kernel never runs: the compiler's error first, then the static
            # rules' one-line reasons (what else is wrong, in the plugin's words).
            raise rule_violation([rejected_by_the_compiler, *report.violations],
                                 by_the_compiler=True)
        if not self._defer_output_races:
            raise_for([report])
            return
        now = [v for v in report.violations if not is_output_race(v)]
        if now:
            raise rule_violation(now)
        if len(now) < len(report.violations):
            with self._lock:
                self._pending[id(params.get("jaxpr"))] = (params.get("jaxpr"), report)
                while len(self._pending) > self._KEPT:  # traced but never lowered (make_jaxpr)
                    del self._pending[next(iter(self._pending))]

    def _compiler_verdict(self, params: dict[str, Any],
                          avals: tuple[Any, ...]) -> compile_check.CompileVerdict | None:
        """The TPU compiler's verdict on a kernel the static rules found broken (compiled
        now; the compile check then reads it from the cache), or None where it gives none."""
        try:
            return compile_check.verdict_if_judged(params, avals, self._compiler_chip)
        except (jax_internals.JaxInternalsChanged, compile_check.NotTheCompiler):
            return None  # the compile check cannot run: the static rules judge

    def _report(self, params: dict[str, Any]) -> KernelReport | None:
        """The rules' report on the pallas_call of ``params`` (once per kernel traced again);
        None when a newer JAX moved what the rules read."""
        anchors = (params.get("grid_mapping"), params.get("jaxpr"), params.get("compiler_params"))
        key = tuple(id(a) for a in anchors)
        with self._lock:
            cached = self._seen.get(key)
        if cached is not None and all(a is b for a, b in zip(cached[0], anchors)):
            return cached[1]
        try:
            described = kernel_model.describe_pallas_call(params)
        except jax_internals.JaxInternalsChanged as error:
            # A newer JAX moved what the rules read: the kernel runs unchecked.
            jax_internals.feature_off(STATIC_CHECKS, error)
            return None
        report = check_pallas_call_info(described, self._info, **self._static)
        with self._lock:
            self._seen[key] = (anchors, report)
            while len(self._seen) > self._KEPT:
                self._seen.popitem(last=False)
        return report

    def settle(self, params: dict[str, Any], used_outputs: tuple[bool, ...]) -> None:
        """Raise the output races of the program of ``params`` on the outputs it uses."""
        jaxpr = params.get("jaxpr")
        with self._lock:
            entry = self._pending.get(id(jaxpr))
            if entry is None or entry[0] is not jaxpr:
                return
            del self._pending[id(jaxpr)]
        report = entry[1]
        settled = settle_output_races(
            dataclasses.replace(report, violations=list(report.violations),
                                skipped=list(report.skipped)),
            used_outputs)
        raise_for([settled])


def pallas_call_checker(
    chip: Any = "v5e",
    check_options: CheckOptions | None = None,
    reports: list[KernelReport] | None = None,
    *,
    defer_output_races: bool = False,
    compiler_chip: str | None = None,
) -> PallasCallChecker:
    """The observer that checks each pallas_call as traced (``PallasCallChecker``)."""
    return PallasCallChecker(chip, check_options, reports,
                             defer_output_races=defer_output_races, compiler_chip=compiler_chip)


@contextlib.contextmanager
def checking_pallas_calls(
    chip: Any = "v5e", check_options: CheckOptions | None = None, *,
    compiler_chip: str | None = None,
) -> Iterator[list[KernelReport]]:
    """Statically check every pallas_call traced inside the block; yields the reports.

        with checking_pallas_calls(chip="v5e") as reports:
            my_kernel(x)  # raises TpuRuleViolation at trace time if broken

    A race on an output is judged when JAX lowers the program, by whether the
    program uses that output (``checks.static_rules.settle_output_races``); on a JAX
    whose dead-code elimination cannot be observed it is raised at trace time. With
    ``compiler_chip``, where the TPU compiler check runs for that chip: tiling and VMEM are
    the compiler's to judge (``PallasCallChecker``).
    """
    reports: list[KernelReport] = []
    with contextlib.ExitStack() as stack:
        # GPU kernels (Mosaic GPU, Triton) meet no TPU rule.
        only_tpu = gpu_interpreter.tpu_kernels_only
        checker = pallas_call_checker(chip, check_options, reports, defer_output_races=True,
                                      compiler_chip=compiler_chip)
        if not stack.enter_context(pallas_call_hooks.observe_pallas_call_uses(
                only_tpu(checker.settle))):
            checker = pallas_call_checker(chip, check_options, reports,
                                          compiler_chip=compiler_chip)
        stack.enter_context(pallas_call_hooks.observe_pallas_calls(
            only_tpu(checker), with_avals=compiler_chip is not None))
        yield reports


@contextlib.contextmanager
def kernel_exits_checked() -> Iterator[list[Any]]:
    """Fail if an interpreted kernel ended with a race, a semaphore off 0 or a DMA pending.

    Needs TPU interpret mode (``pltpu.InterpretParams``); races are looked for
    only with ``detect_races=True``. The check runs when the block ends
    normally; an exception from the block passes through unchanged.

        with
        pltpu.force_tpu_interpret_mode(_compat.jax_internals.interpret_params(detect_races=True)):
            with kernel_exits_checked():
                jax.block_until_ready(my_kernel(x))
    """
    with tpu_interpreter.record_kernel_exits() as states:
        yield states
    violations = kernel_exit_violations(states)
    if violations:
        raise TpuRuleViolation(violations)


# --- Reads of uninitialised memory ----------------------------------------------------------


def check_uninitialized_reads(
    fn: Callable[..., Any], *args: Any, interpret_params: Any = None, **kwargs: Any
) -> Any:
    """Fail if ``fn(*args, **kwargs)`` depends on memory its kernels never initialised.

    Runs the function twice in the TPU interpreter, with every buffer a kernel
    allocates (outputs, scratch, ``pl.run_scoped``) filled with NaN, then with
    zeros, and compares the results bit for bit. A difference means a kernel
    read memory before writing it: an accumulator not initialised at the first
    step of its reduction, an output element never written, a DMA destination
    read before the copy's ``.wait()``. That raises :class:`TpuRuleViolation`
    (rule ``uninitialized-read``) naming the kernels, the first differing
    output element and the fix. This catches integer kernels too, where a
    single poison value can hide the bug (a running max starting from the
    largest integer). Returns the result of the NaN-poisoned run.

    Not caught: a read of *stale* memory, such as an output block initialised
    only at the first grid step, whose later blocks start from the previous
    block's values in the TPU interpreter as on the chip. The values are wrong,
    and a comparison with the oracle catches that.

        out = check_uninitialized_reads(my_sum, x)
        assert_allclose(out, x.sum(0))
    """
    kernels = _kernel_titles(fn, args, kwargs)
    poisoned, zeroed = run_on_poisoned_and_zeroed_memory(
        lambda: jax.block_until_ready(fn(*args, **kwargs)), interpret_params)
    violation = uninitialized_read_violation(kernels, poisoned, zeroed)
    if violation is not None:
        raise TpuRuleViolation([violation])
    return poisoned


def run_on_poisoned_and_zeroed_memory(call: Callable[[], Any],
                                      interpret_params: Any = None) -> tuple[Any, Any]:
    """``call()`` in the TPU interpreter twice: fresh memory filled with NaN, then zeros.

    ``interpret_params`` (a ``pltpu.InterpretParams``; default ones otherwise) gives the
    rest of the interpreter's settings; race detection is off for both runs.
    """
    return (run_on_fresh_memory(call, "nan", interpret_params),
            run_on_fresh_memory(call, "zero", interpret_params))


def run_on_fresh_memory(call: Callable[[], Any], memory: str,
                        interpret_params: Any = None) -> Any:
    """``call()`` in the TPU interpreter with fresh memory filled with ``memory``: "nan"
    (NaN, the integer maximum, True) or "zero"; race detection off."""

    backend = active_backend()
    if not isinstance(interpret_params, pltpu.InterpretParams):
        own = getattr(backend, "interpret_params", None)
        # In a Pallas test, the run's parameters: the chip's TensorCores among them (a
        # megacore kernel run on one core waits for a prefetch only the other core issues).
        # Reads inside an array's tile padding are legal on the chip (see backend).
        interpret_params = (own if isinstance(own, pltpu.InterpretParams) else
                            jax_internals.with_tile_padded_bounds(pltpu.InterpretParams()))
    chip = backend.tpu_info if backend is not None else "v5e"
    params = dataclasses.replace(interpret_params, uninitialized_memory=memory,
                                 detect_races=False)
    with (device_kinds.chip_answering_on_this_device(lambda: tpu_info_for(chip)),
          pltpu.force_tpu_interpret_mode(params)):
        return call()


def poison_differs_from_zero(kernels: Sequence[kernel_model.PallasCallInfo]) -> bool:
    """Whether every buffer of ``kernels`` starts different from zero in JAX's plain
    interpreter, which fills fresh memory with NaN, the integer minimum and False.

    Then a result of the plain interpreter that equals, bit for bit, the result of the TPU
    interpreter with fresh memory zeroed shows that no read of fresh memory reached the
    result, as the NaN-filled and zeroed runs of the TPU interpreter would. A boolean,
    unsigned or int16 buffer starts at zero both ways (False, the minimum 0, a semaphore's
    0), and so does a float type without NaN: those need the TPU interpreter's own
    NaN-filled run.
    """
    def scoped(regions: Sequence[kernel_model.ScopedRegion]) -> Iterator[Any]:
        for region in regions:
            yield from (allocation.dtype for allocation in region.allocations)
            yield from scoped(region.children)

    dtypes = [dtype for info in kernels
              for dtype in (*(o.dtype for o in info.operands), *(s.dtype for s in info.scratch),
                            *scoped((info.scoped,)))]
    return bool(kernels) and all(_plain_poison_is_nonzero(dtype) for dtype in dtypes)


def _plain_poison_is_nonzero(dtype: Any) -> bool:

    try:
        dtype = np.dtype(dtype)
    except TypeError:  # a semaphore: not data the result is made of
        return True
    if dtype.kind == "i":
        # The minimum, but int16 is also how that interpreter stores a semaphore (jax 0.10 to
        # 0.12: pallas_core.SEMAPHORE_INTERPRET_DTYPE), and every int16 buffer starts at 0.
        return dtype.itemsize != 2
    if dtype.kind in "bu":
        return False  # False, and an unsigned minimum of 0
    try:  # floats, bfloat16 and the other ml_dtypes: NaN where the type has one
        with np.errstate(invalid="ignore"):
            poison = np.array([np.nan], np.float32).astype(dtype)
    except (TypeError, ValueError):
        return False
    return bool(np.isnan(poison.astype(np.float32))[0])  # float4's NaN is -0: no poison


def uninitialized_read_violation(kernel: str, poisoned: Any, zeroed: Any) -> Violation | None:
    """The violation, if the NaN-poisoned and the zeroed runs' results differ; else None."""

    difference = first_difference(poisoned, zeroed)
    if difference is None:
        return None
    label, a, b, differs = difference
    where = tuple(int(i) for i in np.argwhere(differs)[0]) if differs.ndim else ()
    return Violation(
        UNINITIALIZED_READ,
        kernel,
        label,
        f"{int(differs.sum())} of {differs.size} elements depend on what memory held before "
        f"the kernel ran (first at {where}: {_element(a, where)} with memory filled with NaN, "
        f"{_element(b, where)} with memory zeroed): the kernel reads memory it never wrote. "
        "On the TPU that memory holds whatever the last kernel left there.",
        UNINITIALIZED_READ_FIX,
    )


def first_difference(one: Any, other: Any) -> tuple[str, Any, Any, Any] | None:
    """The first output where two results of one kernel differ in shape, dtype or any bit:
    ``(label, one's array, other's array, mask of differing elements)``; None if they agree."""

    one_leaves = jax.tree_util.tree_flatten_with_path(one)[0]
    other_leaves = jax.tree.leaves(other)
    if len(one_leaves) != len(other_leaves):  # not one structure: they differ as a whole
        return ("the number of output arrays", np.asarray(len(one_leaves)),
                np.asarray(len(other_leaves)), np.ones((), bool))
    for (path, first), second in zip(one_leaves, other_leaves):
        a, b = np.asarray(first), np.asarray(second)
        if a.shape != b.shape or a.dtype != b.dtype:
            differs = np.ones(a.shape, bool)
        else:
            differs = bitwise_differences(a, b)
        if np.any(differs):
            return f"output{jax.tree_util.keystr(path)}", a, b, differs
    return None


def _element(array: Any, where: tuple[int, ...]) -> str:
    try:
        return repr(array[where].item())
    except (IndexError, ValueError):
        return "(shape differs)"


def _chip_or_the_tests(chip: Any) -> Any:
    """``chip``, or the chip the running Pallas test stands in for (v5e outside one)."""
    if chip is not None:
        return chip

    backend = active_backend()
    return backend.tpu_info if backend is not None else "v5e"


def _kernel_titles(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """The pallas_calls ``fn`` makes, as a message names them; the function's name otherwise."""
    try:
        target, traced = _traced_arguments(fn, args, kwargs)
        with pallas_call_hooks.suspend_pallas_call_observers():
            titles = [call.title for call, _ in _pallas_calls_in(target, traced)]
    except Exception:  # naming is best effort; running the function reports real errors
        titles = []
    titles = list(dict.fromkeys(titles))
    if not titles:
        return f"'{_function_name(fn)}'"
    return ", ".join(titles) if len(titles) < 4 else f"{', '.join(titles[:3])} (+{len(titles) - 3})"
