"""The rules only a run can check: what the TPU interpreter saw when a kernel exited
(races, unbalanced semaphores, DMAs never waited) and its errors (out-of-bounds
reads, uninitialized reads), as ``Violation``s that name the fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .static_rules import REVISIT
from .violations import (
    DATA_RACE,
    DMA_NOT_WAITED,
    DMA_OUT_OF_BOUNDS,
    SEMAPHORES,
    TpuRuleViolation,
    Violation,
)

if TYPE_CHECKING:
    from pytest_pallas._compat.tpu_interpreter import KernelExitState


def kernel_exit_violations(states: Iterable[KernelExitState]) -> list[Violation]:
    """Violations for kernels that exited with races, unbalanced semaphores or DMAs never waited."""
    found = []
    for state in states:
        kernel = f"'{state.kernel}'"
        where = f"on device {state.device}"
        if state.race_found:
            found.append(
                Violation(
                    DATA_RACE,
                    kernel,
                    None,
                    f"the TPU interpreter's race detector found two unordered accesses to the same "
                    f'buffer {where}, at least one a write (details under "RACE DETECTED" in the '
                    "captured stdout): a read of a DMA's destination before its .wait(), a "
                    "write to a DMA's source before it completes, or two cores writing one output "
                    "block.",
                    "wait on the DMA's semaphore before touching its source or destination, and "
                    'keep reductions on "arbitrary" grid axes.',
                )
            )
        if state.pending_dmas:
            sem, core, count = state.pending_dmas[0]
            found.append(
                Violation(
                    DMA_NOT_WAITED,
                    kernel,
                    None,
                    f"{count} DMA(s) signalling semaphore {sem} (core {core}, {where}) were "
                    "started and never waited for before the kernel ended; on the TPU the copy "
                    "may still be in flight when the kernel's outputs are read, and the semaphore "
                    "is left unbalanced.",
                    "call .wait() on every pltpu.make_async_copy/make_async_remote_copy you "
                    ".start() (for remote copies, both the send and the receive semaphore).",
                )
            )
        if state.unbalanced_semaphores:
            sem, core, count = state.unbalanced_semaphores[0]
            found.append(
                Violation(
                    SEMAPHORES,
                    kernel,
                    None,
                    f"semaphore {sem} ends the kernel with count {count} (core {core}, {where}), "
                    "not 0; Mosaic checks semaphores at kernel exit and the TPU reports an error "
                    "(or the next kernel that reuses the semaphore misbehaves).",
                    "match every signal (pl.semaphore_signal, a DMA's completion) with a wait of "
                    "the same amount before the kernel returns.",
                )
            )
    return found


_REVISIT_ERROR = re.compile(
    r"Revisited block (?P<block>.+?) of output (?P<output>\d+) in iteration (?P<at>\(.*?\))\. "
    r"The block was previously visited in iterations (?P<first>\(.*?\)) through (?P<last>\(.*?\))"
)


# What the chip does where the interpreter stopped (_compat.out_of_bounds.CHIP_BOUNDS_CHECKS,
# read from libtpu's code): it halts a DMA or a BlockSpec's block copy that leaves its buffer,
# and does not check a store in the kernel's body.
_CHIP_HALTS = ("The chip halts the kernel there too: libtpu emits a bounds check before every "
               "DMA and BlockSpec block copy (docs/tpu-fidelity.md).")
_CHIP_STORES = ("The chip does not check a store in the kernel's body (libtpu emits no bounds "
                "check for it, docs/tpu-fidelity.md): it writes over whatever memory lies "
                "past the buffer.")


_OOB_READ = re.compile(
    r"reading \[\((?P<slices>.*)\)\] but buffer has shape \((?P<shape>[\d, ]*)\)")


_SLICE = re.compile(r"slice\((\d+), (\d+)(?:, \d+)?\)|(?<![\w(])(\d+)(?![\d)])")


def _beyond_padding_text(message: str) -> str:
    """What the chip does with an out-of-bounds copy the interpreter stopped: it halts it
    (``_CHIP_HALTS``), unless the read stays inside the array's (8, 128) tile padding.

    On the chip a 32-bit array's last two dimensions are stored in whole
    (8, 128) tiles, so a read past the logical end but inside the last tile reads
    padding (legal; the kernel must mask it). The plugin runs the TPU interpreter
    with tile-padded bounds, so what it stops is past the padding: outside the
    buffer on the chip too.
    """
    match = _OOB_READ.search(message)
    if match is None or "smem" in message.lower():  # SMEM is not tiled: no padding to read
        return _CHIP_HALTS
    shape = [int(d) for d in match["shape"].replace(" ", "").split(",") if d]
    ends = []
    for m in _SLICE.finditer(match["slices"]):
        ends.append(int(m.group(2)) if m.group(2) else int(m.group(3)) + 1)
    if len(ends) != len(shape) or len(shape) < 2:
        return _CHIP_HALTS
    tiles = [1] * (len(shape) - 2) + [8, 128]
    padded = [-(-d // t) * t for d, t in zip(shape, tiles)]
    if all(e <= p for e, p in zip(ends, padded)):
        return (f"The read stays inside the array's (8, 128) tile padding (padded shape "
                f"{tuple(padded)}), which the TPU allows: this interpreter ran with logical "
                "bounds (pltpu.InterpretParams(buffer_bounds='padded') models the chip), so "
                "this is not a bug on the chip as long as the kernel masks what it reads there.")
    return (f"The read goes past the array's tile padding too (padded shape {tuple(padded)}). "
            f"{_CHIP_HALTS}")


_OOB_ERROR = re.compile(
    r"(Out-of-bounds (read|write|swap|masked swap|block index)[^\n]*"
    r"|Range [^\n]* out of bounds[^\n]*)"
)


def translate_interpreter_error(
    error: BaseException, kernel: str | None = None
) -> TpuRuleViolation | None:
    """The rule behind an error the TPU interpreter raised, or None if it is not one of its checks.

        try:
            kernel(x)
        except Exception as error:
            violation = translate_interpreter_error(error, "my_kernel")
            if violation is not None:
                raise violation from error
            raise
    """
    text = str(error)
    title = f"'{kernel}'" if kernel else "(run by TPU interpret mode)"
    match = _REVISIT_ERROR.search(text)
    if match:
        return TpuRuleViolation(
            [
                Violation(
                    REVISIT,
                    title,
                    f"output {match['output']}",
                    f"block {match['block']} was visited again in grid iteration {match['at']} "
                    f"after the grid left it (earlier visits: iterations {match['first']} "
                    f"through {match['last']}); Pallas TPU writes a block back when the grid "
                    "moves on and never reads it back.",
                    "put the reduction axis last in the grid so each output block's visits are "
                    "consecutive, or pass pipeline_mode=pl.Buffered(1, "
                    "revisit=pl.RevisitMode.ANY).",
                )
            ]
        )
    match = _OOB_ERROR.search(text)
    if match:
        what = match.group(0).strip()
        if match.group(2) in ("swap", "masked swap"):  # a store in the kernel's body
            chip, fix = _CHIP_STORES, ("keep the store's pl.ds(start, size) within the buffer, "
                                       "or handle the ragged tail with a smaller final store.")
        else:
            chip = _beyond_padding_text(what)
            fix = ("clamp the copy's pl.ds(start, size) so start + size stays within the array, "
                   "or handle the ragged tail with a smaller final copy.")
        return TpuRuleViolation(
            [
                Violation(
                    DMA_OUT_OF_BOUNDS,
                    title,
                    None,
                    f"the TPU interpreter stopped an out-of-bounds access: {what} {chip}",
                    fix,
                )
            ]
        )
    return None
