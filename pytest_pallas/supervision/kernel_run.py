"""One Pallas test's kernels, supervised: ``KernelRun``.

The plugin opens one at a Pallas test's setup and closes it at its teardown (the way
pytest-xdist hands scheduling to its own object). In between it owns everything about that
test's kernels: the backend and the checks entered around them (``open``), the watchdog
around the call (``watchdog``), what the kernels recorded (exit states, the static checks'
reports, the GPU kernels run on the CPU and their races), and the verdicts read from them
when the call ends: a race, a semaphore off 0 or a DMA pending fails the test
(``after_success``); an exception is read as a hang, a TPU rule, a race, a limit of JAX's GPU
interpreter or a crash inside JAX's interpreter, which runs the test again in the other
interpreter (``after_failure``); a GPU kernel met with a TPU's numbers runs the test again
with the GPU's; a failure showing NaN is explained (``failure_notes``).
The words of each verdict are ``supervision.diagnoses``'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable

import jax
import pytest
from jax.experimental.pallas import tpu as pltpu

from .._compat import (
    gpu_interpreter,
    interpreter_barriers,
    jax_internals,
    out_of_bounds,
    output_revisits,
    pallas_call_hooks,
    tpu_interpreter,
)
from .._compat.compiled_artefacts import ChipArtefactUnavailable, chip_artefacts_read
from .._compat.device_under_test import stand_in_chip_under_test
from .._compat.pytest_internals import run_test_again, skip_at_test
from ..backend import Backend, make_interpret_params
from ..checks.chip_tracing import chip_compiler
from ..checks.compile_check import compiling_pallas_calls, libtpu_platform_version
from ..checks.kernel_check import STATIC_CHECKS, checking_pallas_calls
from ..checks.mismatch import TracedOutput, traced_output_blocks
from ..checks.runtime_rules import kernel_exit_violations, translate_interpreter_error
from ..checks.static_rules import REVISIT
from ..checks.violations import TpuRuleViolation
from ..compare import (
    GpuKernelName,
    backend_matmul_precision,
    interpreted_kernels,
    traced_kernels,
)
from ..numerics import kernels_with_rounded_dots, rounding_note
from ..settings import PallasOptions
from . import diagnoses
from .timeout import PallasTimeout, Watchdog

# A feature built on private JAX internals, by the name a run reports when it is off.
KERNEL_EXIT_CHECKS = "the kernel-exit checks (semaphores, DMAs, races)"
TPU_COMPILER_CHECK = "the TPU compiler check"
GPU_RACE_CHECK = "the GPU interpreter's race report"
DEVICE_UNDER_TEST = "the stand-in chip as the device under test"
ROUNDED_DOTS_NOTE = "the failure's note on float32 dots the chip rounds"
UNCHECKED_READS_NOTE = "the failure's note on reads past a buffer the chip does not check"
REVISITS_NOTE = "the failure's note on output blocks the grid came back to"


class GpuNumbersFromTheStart(BaseException):
    """Raised at the first GPU kernel of a test's call that began with a TPU's numbers: the
    test runs again with the GPU's from its start (an XLA reference it computed before the
    kernel has the TPU's rounding, a false alarm no GPU gives). A BaseException, so that
    the test's own ``except Exception`` does not take it."""


class PallasInterpreterFallback(UserWarning):
    """A test ran in the other interpreter because JAX's first choice crashed inside JAX."""


class KernelRun:
    """One Pallas test's kernels: the backend and checks around them, and their verdicts."""

    def __init__(self, item: pytest.Item, backend: Backend, options: PallasOptions, *,
                 conformance: bool = False, chip_under_test: str | None = None,
                 compile_check: bool = True,
                 on_compile_verdict: Callable | None = None,
                 gpu_kernel_files: set[str] | None = None) -> None:
        """``conformance``: a test of the conformance suite, which judges its own failures
        (no fallback, no NaN note); ``chip_under_test``: which of the test's own device
        questions get the stand-in chip's answers (``_compat.device_under_test``): ``"device"``
        all of them, ``"generation"`` only which TPU generation (a test written for the
        interpreter, which keeps seeing the CPU), None none; ``compile_check``: the
        TPU compiler judges its kernels (``--pallas-compile``; not for a test written for the
        interpreter only);
        ``on_compile_verdict``: called with each TPU compiler verdict (the conformance
        report's record of its op); ``gpu_kernel_files``: the run's test files whose tests
        ran GPU kernels (this one's added when it does).

        A test's numbers on the CPU are a GPU's from its start (``Backend.gpu_numbers``) when
        its module imports Pallas's GPU modules and not its TPU ones, or a test of its file
        ran a GPU kernel before; else its first GPU kernel runs it again with them."""
        self._gpu_kernel_files = gpu_kernel_files if gpu_kernel_files is not None else set()
        if backend.float32_dot_rounding == "bfloat16" and (
                str(item.path) in self._gpu_kernel_files
                or gpu_interpreter.module_writes_gpu_kernels(getattr(item, "module", None))):
            backend = dataclasses.replace(backend, gpu_numbers=True)
        self.item = item
        self.chip_under_test = chip_under_test
        self.compile_check = compile_check
        self.backend = backend
        self.options = options
        self.conformance = conformance
        self._on_compile_verdict = on_compile_verdict
        self._stack: contextlib.ExitStack | None = None
        self._kernel_exits: list = []  # each TPU-interpreted kernel's state at its exit
        self._reports: list = []  # the static checks' report of each pallas_call traced
        self._gpu_kernels: list = []  # the GPU kernels the test ran on the CPU, and where
        self._gpu_races: list = []  # True per GPU-interpreted kernel that ended with a race
        self._rounded_dots: list = []  # kernels with a float32 dot the chip rounds
        self._artefacts_read: list[str] = []  # compiled programs the test read (failure note)
        self._chip_artefacts = False  # whether what it read was the chip's (§12)
        self._host_memory_shortages: list = []  # kernels too large for the host's memory
        self._unchecked_reads: list = []  # reads past a buffer the chip does not check
        self._revisits: list = []  # output blocks the grid came back to
        # Kernels run in the plain path that met what the TPU interpreter stops.
        self._plain_path_doubts: list[str] = []
        self._calling = False  # the test's call has begun (its setup is over)

    # --- open and close -----------------------------------------------------------------

    def open(self) -> None:
        """Enter the test's backend and the TPU-fidelity checks (see ``checks.static_rules``)."""
        backend = self.backend
        stack = contextlib.ExitStack()
        optional = jax_internals.optional_feature
        if not backend.is_tpu:
            # A kernel that raised while interpreted leaves the TPU interpreter's
            # shared memory behind; start every test from a clean interpreter.
            tpu_interpreter.reset_interpreter_state()
            # The interpreter keeps the race flag of its last kernel only, and
            # only prints unbalanced semaphores: record every kernel's exit.
            self._kernel_exits = _list_or_empty(stack.enter_context(optional(
                KERNEL_EXIT_CHECKS, tpu_interpreter.record_kernel_exits)))
            # The same for JAX's GPU interpreter, which runs Mosaic GPU kernels.
            gpu_interpreter.reset_gpu_interpreter_state()
            self._gpu_races = _list_or_empty(stack.enter_context(optional(
                GPU_RACE_CHECK, gpu_interpreter.gpu_races_recorded)))
            # Reads past a buffer that the chip does not check read poison: a failure
            # names them (failure_notes).
            self._unchecked_reads = _list_or_empty(stack.enter_context(optional(
                UNCHECKED_READS_NOTE, out_of_bounds.unchecked_reads_recorded)))
            # So do output blocks the grid came back to, which hold poison at the revisit.
            self._revisits = _list_or_empty(stack.enter_context(optional(
                REVISITS_NOTE, output_revisits.revisited_blocks_recorded)))
        # Tiling, VMEM footprint, parallel-axis races and revisits, checked as
        # each pallas_call is traced (on a TPU too: the chip does not complain).
        compile_chips = self.compile_chips()
        compiling = bool(not backend.is_tpu and compile_chips and self.compile_check)
        if not backend.is_gpu:
            # Where the compile check compiles for the stand-in chip, tiling and VMEM are the
            # compiler's to judge, in its words, as on the chip.
            compiler_chip = backend.chip if compiling and backend.chip in compile_chips else None
            self._reports = _list_or_empty(stack.enter_context(optional(
                STATIC_CHECKS, lambda: checking_pallas_calls(chip=backend.chip,
                                                             compiler_chip=compiler_chip))))
        if compiling:
            # Then the TPU compiler's verdict on each kernel, for each chip asked for.
            stack.enter_context(optional(TPU_COMPILER_CHECK, lambda: compiling_pallas_calls(
                compile_chips, on_verdict=self._on_compile_verdict)))
        if not backend.is_tpu:
            # A NaN where the reference is finite then names the rule and these kernels.
            stack.enter_context(interpreted_kernels(self._interpreted_kernel_names))
        if not backend.is_compiled:
            # What a test reads of a lowering or a compile is then the chip's (§12), where it
            # stands in for the chip; elsewhere a failure says it read an interpreted kernel's.
            self._chip_artefacts = self.chip_under_test == "device"
            self._artefacts_read = stack.enter_context(chip_artefacts_read(
                [], chip_compiler(backend.chip, backend.device_kind)
                if self._chip_artefacts else None))
        # A bare comparison's failure then names the error model of a traced paged or
        # ragged attention kernel.
        stack.enter_context(traced_kernels(self._traced_kernel_names))
        # A value failure then locates its mismatches in the traced kernels' output blocks.
        stack.enter_context(traced_output_blocks(lambda: [
            TracedOutput(report.kernel, array_shape, block_shape)
            for report in self._reports for array_shape, block_shape in report.output_blocks]))
        rounding = backend.float32_dot_rounding
        if rounding is not None:
            # A failure then says which kernels had a dot the chip rounds.
            self._rounded_dots = _list_or_empty(stack.enter_context(optional(
                ROUNDED_DOTS_NOTE, lambda: kernels_with_rounded_dots(rounding))))
        # assert_allclose in the test then allows for the backend's matmul rounding.
        stack.enter_context(backend_matmul_precision(backend.matmul_precision))
        stack.enter_context(backend.activate(
            on_gpu_kernel=self._heard_gpu_kernel,
            on_host_memory_shortage=self._host_memory_shortages.append,
            on_plain_path_doubt=self._plain_path_doubts.append))
        if self.chip_under_test is not None:
            # Then the test's own "am I on a TPU?" gets the stand-in chip's answer (§9).
            stack.enter_context(optional(DEVICE_UNDER_TEST, lambda: stand_in_chip_under_test(
                backend.chip, lambda: libtpu_platform_version(backend.chip),
                devices=backend.chip_devices(),
                generation_only=self.chip_under_test == "generation")))
        self._stack = stack

    def compile_chips(self) -> tuple[str, ...]:
        """The chips the compile check compiles this test's kernels for: those the user named
        (--pallas-compile), else, in a run of several chips, the test's own."""
        chips = self.options.compile_chips
        if self.options.several_chips and not self.options.compile_given:
            return tuple(chip for chip in chips if chip == self.backend.chip)
        return chips

    def close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        if self._gpu_kernels:
            self._gpu_kernel_files.add(str(self.item.path))
        try:
            stack.close()
        except jax_internals.JaxInternalsChanged as error:  # met at a kernel's exit
            jax_internals.feature_off(KERNEL_EXIT_CHECKS, error)

    def begin_call(self) -> None:
        """The test's call begins: from here a GPU kernel met with a TPU's numbers runs the
        test again with the GPU's (in its setup, the rest of the setup and the call get
        the GPU's)."""
        self._calling = True

    def _heard_gpu_kernel(self, kernel: object) -> None:
        # The test's first GPU kernel, in its call, with the TPU's numbers (one in its setup
        # already turned the rest of the setup and the call to the GPU's).
        first_in_call = self._calling and not self._gpu_kernels
        self._gpu_kernels.append(kernel)
        if first_in_call and self.backend.float32_dot_rounding == "bfloat16":
            raise GpuNumbersFromTheStart(getattr(kernel, "name", "kernel"))

    def _run_with_gpu_numbers(self, watchdog: Watchdog) -> None:
        """Run the test again with the GPU's numbers from its start (``GpuNumbersFromTheStart``)."""
        __tracebackhide__ = True
        self.close()
        self.backend = dataclasses.replace(self.backend, gpu_numbers=True)
        self.open()
        try:
            run_test_again(self.item)
        except BaseException as second:
            self.after_failure(second, watchdog)

    def _plain_path_doubted(self) -> bool:
        """Whether a kernel of the call ran in the plain path and met what the TPU interpreter
        stops (a block index out of bounds, an output block revisited): the call's outcome
        is then not the TPU interpreter's."""
        if not self.backend.plain_path:
            return False

        try:
            jax.effects_barrier()  # the kernels' doubts are told as they run
        except Exception:  # noqa: BLE001  # a failed computation: its error is the test's
            pass
        return bool(self._plain_path_doubts)

    def _run_in_tpu_interpreter_always(self, watchdog: Watchdog) -> None:
        """Run the test again with every kernel in the TPU interpreter, whose outcome is then
        the test's (``_plain_path_doubted``). JAX's caches are cleared first: a program traced
        with a kernel in the plain path would otherwise be served again."""
        __tracebackhide__ = True

        self._plain_path_doubts.clear()
        self.close()
        self.backend = self.backend.with_tpu_interpreter_always()
        jax.clear_caches()
        tpu_interpreter.reset_interpreter_state()
        self.open()
        try:
            run_test_again(self.item)
        except BaseException as second:
            # The first run's error is not the verdict: the report shows this run's alone.
            second.__suppress_context__ = True
            self.after_failure(second, watchdog)
        else:
            self.after_success(watchdog)

    # --- what the kernels recorded ------------------------------------------------------

    def gpu_kernels_run(self) -> list:
        """The GPU kernels the test ran on the CPU (``_compat.gpu_interpreter.RoutedKernel``),
        each once."""
        kernels = []  # RoutedKernel is a mutable dataclass: compared, not hashed
        for kernel in self._gpu_kernels:
            if kernel not in kernels:
                kernels.append(kernel)
        return kernels

    def _gpu_interpreted(self) -> list[str]:
        """The names of the Mosaic GPU kernels JAX's GPU interpreter ran, in order."""
        return [kernel.name for kernel in self.gpu_kernels_run() if kernel.interpreter == "gpu"]

    def _traced_kernel_names(self) -> list[str]:
        return [report.kernel for report in self._reports]

    def _interpreted_kernel_names(self) -> list[str]:
        """The kernels a NaN read from unwritten memory may come from: every traced one,
        then the GPU-interpreted ones (named so the note speaks of SMEM, not VMEM)."""
        return self._traced_kernel_names() + [
            GpuKernelName(name) for name in self._gpu_interpreted()]

    # --- the call: a watchdog around it, and what it left ---------------------------------

    def watchdog(self, on_stuck: Callable[[str, float], None] | None = None) -> Watchdog:
        """The ``--pallas-timeout`` watchdog for the test's call (none when compiled);
        ``on_stuck(text, seconds)`` ends the process of a test that cannot be stopped in it."""
        seconds = 0.0 if self.backend.is_compiled else self.options.timeout_seconds
        return Watchdog(seconds, self._running_kernels_text, kernel_ages=self._kernel_ages,
                        last_kernel_event=self._last_kernel_event,
                        checks_age=self._checks_age, test_name=self.item.nodeid,
                        test_file=str(self.item.path),
                        on_stuck=on_stuck)

    def after_success(self, watchdog: Watchdog) -> None:
        """A test that returned still fails on a hang the watchdog broke or what its kernels
        left behind (a race, a semaphore off 0, a DMA pending)."""
        __tracebackhide__ = True
        if watchdog.fired:
            raise watchdog.failure()
        if self._plain_path_doubted():
            return self._run_in_tpu_interpreter_always(watchdog)
        failure = self.kernel_exit_failure()
        if failure is not None:
            fallback = self.interpreter_fallback(failure)  # a limit of the TPU interpreter's
            if fallback is None:
                raise failure
            self._run_in_other_interpreter(*fallback)  # the TPU interpreter miscounted

    def after_failure(self, error: BaseException, watchdog: Watchdog) -> None:
        """What the test's ``error`` means: a hang, a TPU rule, the race behind wrong values,
        a limit of JAX's GPU interpreter (a skip), or a crash inside JAX's interpreter (the
        test again in the other one); else ``error`` itself. Raises, or returns after the
        rerun passed."""
        __tracebackhide__ = True
        if watchdog.fired:
            # Devices that never came to a kernel's start: JAX's TPU interpreter waits for
            # every device of the mesh there, the chip does not (if the kernel talks to none).
            alone = [stop for stop in interpreter_barriers.kernels_stopped_short()
                     if not stop.talks_to_other_devices]
            if alone:
                skip_at_test(diagnoses.kernel_on_some_devices(alone[-1], watchdog.seconds))
        if watchdog.fired and not isinstance(error, PallasTimeout):
            raise watchdog.failure() from error
        if isinstance(error, GpuNumbersFromTheStart):
            return self._run_with_gpu_numbers(watchdog)
        if not isinstance(error, Exception):
            raise error
        if self._plain_path_doubted():
            return self._run_in_tpu_interpreter_always(watchdog)
        if self._host_memory_shortages:
            skip_at_test(diagnoses.host_memory_shortage(self._host_memory_shortages[-1]))
        if isinstance(error, ChipArtefactUnavailable):
            skip_at_test(str(error))  # the chip's compiled program needs libtpu
        if self._tpu_interpreter_limit(error) is None:
            diagnoses.raise_as_tpu_rule(error)
            exit_failure = self.kernel_exit_failure()
            if exit_failure is not None:
                raise exit_failure from error  # the race behind the wrong values, say
        if not self.backend.is_compiled:
            gpu_limit = diagnoses.gpu_interpreter_limit(error, self.gpu_kernels_run())
            if gpu_limit is not None:
                skip_at_test(gpu_limit)  # a GPU kernel never falls back to the TPU interpreter
            host_memory = [report.kernel for report in self._reports if report.uses_host_memory]
            if host_memory:
                skip_at_test(diagnoses.host_memory_limit(host_memory[-1], error))
            if jax_internals.pinned_buffer_refused(error):
                skip_at_test(diagnoses.pinned_buffer_limit(self._traced_kernel_names()))
        fallback = self.interpreter_fallback(error)
        if fallback is None:
            raise error
        self._run_in_other_interpreter(*fallback)

    def kernel_exit_failure(self) -> AssertionError | None:
        """The failure for what the test's kernels left at their exit (a race, ...), if any.

        Also asked when the test failed otherwise: a race is the cause of the wrong
        values it produced, and the failure should say so first.
        """
        gpu_race = self._gpu_race_failure()
        if gpu_race is not None:
            return gpu_race
        exits = list(self._kernel_exits)
        if self.options.detect_races and tpu_interpreter.races_found() and not any(
                state.race_found for state in exits):
            tpu_interpreter.reset_interpreter_state()
            return AssertionError(diagnoses.TPU_RACE_MESSAGE)
        if not self.options.detect_races:
            # A race found without --pallas-detect-races was asked for by the kernel's own
            # InterpretParams(detect_races=True): the test judges it (JAX's own race tests
            # assert that the detector fires), not the plugin.
            exits = [dataclasses.replace(state, race_found=False) for state in exits]
        violations = kernel_exit_violations(exits)
        if violations:
            tpu_interpreter.reset_interpreter_state()
            return TpuRuleViolation(violations)
        return None

    def _gpu_race_failure(self) -> AssertionError | None:
        """Under ``--pallas-detect-races``: the failure for a race that JAX's GPU interpreter
        found in a Mosaic GPU kernel of the test, else None."""
        if not self.options.detect_races:
            return None
        if not (self._gpu_races or gpu_interpreter.races_pending()):
            return None
        names = sorted(set(self._gpu_interpreted()))
        self._gpu_races.clear()
        gpu_interpreter.reset_gpu_interpreter_state()
        return AssertionError(diagnoses.gpu_race_message(names))

    def interpreter_fallback(self, error: BaseException) -> tuple | None:
        """After JAX's interpreter crashed inside JAX: ``(interpret params, paragraph)`` to run
        the test again with, or None (a TPU run, a conformance test, not such a crash).

        The TPU interpreter falls back to the plain one (values, not DMAs, semaphores,
        races or poisoned memory), the plain one to the TPU one.
        """
        backend = self.backend
        if backend.is_tpu or self.conformance:
            return None
        crash = jax_internals.interpreter_crash(error)
        limit = None if crash is not None else self._tpu_interpreter_limit(error)
        if crash is None and limit is None:
            return None
        kernels = self._traced_kernel_names()
        which = f"kernel {kernels[-1]}" if kernels else "a kernel of this test"
        if backend.interpreter == "tpu":
            params = True
        else:
            params = make_interpret_params(
                dataclasses.replace(self.options, interpreter="tpu", tpu_interpreter_always=True),
                backend.tpu_info)
        return params, diagnoses.fallback_paragraph(backend.interpreter, crash or limit, which,
                                                    crashed=crash is not None)

    def _tpu_interpreter_limit(self, error: BaseException) -> str | None:
        """A failure that is the TPU interpreter's limit, not the kernel's bug, in one line
        (the test then runs in the plain interpreter); else None:

        - a kernel whose DMA signals a regular semaphore: the TPU interpreter adds the DMA's
          bytes to it, so the kernel's waits of one pass early and its semaphores end off 0;
          the chip (TPU v6+) signals it once per DMA;
        - its revisit check stopping a kernel whose output asked for ``pl.RevisitMode.ANY``
          (JAX's interpreter does not read a revisited block back, so it refuses; the chip
          does).
        """
        if self.backend.interpreter != "tpu":
            return None
        if any(report.dma_signals_regular_semaphore for report in self._reports):
            return ("it adds a DMA's bytes to the regular semaphore the DMA signals "
                    "(pltpu.SemaphoreType.REGULAR), which the chip signals once per DMA")
        if not any(report.revisits_any for report in self._reports):
            return None
        violation = translate_interpreter_error(error)
        if violation is None or violation.rule != REVISIT:  # an out-of-bounds access stays
            return None
        return ("it stops at an output block revisited under "
                "pl.Buffered(revisit=pl.RevisitMode.ANY), which the chip reads back")

    def _run_in_other_interpreter(self, params: object, paragraph: str) -> None:
        """Run the test again with ``params`` after JAX's interpreter crashed inside JAX."""
        __tracebackhide__ = True

        tpu_interpreter.reset_interpreter_state()
        try:
            with pltpu.force_tpu_interpret_mode(params):
                run_test_again(self.item)
        except Exception as second:
            reason = diagnoses.cannot_interpret(paragraph, second)
            if reason is not None:
                skip_at_test(reason)
            second.add_note(paragraph)
            raise
        with warnings.catch_warnings():
            # A notice of the plugin's, never the test's failure: a suite that turns its
            # warnings into errors (JAX's own, -W error) still passed here.
            warnings.simplefilter("always", PallasInterpreterFallback)
            warnings.warn(PallasInterpreterFallback(paragraph), stacklevel=1)

    def _kernel_ages(self) -> dict[str, float] | None:
        """The TPU-interpreted kernels' ages; None (time the whole test) once a GPU kernel
        ran, whose interpreter does not say when it started."""
        ages = tpu_interpreter.running_interpreted_kernel_ages()
        if not ages and self._gpu_interpreted():
            return None
        return ages

    @staticmethod
    def _checks_age() -> float | None:
        """How long the plugin's checks of the kernel being traced have run; None if none run."""
        since = pallas_call_hooks.observers_running_since()
        return None if since is None else time.monotonic() - since

    def _last_kernel_event(self) -> float | None:
        """When a kernel, or the plugin's checks of one, last started or ended."""
        events = (tpu_interpreter.last_interpreted_kernel_event(),
                  pallas_call_hooks.observers_last_ended())
        return max((event for event in events if event is not None), default=None)

    def _running_kernels_text(self) -> str:
        nodeid = self.item.nodeid
        kernels = tpu_interpreter.running_interpreted_kernels()  # short: 'body at kernels.py:12'
        if not kernels:
            # A GPU-interpreted kernel: the last one this test built is the one still running.
            gpu = self._gpu_interpreted()
            if gpu:
                return f"Mosaic GPU kernel '{gpu[-1]}' (in {nodeid})"
            if pallas_call_hooks.observers_running_since() is not None:
                return f"the plugin's checks of a kernel traced in {nodeid}"
            return f"a kernel in {nodeid}"
        names = ", ".join(f"'{kernel}'" for kernel in kernels)
        return f"kernel {names} (in {nodeid})"

    # --- a failure's report ---------------------------------------------------------------

    def failure_notes(self, error: BaseException | None) -> tuple[str | None, str]:
        """For a failed call's report: the notes on what the failure may come from (a NaN:
        ``diagnoses.uninitialized_read_note``, None when compiled or in the suite, which
        finds a NaN's cause itself; a read past a buffer; an output block the grid came back
        to; the float32 dots the chip rounds; a compiled artefact read) and the interpret
        parameters the kernels' own ``interpret=`` changed, one per line."""
        note = None
        if error is not None and self._unchecked_reads:
            # A NaN the failure shows is then most likely this read's poison.
            note = diagnoses.unchecked_read_note(self._unchecked_reads)
        elif error is not None and not (self.backend.is_compiled or self.conformance):
            note = diagnoses.uninitialized_read_note(error, self._interpreted_kernel_names())
        # The float32 dots the chip rounds (numerics.rounding_note), when the test failed.
        rounding = (rounding_note(self._rounded_dots, self.backend.chip,
                                  self.backend.float32_dot_rounding or "bfloat16")
                    if self._rounded_dots else None)
        artefacts = (diagnoses.compiled_artefact_note(self._artefacts_read)
                     if error is not None and self._artefacts_read and not self._chip_artefacts
                     and self._traced_kernel_names() else None)
        revisits = self._revisits_note() if error is not None else None
        note = "\n".join(filter(None, (note, revisits, rounding, artefacts))) or None
        return note, "\n".join(self.backend.own_params_changed)

    def _revisits_note(self) -> str | None:
        """The output blocks the grid came back to, which a failure may come from: the ones
        the static checks found (with the grid's order and its fix), else the ones the TPU
        interpreter met (index maps that read memory)."""
        suspects = [suspect for report in self._reports for suspect in report.suspects]
        if suspects:
            return diagnoses.revisit_suspects_note(suspects)
        return diagnoses.revisited_blocks_note(self._revisits) if self._revisits else None


def _list_or_empty(recorded: list | None) -> list:
    # The recorder's own list (empty now, filled as kernels run), or a fresh
    # one when the feature is off: `recorded or []` would drop the former.
    return recorded if recorded is not None else []
