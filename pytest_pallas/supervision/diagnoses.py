"""What a Pallas test's failure means, in words: the messages ``KernelRun`` raises or skips
with (a race, a limit of JAX's GPU interpreter, a crash inside JAX's interpreter, a NaN read
from memory nothing wrote). Pure functions of what the run saw; no state.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .._compat import gpu_interpreter, jax_internals
from ..checks.runtime_rules import translate_interpreter_error
from ..checks.violations import TpuRuleViolation
from ..compare import describe_uninitialized_read

TPU_RACE_MESSAGE = (
    "pallas: the TPU interpreter detected a data race in a kernel this test ran "
    "(two accesses to the same buffer not ordered by a DMA wait, semaphore or "
    "barrier); wait on the DMA before reading its buffer, or make the racing grid "
    "axis 'arbitrary'. The interpreter's log above names the buffers."
)

_INTERPRETER_WHERE = {"gpu": "JAX's GPU interpreter", "plain": "JAX's plain interpreter"}
_GPU_KIND = {"mosaic_gpu": "Mosaic GPU", "triton": "Triton"}
_NAN = re.compile(r"\bnan\b", re.IGNORECASE)


def gpu_race_message(names: Sequence[str]) -> str:
    """The failure for a race JAX's GPU interpreter found in the kernels ``names``."""
    which = (f"kernel {', '.join(repr(n) for n in names)}" if names
             else "a Mosaic GPU kernel this test ran")
    return (
        f"pallas: JAX's GPU interpreter detected a data race in {which} (two accesses to "
        "the same SMEM or GMEM buffer, from two threads or a thread and a TMA copy, not "
        "ordered by a barrier or a wait); arrive and wait on a plgpu.Barrier between them, "
        "or wait for the copy (plgpu.barrier_wait, plgpu.wait_smem_to_gmem). The "
        "interpreter's RACE DETECTED log above names the accesses."
    )


def gpu_interpreter_limit(error: BaseException, kernels: Sequence) -> str | None:
    """The skip reason when a GPU kernel (``kernels``: the ``RoutedKernel``s the test ran)
    crashed inside JAX's interpreter, a limit of JAX's; else None."""
    host = gpu_interpreter.gpu_module_assertion(error)
    if host is not None:
        return (f"pallas: {host}; on the CPU its kernels cannot be built. A limit of "
                "JAX's, not a bug of the kernel; run it with --pallas-gpu on a GPU.")
    if not kernels:
        return None
    crash = jax_internals.interpreter_crash(error)
    if crash is None:
        return None
    kernel = kernels[-1]
    note = f" ({kernel.note})" if kernel.note else ""
    return (f"pallas: {_GPU_KIND[kernel.target]} kernel {kernel.name!r} cannot run in "
            f"{_INTERPRETER_WHERE[kernel.interpreter]}{note}: {crash}. A limit of JAX's "
            "interpreters, not a bug of the kernel; run it with --pallas-gpu on a GPU.")


def compiled_artefact_note(read: Sequence[str]) -> str:
    """For a failed test that read what JAX compiled (``_compat.compiled_artefacts``)."""
    return (f"pallas: this test read the compiled program ({', '.join(sorted(set(read)))}); "
            "on the CPU its Pallas kernels are compiled as JAX's interpreter, not as the "
            "chip's Mosaic kernel, so what it asserts of that text or cost does not hold here.")


def host_memory_limit(kernel: str, error: BaseException) -> str:
    """The skip reason when a test whose kernel keeps an operand in host memory failed."""
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return (f"pallas: kernel {kernel} keeps an operand in host memory (pl.HOST), which JAX's "
            "interpreters do not run on the CPU (JAX's own interpret tests skip it), and the "
            f"test failed ({type(error).__name__}: {first}): a limit of JAX's, so its "
            "run-time behaviour is not checked on the CPU.")


def kernel_on_some_devices(stopped: Any, seconds: float) -> str:
    """The skip reason when a kernel that talks to no other device waited at JAX's TPU
    interpreter's start barrier for devices of its mesh that never ran it
    (an ``interpreter_barriers.StoppedShort``), until --pallas-timeout broke the wait."""
    return (f"pallas: kernel '{stopped.kernel}' was run by {stopped.arrived} of the "
            f"{stopped.devices} devices of its mesh (the others skipped it: a lax.cond on "
            "lax.axis_index, a loop whose trip count differs by device), and JAX's TPU "
            "interpreter waits at its start for every device of the mesh, until "
            f"--pallas-timeout={seconds:g}s stopped it: a limit of JAX's interpreter, not a bug "
            "of the kernel (it talks to no other device, so the chip runs it on any of them).")


def pinned_buffer_limit(kernels: Sequence[str]) -> str:
    """The skip reason when a kernel of the test takes a pinned buffer (``pin``)."""
    which = f"kernel {kernels[-1]}" if kernels else "a kernel of this test"
    return (f"pallas: {which} takes a pinned buffer (jax._src.state.primitives.pin), which "
            "neither of JAX's interpreters runs on the CPU (JAX's callbacks have no shape for "
            "one, nor does the CPU have the Pin custom call): a limit of JAX's, not a bug of "
            "the kernel, so its run-time behaviour is not checked on the CPU.")


def host_memory_shortage(shortage: Any) -> str:
    """The skip reason when an interpreter's copies of a kernel's operands and results would
    not fit in the host's available memory (an ``interpreter_memory.HostMemoryShortage``)."""
    return (f"pallas: interpreting this test's kernel needs about {shortage.needed / 2**30:.1f} "
            "GiB of host memory (JAX's interpreter copies its operands and results into its "
            f"simulated memory), and this host has {shortage.available / 2**30:.1f} GiB "
            "available: a limit of running the kernel on the CPU, not a bug of the kernel; "
            "run the test on a host with more memory, or with fewer pytest-xdist workers.")


def fallback_paragraph(interpreter: str, crash: str, which: str, *, crashed: bool = True) -> str:
    """Why the test ran again in the other interpreter after ``interpreter`` ("tpu" or
    "plain") crashed inside JAX with ``crash`` while running ``which`` (or, not
    ``crashed``, ran it otherwise than the chip does: ``crash`` says how)."""
    if interpreter == "tpu":
        failed, other = "TPU interpreter", "plain interpreter (interpret=True)"
        lost = ("which checks its values but not its DMAs, semaphores, races or "
                "NaN-poisoned memory")
    else:
        failed, other = "plain interpreter", "TPU interpreter"
        lost = "which checks everything the plain one does"
    what = (f"crashed inside JAX while running {which}" if crashed
            else f"cannot run {which} as the chip does")
    return (
        f"pallas: JAX's {failed} {what} ({crash}). "
        f"That is a limitation of JAX's {failed}, not a bug of the kernel (the TPU "
        f"compiler may well accept it). The test was run again in the {other}, {lost}; "
        "the static TPU rules ran as usual."
    )


def cannot_interpret(paragraph: str, second: BaseException) -> str | None:
    """The skip reason when the fallback interpreter crashed inside JAX too, else None."""
    crash = jax_internals.interpreter_crash(second)
    if crash is None:
        return None
    return (paragraph.replace("The test was run again", "It was tried again")
            + f" That run crashed inside JAX too ({crash}): neither of JAX's interpreters "
            "can run this kernel, so its run-time behaviour is not checked on the CPU.")


def uninitialized_read_note(error: BaseException, kernels: Sequence[str]) -> str | None:
    """For a failure whose messages show a NaN: the likely rule, naming ``kernels``.

    ``assert_allclose`` says it itself; this covers ``np.testing`` and plain asserts.
    Only the messages of the error and its causes are read: the traceback quotes the
    test's source, whose comments may well say "NaN".
    """
    failure = "\n".join(_messages(error))
    if "[uninitialized-read]" in failure or not _NAN.search(failure):
        return None
    return describe_uninitialized_read(None, kernels)


def unchecked_read_note(reads: Sequence[Any]) -> str:
    """For a failed test whose kernels read past a buffer where the chip has no bounds check
    (``_compat.out_of_bounds.UncheckedRead``s): which reads, and what they read."""
    return (f"pallas: this test's kernels read past a buffer where the chip has no bounds "
            f"check: {_first_three(reads)}. The chip reads whatever memory lies there "
            "(libtpu emits no check for a load from SMEM or VMEM, docs/tpu-fidelity.md); the "
            "interpreter read poison instead (NaN, or the integer fill), so a result that used "
            "the read is wrong, and this failure may be that. Keep the index within the "
            "buffer, or discard what is read past it (jnp.where).")


def revisited_blocks_note(revisits: Sequence[Any]) -> str:
    """For a failed test whose kernels came back to an output block after the grid left it
    (``_compat.output_revisits.RevisitedBlock``s): which blocks, and what the chip does."""
    return (f"pallas: this test's kernels came back to an output block after the grid left "
            f"it: {_first_three(revisits)}. The chip wrote the block back when the grid left "
            "and does not read it back: the revisit starts from whatever its buffer holds (JAX's "
            "pl.RevisitMode), and the last write-back is the block's value. The interpreter "
            "held poison there (NaN, or the integer fill), so a result that read the block or "
            "left part of it unwritten is wrong, and this failure may be that. Put the "
            "reduction axis last in the grid so each block's visits are consecutive, write the "
            "whole block on its last visit, or pass pipeline_mode=pl.Buffered(1, "
            "revisit=pl.RevisitMode.ANY).")


def revisit_suspects_note(suspects: Sequence[Any]) -> str:
    """For a failed test whose kernels come back to an output block they write before reading
    (``checks.violations.Violation``s the static checks left to the values): each, and why
    the values decide."""
    first = suspects[0]
    others = {suspect.kernel for suspect in suspects} - {first.kernel}
    more = f" ({len(others)} more kernel(s) likewise)" if others else ""
    return (f"pallas: this failure may be [{first.rule}] in kernel {first.kernel}{more}: "
            f"{first.operand}: {first.problem} The kernel writes the block before reading it, "
            "which is right on the chip only if what it writes on the last visit is that "
            "block's (a scratch accumulator carried over from other blocks is not). "
            f"Fix: {first.fix}")


def _first_three(events: Sequence[Any]) -> str:
    """The first three events described, and how many more there were."""
    shown = "; ".join(event.describe() for event in events[:3])
    return shown + (f" (and {len(events) - 3} more)" if len(events) > 3 else "")


def _messages(error: BaseException) -> list[str]:
    """The messages of ``error``, its causes and contexts, and a group's members."""
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
    return messages


def raise_as_tpu_rule(error: BaseException) -> None:
    """Re-raise an interpreter error that is a TPU rule (revisited block, ...) as one."""
    __tracebackhide__ = True
    if isinstance(error, TpuRuleViolation):
        return
    violation = translate_interpreter_error(error)
    if violation is not None:
        raise violation from error
