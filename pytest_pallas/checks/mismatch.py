"""Where and how an output is wrong: the mismatch pattern behind a value failure.

A count of mismatched elements and the worst one rarely point at the bug;
the *shape* of the errors often does. Errors that fill exactly one output
block point at an index map; errors only in the ragged last block at the
masking of a partial edge block; a constant factor at a scale applied twice;
a transposition at swapped axes; a result short by exactly one block's
contribution at a reduction grid that skips its first or last step.

:func:`diagnose` returns one line per pattern that holds for *every*
mismatched element (never a guess from a majority). It reads only NumPy
arrays, so the comparator and the conformance suite both call it. The
blocks it speaks of are the kernel's output blocks when known (an explicit
``block_shape``, or the output BlockSpec of a ``pallas_call`` the test
traced, see :func:`traced_output_blocks`), else TPU tiles of (8, 128).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

# The TPU's (sublane, lane) tile: the blocks to speak of when the kernel's are unknown.
TILE = (8, 128)
_MAX_BLOCKS_LISTED = 4
_MAX_BLOCKS_SEARCHED = 256  # for "block b holds block s's values": pairs grow quadratically
_QUICK_LOOK = 65536  # elements of the leading rows a pattern is tried on before the whole
# The candidate patterns are judged with the comparator's tolerance, doubled: the kernel
# that has the bug also has its ordinary rounding on top.
_SLACK = 2.0


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The block shape an output is split into, and where that shape came from."""

    shape: tuple[int, ...]  # same rank as the array
    source: str  # "block_shape=(8, 128)", "the output BlockSpec of kernel 'mm' (k.py:3)", ...
    noun: str = "output block"  # what one block is called in a finding: "tile" for tiles


@dataclasses.dataclass(frozen=True)
class TracedOutput:
    """One output of a traced pallas_call: its array shape and block shape."""

    kernel: str
    array_shape: tuple[int, ...]
    block_shape: tuple[int, ...]


# While a Pallas test runs: the outputs of the pallas_calls it has traced, so that a value
# failure speaks of the kernel's own output blocks without the test naming them.
_TRACED_OUTPUTS: contextvars.ContextVar[Callable[[], Sequence[TracedOutput]] | None] = (
    contextvars.ContextVar("pallas_traced_outputs", default=None))


@contextlib.contextmanager
def traced_output_blocks(outputs: Callable[[], Sequence[TracedOutput]] | None) -> Iterator[None]:
    """Within the block, a mismatch is located in the blocks of these kernel outputs.

    ``outputs`` returns the outputs of the kernels traced so far (the plugin passes
    those of the running test); the most recent one of the compared array's shape wins.
    """
    token = _TRACED_OUTPUTS.set(outputs)
    try:
        yield
    finally:
        _TRACED_OUTPUTS.reset(token)


def blocks_for(shape: tuple[int, ...], block_shape: Sequence[int | None] | None = None) -> Blocks:
    """The blocks to locate errors in for an array of ``shape``.

    ``block_shape`` (a ``pl.BlockSpec``'s; ``None`` entries count 1, fewer entries than
    the array's rank apply to its last dimensions) wins; else the output block of the
    most recent traced kernel whose output has this shape and more than one block; else
    (8, 128) tiles.
    """
    rank = len(shape)
    if block_shape is not None:
        given = tuple(1 if size is None else int(size) for size in block_shape)
        if len(given) <= rank and all(size >= 1 for size in given):
            padded = (1,) * (rank - len(given)) + given
            return Blocks(padded, f"from block_shape={tuple(block_shape)}")
    provider = _TRACED_OUTPUTS.get()
    for output in reversed(list(provider() if provider is not None else ())):
        if output.array_shape == tuple(shape) and _block_count(shape, output.block_shape) > 1:
            return Blocks(output.block_shape,
                          f"from the output BlockSpec of kernel {output.kernel}")
    tile = TILE[-rank:] if rank <= 2 else (1,) * (rank - 2) + TILE
    return Blocks(tuple(tile), "the kernel's output block shape is unknown: "
                               "assert_allclose(..., block_shape=) names it", noun="tile")


def _block_count(shape: Sequence[int], block: Sequence[int]) -> int:
    return math.prod(-(-size // b) for size, b in zip(shape, block))


def diagnose(
    actual: np.ndarray,
    expected: np.ndarray,
    mismatched: np.ndarray,
    *,
    rtol: float,
    atol: float,
    blocks: Blocks,
    without_step: Mapping[str, np.ndarray] | None = None,
) -> list[str]:
    """The mismatch pattern, as lines for a failure message ([] when none holds).

    ``actual`` and ``expected`` are arrays of one shape (NaN at the same place counts
    as equal), ``mismatched`` where the comparator failed them, ``rtol``/``atol`` its
    tolerance. ``without_step`` maps a reduction step ("the last k block") to the
    expected result with that step's contribution left out.

    >>> expected = np.arange(16.0).reshape(2, 8)
    >>> actual = expected.copy(); actual[:, 4:] *= 3
    >>> diagnose(actual, expected, actual != expected, rtol=0, atol=0,
    ...          blocks=Blocks((2, 4), "block_shape=(2, 4)"))[1]
    '  errors fill exactly output block (0, 1): columns 4-7 of 8'
    """
    if actual.shape != expected.shape or not np.any(mismatched) or actual.ndim == 0:
        return []
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)

    # A pattern that holds everywhere holds on the first rows: try them first, so that
    # the patterns that do not hold cost little on a large output.
    lead = (slice(0, max(1, _QUICK_LOOK // max(1, a[0].size))),)

    def close(candidate: np.ndarray, where: np.ndarray | None = None) -> bool:
        if where is None:
            return (_close(a[lead], candidate[lead], rtol, atol)
                    and _close(a, candidate, rtol, atol))
        return (_close(a[lead][where[lead]], candidate[lead][where[lead]], rtol, atol)
                and _close(a[where], candidate[where], rtol, atol))

    def close_part(part: tuple[slice, ...], candidate: np.ndarray) -> bool:
        return _close(a[part], candidate, rtol, atol)

    findings = _located(mismatched, blocks)
    findings += _block_holds_other_block(e, mismatched, blocks, close_part)
    findings += _scaled(a, e, mismatched, close)
    findings += _transposed(e, blocks, close)
    for step, candidate in (without_step or {}).items():
        candidate = np.asarray(candidate, np.float64)
        if candidate.shape == a.shape and not close(e) and close(candidate):
            findings.append(
                f"actual equals the expected result without {step}: exactly that step's "
                "contribution is missing (a grid one step short, or a step that does not "
                "accumulate)")
            break
    if not findings:
        return []
    unit = f"{blocks.noun}s of {blocks.shape}"
    return [f"Mismatch pattern, in {unit} ({blocks.source}):"] + [
        f"  {finding}" for finding in findings]


def _close(actual: np.ndarray, candidate: np.ndarray, rtol: float, atol: float) -> bool:
    with np.errstate(invalid="ignore", over="ignore"):
        ok = (np.abs(actual - candidate) <= _SLACK * (atol + rtol * np.abs(candidate))) | (
            np.isnan(actual) & np.isnan(candidate)) | ((actual == candidate) & np.isinf(actual))
    return bool(np.all(ok))


# --- where ------------------------------------------------------------------------


def _located(mismatched: np.ndarray, blocks: Blocks) -> list[str]:
    shape, block = mismatched.shape, blocks.shape
    counts = tuple(-(-size // b) for size, b in zip(shape, block))
    total = math.prod(counts)
    if total <= 1:
        return []
    per_block = _mismatches_per_block(mismatched, block)
    hit = [tuple(int(i) for i in row) for row in np.argwhere(per_block)]
    if len(hit) == total:
        return []  # every block: the location says nothing
    full = all(int(per_block[index]) == _region_size(index, block, shape) for index in hit)
    noun = blocks.noun
    low = [min(index[axis] for index in hit) for axis in range(len(shape))]
    high = [max(index[axis] for index in hit) for axis in range(len(shape))]
    if len(hit) > 1 and len(hit) == math.prod(h - lo + 1 for lo, h in zip(low, high)):
        # A box of blocks (a column of blocks, say): one range says it.
        first = _region(low, block, shape)
        last = _region(high, block, shape)
        span = tuple(slice(f.start, t.stop) for f, t in zip(first, last))
        listed = (f"({', '.join(str(lo) if lo == h else f'{lo}-{h}' for lo, h in zip(low, high))}"
                  f"{',' if len(shape) == 1 else ''}): {_describe_span(span, shape, counts)}")
        more = ""
    else:
        listed = "; ".join(
            f"{_format_block(index)}: {_describe_region(index, block, shape, counts)}"
            for index in hit[:_MAX_BLOCKS_LISTED])
        more = (f"; and {len(hit) - _MAX_BLOCKS_LISTED} more"
                if len(hit) > _MAX_BLOCKS_LISTED else "")
    plural = "s" if len(hit) > 1 else ""
    verb = "fill exactly" if full else "lie only in"
    lines = [f"errors {verb} {noun}{plural} {listed}{more} ({len(hit)} of {total} {noun}s)"
             if len(hit) > 1 else f"errors {verb} {noun} {listed}"]
    for axis, (size, b, count) in enumerate(zip(shape, block, counts)):
        if count > 1 and size % b and all(index[axis] == count - 1 for index in hit):
            name = _axis_name(axis, len(shape))
            lines.append(
                f"all errors sit in the ragged last {blocks.noun} along {name} "
                f"({name} {(count - 1) * b}-{size - 1} of {size}: "
                f"{size - (count - 1) * b} of {b}): a partial edge block, read, masked or "
                "written wrong?")
            break
    return lines


def _mismatches_per_block(mismatched: np.ndarray, block: Sequence[int]) -> np.ndarray:
    """How many elements mismatch in each block: an array of the block grid's shape.

    Pads to whole blocks and sums within each, so the memory it takes is the mask's,
    however many elements mismatch.
    """
    counts = [-(-size // b) for size, b in zip(mismatched.shape, block)]
    padded = np.zeros([c * b for c, b in zip(counts, block)], bool)
    padded[tuple(slice(0, size) for size in mismatched.shape)] = mismatched
    split = padded.reshape([n for pair in zip(counts, block) for n in pair])
    return split.sum(axis=tuple(range(1, 2 * len(counts), 2)), dtype=np.int64)


def _mismatched_blocks(mismatched: np.ndarray, block: Sequence[int]) -> list[tuple[int, ...]]:
    return [tuple(int(i) for i in row)
            for row in np.argwhere(_mismatches_per_block(mismatched, block))]


def _region(index: Sequence[int], block: Sequence[int], shape: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(i * b, min((i + 1) * b, size)) for i, b, size in zip(index, block, shape))


def _region_size(index: Sequence[int], block: Sequence[int], shape: Sequence[int]) -> int:
    return math.prod(s.stop - s.start for s in _region(index, block, shape))


def _format_block(index: Sequence[int]) -> str:
    return "(" + ", ".join(str(i) for i in index) + ("," if len(index) == 1 else "") + ")"


def _axis_name(axis: int, rank: int) -> str:
    if rank == 1:
        return "elements"
    return {rank - 1: "columns", rank - 2: "rows"}.get(axis, f"axis {axis}")


def _describe_region(index: Sequence[int], block: Sequence[int], shape: Sequence[int],
                     counts: Sequence[int]) -> str:
    return _describe_span(_region(index, block, shape), shape, counts)


def _describe_span(span: Sequence[slice], shape: Sequence[int], counts: Sequence[int]) -> str:
    parts = []
    for axis, piece in enumerate(span):
        if counts[axis] == 1 or (piece.start == 0 and piece.stop == shape[axis]):
            continue  # the whole axis: nothing to say about it
        span = (f"{piece.start}" if piece.stop - piece.start == 1
                else f"{piece.start}-{piece.stop - 1}")
        parts.append(f"{_axis_name(axis, len(shape))} {span} of {shape[axis]}")
    return ", ".join(parts)


def _block_holds_other_block(e: np.ndarray, mismatched: np.ndarray, blocks: Blocks,
                             close_part: Callable[..., bool]) -> list[str]:
    """Each wrong block holds the values of another block (an index map off by a block)."""
    shape, block = e.shape, blocks.shape
    counts = tuple(-(-size // b) for size, b in zip(shape, block))
    if math.prod(counts) > _MAX_BLOCKS_SEARCHED:
        return []
    hit = _mismatched_blocks(mismatched, block)
    found = []
    for index in hit:
        region = _region(index, block, shape)
        extent = [s.stop - s.start for s in region]
        source_found = None
        for other in itertools.product(*(range(c) for c in counts)):
            if other == index:
                continue
            starts = [o * b for o, b in zip(other, block)]
            if any(start + size > limit for start, size, limit in zip(starts, extent, shape)):
                continue
            source = tuple(slice(start, start + size) for start, size in zip(starts, extent))
            if close_part(region, e[source]):
                source_found = other
                break
        if source_found is None:
            return []
        found.append((index, source_found))
    lines = [f"{blocks.noun} {_format_block(index)} holds the values expected in "
             f"{blocks.noun} {_format_block(source)}"
             for index, source in found[:_MAX_BLOCKS_LISTED]]
    if len(found) > _MAX_BLOCKS_LISTED:
        lines.append(f"and {len(found) - _MAX_BLOCKS_LISTED} more {blocks.noun}s hold another's "
                     "values")
    lines[-1] += ": an index map that points at the wrong block"
    return lines


# --- how ----------------------------------------------------------------------------


def _scaled(a: np.ndarray, e: np.ndarray, mismatched: np.ndarray,
            close: Callable[..., bool]) -> list[str]:
    """actual = c * expected at every mismatched element, for one constant c."""
    if not np.all(np.isfinite(a), where=mismatched) or not np.all(np.isfinite(e),
                                                                   where=mismatched):
        return []
    nonzero = mismatched & (e != 0)
    if np.count_nonzero(nonzero) < 2 or (np.min(e, where=nonzero, initial=np.inf)
                                         == np.max(e, where=nonzero, initial=-np.inf)):
        return []  # one value fits any factor
    # The factor from a sample (if it is one factor, any sample shows it); checked on all below.
    sample = np.flatnonzero(nonzero[: max(1, _QUICK_LOOK // max(1, a[0].size))])
    ratios = (a.reshape(-1)[sample] / e.reshape(-1)[sample] if sample.size >= 2
              else a[nonzero] / e[nonzero])
    factor = float(np.median(ratios))
    if not math.isfinite(factor):
        return []
    scaled = factor * e
    if close(scaled):
        where = "every element"
    elif close(scaled, mismatched):
        where = "every mismatched element"
    else:
        return []
    if factor == 0:
        return [f"actual is 0 at {where}: the output, or these elements of it, "
                "never received a result"]
    return [f"actual = {factor:.6g} x expected at {where}: a constant factor (a scale "
            "applied twice or not at all, a wrong normaliser)"]


def _transposed(e: np.ndarray, blocks: Blocks, close: Callable[..., bool]) -> list[str]:
    """actual is expected with its last two axes swapped, as a whole or within each block."""
    if e.ndim < 2 or e.shape[-1] != e.shape[-2] or e.shape[-1] < 2:
        whole = None
    else:
        whole = np.swapaxes(e, -1, -2)
    if whole is not None and close(whole):
        return ["actual is the transpose of expected (last two axes swapped) at every "
                "element"]
    rows, cols = blocks.shape[-2:] if e.ndim >= 2 else (0, 0)
    if (e.ndim >= 2 and rows == cols and rows > 1 and e.shape[-2] % rows == 0
            and e.shape[-1] % cols == 0):
        lead = e.shape[:-2]
        tiled = e.reshape(*lead, e.shape[-2] // rows, rows, e.shape[-1] // cols, cols)
        within = np.swapaxes(tiled, -1, -3).reshape(e.shape)
        if close(within):
            return [f"each {rows}x{cols} {blocks.noun} holds the transpose of its expected "
                    "values (a block written transposed)"]
    return []


def reduction_steps_left_out(
    function: Callable[..., np.ndarray],
    args: Sequence[np.ndarray],
    *,
    argument: int,
    axis: int,
    block: int,
    name: str = "k",
) -> dict[str, np.ndarray]:
    """The expected results with the first and with the last block of a reduction left out.

    For ``without_step=`` of ``assert_allclose``: ``function(*args)`` is the oracle of
    a reduction that is linear in ``args[argument]`` (a sum, a matmul), whose ``axis``
    the kernel reduces in blocks of ``block``; zeroing one block of that argument
    removes exactly its contribution.

    >>> x = np.ones((2, 6)); y = np.ones((6, 3))
    >>> steps = reduction_steps_left_out(np.matmul, (x, y), argument=0, axis=1, block=4)
    >>> float(steps["the last k block"][0, 0]), float(steps["the first k block"][0, 0])
    (4.0, 2.0)
    """
    operand = np.asarray(args[argument], np.float64)
    size = operand.shape[axis]
    steps = {}
    for which, start in (("first", 0), ("last", (size - 1) // block * block)):
        zeroed = operand.copy()
        index = [slice(None)] * operand.ndim
        index[axis] = slice(start, start + block)
        zeroed[tuple(index)] = 0
        changed = [np.asarray(a, np.float64) for a in args]
        changed[argument] = zeroed
        steps[f"the {which} {name} block"] = np.asarray(function(*changed), np.float64)
    return steps


def bitwise_differences(first: Any, second: Any) -> np.ndarray:
    """Where two arrays of one dtype and shape differ bit for bit (NaN payloads, signed zeros)."""
    a, b = np.asarray(first), np.asarray(second)
    view = np.dtype(f"u{a.dtype.itemsize}")
    return a.view(view) != b.view(view)
