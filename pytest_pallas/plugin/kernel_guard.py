"""The guard around each Pallas test: its backend and checks entered before it runs, and its
kernels' verdicts read when it ends.

``PallasSession`` holds the run's state; a ``KernelGuard`` (``session.guard``) does, per
test: enter the backend and the per-kernel checks (``activate``), watch its call for a
hung kernel (``watchdog``), read what its exception means (``after_failure``: a TPU rule,
a race, a GPU interpreter's limit, JAX's interpreter crashing), turn what the kernels
left behind into a failure (a race, a semaphore off 0, a DMA pending: ``kernel_exit_failure``),
decide when an interpreter's own crash means another interpreter or a skip
(``interpreter_fallback``, ``gpu_interpreter_limit``), and explain a NaN read from memory
nothing wrote (``uninitialized_read_note``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from .._compat.pytest_internals import skip_at_test
from ..suite.membership import conformance_op_name, is_conformance_item

if TYPE_CHECKING:
    from ..backend import Backend

# A feature built on private JAX internals, by the name a run reports when it is off.
KERNEL_EXIT_CHECKS = "the kernel-exit checks (semaphores, DMAs, races)"
TPU_COMPILER_CHECK = "the TPU compiler check"
GPU_RACE_CHECK = "the GPU interpreter's race report"
ROUNDED_DOTS_NOTE = "the failure's note on float32 dots the chip rounds"

_ACTIVE = pytest.StashKey[contextlib.ExitStack]()
_BACKEND = pytest.StashKey["Backend"]()
_KERNEL_EXITS = pytest.StashKey[list]()
_KERNEL_REPORTS = pytest.StashKey[list]()  # the static checks' report of each pallas_call traced
_GPU_KERNELS = pytest.StashKey[list]()  # the GPU kernels the test ran on the CPU, and where
_GPU_RACES = pytest.StashKey[list]()  # True per GPU-interpreted kernel that ended with a race
_ROUNDED_DOTS = pytest.StashKey[list]()  # kernels with a float32 dot the chip rounds


class KernelGuard:
    """Per test: the backend and checks around its kernels, and their verdicts after."""

    def __init__(self, session: Any) -> None:
        # The run's PallasSession (plugin.session makes the guard: not imported back here).
        self.session = session

    def activate(self, item: pytest.Item) -> None:
        """Enter the test's backend and the TPU-fidelity checks (see ``checks.static_rules``)."""
        from .._compat import gpu_interpreter, jax_internals, tpu_interpreter
        from ..checks.kernel_check import STATIC_CHECKS, checking_pallas_calls
        from ..checks.mismatch import TracedOutput, traced_output_blocks
        from ..compare import (
            GpuKernelName,
            backend_matmul_precision,
            interpreted_kernels,
            traced_kernels,
        )

        backend = self.session.backend_for(item)
        stack = contextlib.ExitStack()
        optional = jax_internals.optional_feature
        if not backend.is_tpu:
            # A kernel that raised while interpreted leaves the TPU interpreter's
            # shared memory behind; start every test from a clean interpreter.
            tpu_interpreter.reset_interpreter_state()
            # The interpreter keeps the race flag of its last kernel only, and
            # only prints unbalanced semaphores: record every kernel's exit.
            item.stash[_KERNEL_EXITS] = _list_or_empty(stack.enter_context(optional(
                KERNEL_EXIT_CHECKS, tpu_interpreter.record_kernel_exits)))
            # The same for JAX's GPU interpreter, which runs Mosaic GPU kernels.
            gpu_interpreter.reset_gpu_interpreter_state()
            item.stash[_GPU_RACES] = _list_or_empty(stack.enter_context(optional(
                GPU_RACE_CHECK, gpu_interpreter.gpu_races_recorded)))
        gpu_kernels = item.stash[_GPU_KERNELS] = []
        # Tiling, VMEM footprint, parallel-axis races and revisits, checked as
        # each pallas_call is traced (on a TPU too: the chip does not complain).
        reports = item.stash[_KERNEL_REPORTS] = [] if backend.is_gpu else _list_or_empty(
            stack.enter_context(optional(
                STATIC_CHECKS, lambda: checking_pallas_calls(chip=backend.chip))))
        if not backend.is_tpu and self.session.options.compile_chips:
            # Then the TPU compiler's verdict on each kernel, for each chip asked for.
            from ..checks.compile_check import compiling_pallas_calls

            stack.enter_context(optional(TPU_COMPILER_CHECK, lambda: compiling_pallas_calls(
                self.session.options.compile_chips, on_verdict=self._compile_recorder(item))))
        if not backend.is_tpu:
            # A NaN where the reference is finite then names the rule and these kernels.
            stack.enter_context(interpreted_kernels(lambda: [r.kernel for r in reports] + [
                GpuKernelName(k.name) for k in gpu_kernels if k.interpreter == "gpu"]))
        # A bare comparison's failure then names the error model of a traced paged or
        # ragged attention kernel.
        stack.enter_context(traced_kernels(lambda: [r.kernel for r in reports]))
        # A value failure then locates its mismatches in the traced kernels' output blocks.
        stack.enter_context(traced_output_blocks(lambda: [
            TracedOutput(report.kernel, array_shape, block_shape)
            for report in reports for array_shape, block_shape in report.output_blocks]))
        if backend.float32_dot_rounding is not None:
            # A failure then says which kernels had a dot the chip rounds.
            from ..numerics import kernels_with_rounded_dots

            item.stash[_ROUNDED_DOTS] = _list_or_empty(stack.enter_context(optional(
                ROUNDED_DOTS_NOTE, kernels_with_rounded_dots)))
        # assert_allclose in the test then allows for the backend's matmul rounding.
        stack.enter_context(backend_matmul_precision(backend.matmul_precision))
        stack.enter_context(backend.activate(on_gpu_kernel=gpu_kernels.append))
        item.stash[_ACTIVE] = stack
        item.stash[_BACKEND] = backend

    def _compile_recorder(self, item: pytest.Item):
        """For a conformance test: records in the report whether its op's kernels compiled."""
        op_name = conformance_op_name(item) if is_conformance_item(item) else None
        if op_name is None:
            return None
        recorder = self.session.recorder
        return lambda verdict: recorder.compiled(op_name, verdict)

    def deactivate(self, item: pytest.Item) -> None:
        stack = item.stash.get(_ACTIVE, None)
        if stack is not None:
            from .._compat import jax_internals

            del item.stash[_ACTIVE]
            try:
                stack.close()
            except jax_internals.JaxInternalsChanged as error:  # met at a kernel's exit
                jax_internals.feature_off(KERNEL_EXIT_CHECKS, error)

    def item_backend(self, item: pytest.Item) -> Backend:
        return item.stash.get(_BACKEND, None) or self.session.backend_for(item)

    def check_kernel_exits(self, item: pytest.Item) -> None:
        """Fail the test if a kernel it ran ended with a race, a semaphore off 0 or a DMA
        pending."""
        __tracebackhide__ = True
        failure = self.kernel_exit_failure(item)
        if failure is not None:
            raise failure

    def kernel_exit_failure(self, item: pytest.Item) -> AssertionError | None:
        """The failure for what the test's kernels left at their exit (a race, ...), if any.

        Also asked when the test failed otherwise: a race is the cause of the wrong
        values it produced, and the failure should say so first.
        """
        from .._compat import tpu_interpreter
        from ..checks.runtime_rules import kernel_exit_violations
        from ..checks.violations import TpuRuleViolation

        gpu_race = self.gpu_race_failure(item)
        if gpu_race is not None:
            return gpu_race
        exits = list(item.stash.get(_KERNEL_EXITS, ()))
        if self.session.options.detect_races and tpu_interpreter.races_found() and not any(
                state.race_found for state in exits):
            tpu_interpreter.reset_interpreter_state()
            return AssertionError(
                "pallas: the TPU interpreter detected a data race in a kernel this test ran "
                "(two accesses to the same buffer not ordered by a DMA wait, semaphore or "
                "barrier); wait on the DMA before reading its buffer, or make the racing grid "
                "axis 'arbitrary'. The interpreter's log above names the buffers."
            )
        if not self.session.options.detect_races:
            # A race found without --pallas-detect-races was asked for by the kernel's own
            # InterpretParams(detect_races=True): the test judges it (JAX's own race tests
            # assert that the detector fires), not the plugin.
            exits = [dataclasses.replace(state, race_found=False) for state in exits]
        violations = kernel_exit_violations(exits)
        if violations:
            tpu_interpreter.reset_interpreter_state()
            return TpuRuleViolation(violations)
        return None

    def gpu_kernels_run(self, item: pytest.Item) -> list:
        """The GPU kernels the test ran on the CPU (``_compat.gpu_interpreter.RoutedKernel``),
        each once."""
        kernels = []
        for kernel in item.stash.get(_GPU_KERNELS, ()):
            if kernel not in kernels:
                kernels.append(kernel)
        return kernels

    def gpu_race_failure(self, item: pytest.Item) -> AssertionError | None:
        """Under ``--pallas-detect-races``: the failure for a race that JAX's GPU interpreter
        found in a Mosaic GPU kernel of the test, else None."""
        from .._compat import gpu_interpreter

        if not self.session.options.detect_races:
            return None
        races = item.stash.get(_GPU_RACES, [])
        if not (races or gpu_interpreter.races_pending()):
            return None
        names = sorted({k.name for k in self.gpu_kernels_run(item) if k.interpreter == "gpu"})
        which = (f"kernel {', '.join(repr(n) for n in names)}" if names
                 else "a Mosaic GPU kernel this test ran")
        races.clear()
        gpu_interpreter.reset_gpu_interpreter_state()
        return AssertionError(
            f"pallas: JAX's GPU interpreter detected a data race in {which} (two accesses to "
            "the same SMEM or GMEM buffer, from two threads or a thread and a TMA copy, not "
            "ordered by a barrier or a wait); arrive and wait on a plgpu.Barrier between them, "
            "or wait for the copy (plgpu.barrier_wait, plgpu.wait_smem_to_gmem). The "
            "interpreter's RACE DETECTED log above names the accesses."
        )

    def gpu_interpreter_limit(self, item: pytest.Item, error: BaseException) -> str | None:
        """The skip reason when a GPU kernel of the test crashed inside JAX's interpreter (a
        limit of JAX's, never the TPU interpreter's business), else None."""
        from .._compat import gpu_interpreter, jax_internals

        if self.item_backend(item).is_compiled:
            return None
        host = gpu_interpreter.gpu_module_assertion(error)
        if host is not None:
            return (f"pallas: {host}; on the CPU its kernels cannot be built. A limit of "
                    "JAX's, not a bug of the kernel; run it with --pallas-gpu on a GPU.")
        kernels = self.gpu_kernels_run(item)
        if not kernels:
            return None
        crash = jax_internals.interpreter_crash(error)
        if crash is None:
            return None
        where = {"gpu": "JAX's GPU interpreter", "plain": "JAX's plain interpreter"}
        kernel = kernels[-1]
        note = f" ({kernel.note})" if kernel.note else ""
        kind = {"mosaic_gpu": "Mosaic GPU", "triton": "Triton"}[kernel.target]
        return (f"pallas: {kind} kernel {kernel.name!r} cannot run in "
                f"{where[kernel.interpreter]}{note}: {crash}. A limit of JAX's interpreters, "
                "not a bug of the kernel; run it with --pallas-gpu on a GPU.")

    def interpreter_fallback(self, item: pytest.Item, error: BaseException):
        """After JAX's interpreter crashed inside JAX: ``(interpret params, paragraph)`` to run
        the test again with, or None (a TPU run, a conformance test, not such a crash).

        The TPU interpreter falls back to the plain one (values, not DMAs, semaphores,
        races or poisoned memory), the plain one to the TPU one.
        """
        from .._compat import jax_internals
        from ..backend import make_interpret_params

        backend = self.item_backend(item)
        if backend.is_tpu or is_conformance_item(item):
            return None
        crash = jax_internals.interpreter_crash(error)
        if crash is None:
            return None
        kernels = [report.kernel for report in item.stash.get(_KERNEL_REPORTS, ())]
        which = f"kernel {kernels[-1]}" if kernels else "a kernel of this test"
        if backend.interpreter == "tpu":
            failed, other, params = "TPU interpreter", "plain interpreter (interpret=True)", True
            lost = ("which checks its values but not its DMAs, semaphores, races or "
                    "NaN-poisoned memory")
        else:
            failed, other = "plain interpreter", "TPU interpreter"
            params = make_interpret_params(
                dataclasses.replace(self.session.options, interpreter="tpu"), backend.tpu_info)
            lost = "which checks everything the plain one does"
        paragraph = (
            f"pallas: JAX's {failed} crashed inside JAX while running {which} ({crash}). "
            f"That is a limitation of JAX's {failed}, not a bug of the kernel (the TPU "
            f"compiler may well accept it). The test was run again in the {other}, {lost}; "
            "the static TPU rules ran as usual."
        )
        return params, paragraph

    def cannot_interpret(self, paragraph: str, second: BaseException) -> str | None:
        """The skip reason when the fallback interpreter crashed inside JAX too, else None."""
        from .._compat import jax_internals

        crash = jax_internals.interpreter_crash(second)
        if crash is None:
            return None
        return (paragraph.replace("The test was run again", "It was tried again")
                + f" That run crashed inside JAX too ({crash}): neither of JAX's interpreters "
                "can run this kernel, so its run-time behaviour is not checked on the CPU.")

    def uninitialized_read_note(self, item: pytest.Item, error: BaseException) -> str | None:
        """For a failure that shows a NaN in interpret mode (any comparator): the likely rule.

        ``assert_allclose`` says it itself; this covers ``np.testing`` and plain asserts.
        Only the messages of the error and its causes are read: the traceback quotes the
        test's source, whose comments may well say "NaN".
        """
        import re

        from ..compare import GpuKernelName, describe_uninitialized_read

        if self.item_backend(item).is_compiled or is_conformance_item(item):
            return None  # the suite finds the cause of a NaN itself (its "cause:" line)
        messages = []
        pending, seen = [error], set()
        while pending:
            error = pending.pop()
            if error is None or id(error) in seen:
                continue
            seen.add(id(error))
            messages.append(str(error))
            pending += [error.__cause__ or error.__context__]
            if isinstance(error, BaseExceptionGroup):  # Hypothesis's distinct failures
                pending += error.exceptions
        failure = "\n".join(messages)
        if "[uninitialized-read]" in failure:
            return None
        if not re.search(r"\bnan\b", failure, re.IGNORECASE):
            return None
        kernels = [report.kernel for report in item.stash.get(_KERNEL_REPORTS, ())] + [
            GpuKernelName(k.name) for k in self.gpu_kernels_run(item) if k.interpreter == "gpu"]
        return describe_uninitialized_read(None, kernels)

    def rounding_note(self, item: pytest.Item) -> str | None:
        """For a failed test whose kernels had a float32 dot the chip rounds: the line that
        says so (``numerics.rounding_note``), else None."""
        from ..numerics import rounding_note

        kernels = item.stash.get(_ROUNDED_DOTS, None)
        return rounding_note(kernels, self.item_backend(item).chip) if kernels else None

    # --- the call: a watchdog around it, and what its exception means -------------------

    def watchdog(self, item: pytest.Item):
        """The ``--pallas-timeout`` watchdog for ``item``'s call (none when compiled)."""
        from .timeout import Watchdog

        compiled = self.item_backend(item).is_compiled
        seconds = 0.0 if compiled else self.session.options.timeout_seconds
        return Watchdog(seconds, lambda: self._running_kernels_text(item),
                        kernel_ages=lambda: self._kernel_ages(item))

    def after_success(self, item: pytest.Item, watchdog: Any) -> None:
        """A test that returned still fails on a hang the watchdog broke or what its kernels
        left behind (a race, a semaphore off 0, a DMA pending)."""
        __tracebackhide__ = True
        from .timeout import KernelTimeout

        if watchdog.fired:
            raise KernelTimeout(watchdog.message)
        self.check_kernel_exits(item)

    def after_failure(self, item: pytest.Item, error: BaseException, watchdog: Any) -> None:
        """What the test's ``error`` means: a hang, a TPU rule, the race behind wrong values,
        a limit of JAX's GPU interpreter (a skip), or a crash inside JAX's interpreter (the
        test again in the other one); else ``error`` itself. Raises, or returns after the
        rerun passed."""
        __tracebackhide__ = True
        from .timeout import KernelTimeout

        if watchdog.fired and not isinstance(error, KernelTimeout):
            raise KernelTimeout(watchdog.message) from error
        if not isinstance(error, Exception):
            raise error
        _raise_as_tpu_rule(error)
        exit_failure = self.kernel_exit_failure(item)
        if exit_failure is not None:
            raise exit_failure from error  # the race behind the wrong values, say
        gpu_limit = self.gpu_interpreter_limit(item, error)
        if gpu_limit is not None:
            skip_at_test(gpu_limit)  # a GPU kernel never falls back to the TPU interpreter
        fallback = self.interpreter_fallback(item, error)
        if fallback is None:
            raise error
        self._run_in_other_interpreter(item, *fallback)

    def _run_in_other_interpreter(self, item: pytest.Item, params: Any, paragraph: str) -> None:
        """Run the test again with ``params`` after JAX's interpreter crashed inside JAX."""
        __tracebackhide__ = True
        import warnings

        from jax.experimental.pallas import tpu as pltpu

        from .._compat.tpu_interpreter import reset_interpreter_state

        reset_interpreter_state()
        try:
            with pltpu.force_tpu_interpret_mode(params):
                item.runtest()
        except Exception as second:
            reason = self.cannot_interpret(paragraph, second)
            if reason is not None:
                skip_at_test(reason)
            second.add_note(paragraph)
            raise
        warnings.warn(PallasInterpreterFallback(paragraph), stacklevel=1)

    def _kernel_ages(self, item: pytest.Item) -> dict[str, float] | None:
        """The TPU-interpreted kernels' ages; None (time the whole test) once a GPU kernel
        ran, whose interpreter does not say when it started."""
        from .._compat.tpu_interpreter import running_interpreted_kernel_ages

        ages = running_interpreted_kernel_ages()
        if not ages and any(k.interpreter == "gpu" for k in self.gpu_kernels_run(item)):
            return None
        return ages

    def _running_kernels_text(self, item: pytest.Item) -> str:
        from .._compat.tpu_interpreter import running_interpreted_kernels

        kernels = running_interpreted_kernels()  # already short ('body at kernels.py:12')
        if not kernels:
            # A GPU-interpreted kernel: the last one this test built is the one still running.
            gpu = [k.name for k in self.gpu_kernels_run(item) if k.interpreter == "gpu"]
            if gpu:
                return f"Mosaic GPU kernel '{gpu[-1]}' (in {item.nodeid})"
            return f"a kernel in {item.nodeid}"
        names = ", ".join(f"'{kernel}'" for kernel in kernels)
        return f"kernel {names} (in {item.nodeid})"


class PallasInterpreterFallback(UserWarning):
    """A test ran in the other interpreter because JAX's first choice crashed inside JAX."""


def _raise_as_tpu_rule(error: BaseException) -> None:
    """Re-raise an interpreter error that is a TPU rule (revisited block, ...) as one."""
    __tracebackhide__ = True
    from ..checks.runtime_rules import translate_interpreter_error
    from ..checks.violations import TpuRuleViolation

    if isinstance(error, TpuRuleViolation):
        return
    violation = translate_interpreter_error(error)
    if violation is not None:
        raise violation from error


def _list_or_empty(recorded: list | None) -> list:
    # The recorder's own list (empty now, filled as kernels run), or a fresh
    # one when the feature is off: `recorded or []` would drop the former.
    return recorded if recorded is not None else []
