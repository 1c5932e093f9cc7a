"""What a broken TPU rule reports: ``Violation`` (one rule, one kernel, one paragraph),
``TpuRuleViolation`` (the error a test fails with) and ``KernelReport`` (what the checks
found for one pallas_call); the registry of the static rules (``static_rule``), each
registered where it is defined; the run-time rules' names.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .. import tiling
from .._compat.chip_errors import as_chip_compile_error

if TYPE_CHECKING:
    from pytest_pallas.checks.kernel_model import BlockOperand, PallasCallInfo


# The run-time rules: what the TPU interpreter saw at a kernel's exit, or an error of its own
# (checks/runtime_rules.py). The static rules' names are defined with the rules.

DATA_RACE = "data-race"


SEMAPHORES = "unbalanced-semaphores"


DMA_NOT_WAITED = "dma-not-waited"


DMA_OUT_OF_BOUNDS = "out-of-bounds-access"


UNINITIALIZED_READ = "uninitialized-read"


#: The fix for an uninitialized read, shared by every place that reports one.
UNINITIALIZED_READ_FIX = (
    "initialise each accumulator before its first read, at the first step of the reduction "
    "axis (@pl.when(pl.program_id(axis) == 0)); write every element of each output block; and "
    "read a DMA's destination only after its .wait()."
)


MIB = 1024 * 1024


class TpuRuleViolation(AssertionError):
    """A kernel breaks a rule the TPU enforces (or relies on) but interpret mode does not.

    ``violations`` holds one :class:`Violation` per rule broken; the message
    is their paragraphs, the first naming kernel, rule, operand and fix.
    """

    def __init__(self, violations: Sequence[Violation]):
        self.violations = tuple(violations)
        first = self.violations[0]
        self.kernel = first.kernel
        self.rule = first.rule
        self.operand = first.operand
        self.fix = first.fix
        super().__init__("\n\n".join(str(v) for v in self.violations))


@dataclasses.dataclass(frozen=True)
class Violation:
    """One rule broken by one kernel, as a one-paragraph explanation."""

    rule: str
    kernel: str  # the kernel's display title
    operand: str | None  # "input 0 (args[0], kernel parameter x_ref)", ...
    problem: str
    fix: str
    # For a race on an output: which output (its flat index), so the verdict can
    # wait for what the program does with that output (settle_output_races).
    output_index: int | None = None
    # The Python exception Mosaic's lowering raised for it ("NotImplementedError"), when it
    # did: on the chip the test meets that exception, so the error is one too.
    raised: str | None = None
    # Text the problem quotes in part, whole (the TPU compiler's message): printed after the
    # paragraph, for a test or a reader that wants every word of it.
    detail: str = ""

    def __str__(self) -> str:
        where = f" {self.operand}:" if self.operand else ""
        paragraph = (
            f"TPU rule [{self.rule}] broken by kernel {self.kernel}:{where} {self.problem} "
            f"Fix: {self.fix}"
        )
        return f"{paragraph}\n{self.detail}" if self.detail else paragraph


@dataclasses.dataclass
class KernelReport:
    """What the static checks found for one pallas_call."""

    kernel: str
    grid: tuple[int | None, ...]
    dimension_semantics: tuple[str, ...]
    vmem_bytes: int | None = None
    vmem_limit_bytes: int | None = None
    vmem_limit_source: str = ""
    checked: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    violations: list[Violation] = dataclasses.field(default_factory=list)
    # What the chip may get wrong, depending on values the checks cannot see (an output
    # block the grid comes back to, which the kernel writes before reading): no verdict,
    # named in a failed test's report.
    suspects: list[Violation] = dataclasses.field(default_factory=list)
    # Each VMEM-blocked output's (array shape, block shape): where a value failure's
    # mismatches are located (see mismatch.py).
    output_blocks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    # Who judged tiling, VMEM and lowering: "static rules", or "TPU compiler (libtpu ...)"
    # when check_kernel compiled the call (compile_check.CompileVerdict in compile_verdict).
    judged_by: str = "static rules"
    compile_verdict: Any = None
    # An output under pl.Buffered(revisit=pl.RevisitMode.ANY): the chip reads the block
    # back when the grid returns to it, which JAX's TPU interpreter does not (it stops).
    revisits_any: bool = False
    # An operand in host memory (pl.HOST): neither of JAX's interpreters runs such a kernel on
    # the CPU (JAX's own interpret tests skip it).
    uses_host_memory: bool = False
    # A DMA signalling a regular semaphore (TPU v6+): JAX's TPU interpreter adds the DMA's
    # bytes to it, where the chip's DMA signals it once (JAX's test_dma_with_regular_semaphore).
    dma_signals_regular_semaphore: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations


def describe_operand(operand: BlockOperand) -> str:
    """``input 0 (args[0], kernel parameter x_ref)``."""
    names = [operand.origin]
    if operand.parameter and operand.parameter != operand.origin:
        names.append(f"kernel parameter {operand.parameter}")
    return f"{operand.role} {operand.index} ({', '.join(names)})"


def block_text(operand: BlockOperand) -> str:
    dims = ", ".join("None" if kind == "squeezed" else str(size)
                     for kind, size in operand.block_dims)
    array = ", ".join(str(d) for d in operand.array_shape)
    comma = "," if len(operand.block_dims) == 1 else ""
    return f"block shape ({dims}{comma}) over a {name_of_dtype(operand.dtype)}[{array}] array"


def name_of_dtype(dtype: Any) -> str:
    return str(getattr(dtype, "name", dtype))


def dtype_bits(dtype: Any) -> int | None:
    return tiling.bits_of(dtype)


def mib_text(n: float) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB / 10 else f"{n / 1024:.1f} KiB"


def raise_for(reports: Iterable[KernelReport]) -> None:
    """Raise one :class:`TpuRuleViolation` carrying every violation in ``reports``, if any."""
    violations = [v for report in reports for v in report.violations]
    if violations:
        raise rule_violation(violations)


def rule_violation(violations: Sequence[Violation], *,
                   by_the_compiler: bool = False) -> TpuRuleViolation:
    """The error for ``violations``: a ``TpuRuleViolation``, and, when the chip's compiler
    rejects them (``by_the_compiler``: its own verdict or Mosaic's lowering; else one of them
    is a ``compile_time_rules()`` rule, which stops the kernel before any run-time rule could
    matter), also the error JAX raises on the chip for that (``_compat.chip_errors``), so a
    test that expects the chip's rejection sees it."""
    if by_the_compiler or any(v.rule in compile_time_rules() for v in violations):
        lowering = next((_builtin_exception(v.raised) for v in violations if v.raised), None)
        return as_chip_compile_error(TpuRuleViolation, lowering)(violations)
    return TpuRuleViolation(violations)


def _builtin_exception(name: str) -> type[Exception] | None:
    """Python's own exception type called ``name`` (what Mosaic's lowering raises), or None."""
    found = getattr(builtins, name, None)
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def raised_by_the_lowering(error: BaseException) -> str | None:
    """``error``'s type name when it is one of Python's own (``NotImplementedError``, ...):
    Mosaic's lowering raising it, not the compiler's verdict."""
    return type(error).__name__ if type(error).__module__ == "builtins" else None


# --- the static rules ---------------------------------------------------------------------------
#
# A static rule judges one pallas_call from the project's model of it before anything runs. It
# is one function, registered where it is defined with ``@static_rule(name, stage=...)``, that
# returns the ``Violation``s it finds, each with its problem and fix; ``checks/static_rules.py``
# runs every registered rule (``CheckOptions(checks=...)`` selects them by name) and nothing
# else names one.

#: Where the chip meets a static rule's breach, in the order it does: Mosaic's lowering rejects
#: a block shape, then the compiler's allocation a VMEM footprint, both before the kernel runs
#: (the compile check judges those itself where it runs); a grid-order breach the chip runs,
#: and its results are wrong.
STAGES = ("lowering", "allocation", "run")


@dataclasses.dataclass(frozen=True)
class RuleOptions:
    """How strict the static rules are (``kernel_check.CheckOptions`` says what each means)."""

    packed_sublanes: bool
    vmem_bound: str
    max_grid_points: int


#: ``check(call, info, options, report) -> violations``: the rule on one pallas_call for the chip
#: ``info`` describes; ``report`` takes what else it learnt (a footprint, a note of what it
#: could not judge).
RuleCheck = Callable[["PallasCallInfo", Any, RuleOptions, KernelReport], list[Violation]]


@dataclasses.dataclass(frozen=True)
class StaticRule:
    """A registered static rule: its ``name`` (what ``CheckOptions(checks=...)`` selects),
    its ``check``, its ``stage`` (``STAGES``) and the rule names its violations carry
    (``reports``: its own name, or several for one check that reads the grid once)."""

    name: str
    check: RuleCheck
    stage: str
    reports: tuple[str, ...]


_STATIC_RULES: dict[str, StaticRule] = {}


def static_rule(name: str, *, stage: str,
                reports: Sequence[str] | None = None) -> Callable[[RuleCheck], RuleCheck]:
    """Register the decorated ``check`` as the static rule ``name``."""
    if stage not in STAGES:
        raise ValueError(f"static rule {name!r}: stage {stage!r} is not one of {STAGES}")

    def register(check: RuleCheck) -> RuleCheck:
        known = _STATIC_RULES.get(name)
        # The same function registers again when its module is imported afresh (pytester's
        # in-process runs drop the modules a run imported).
        if known is not None and _where(known.check) != _where(check):
            raise ValueError(f"two static rules are named {name!r} ({_where(known.check)} and "
                             f"{_where(check)}); give the new one another name")
        _STATIC_RULES[name] = StaticRule(name, check, stage, tuple(reports or (name,)))
        return check

    return register


def _where(check: RuleCheck) -> str:
    return f"{check.__module__}.{check.__qualname__}"


def static_rules() -> tuple[StaticRule, ...]:
    """The registered static rules, in the order the chip meets them (``STAGES``), then in the
    order they were registered."""
    return tuple(sorted(_STATIC_RULES.values(), key=lambda rule: STAGES.index(rule.stage)))


def compile_time_rules() -> frozenset[str]:
    """The rule names whose breach the chip's compiler rejects, before the kernel runs."""
    return frozenset(name for rule in _STATIC_RULES.values() if rule.stage != "run"
                     for name in rule.reports)
