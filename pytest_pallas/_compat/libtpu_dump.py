"""Reading libtpu's schedule dumps of one Pallas kernel (an undocumented, internal format).

With ``LIBTPU_INIT_ARGS="--xla_jf_dump_to=DIR --xla_mosaic_dump_to=DIR"`` the TPU
compiler writes, per compiled ``tpu_custom_call`` (the kernel's HLO name, e.g.
``call.1``), among many files:

``*-<name>-NN-final_bundles.txt``
    the VLIW bundles as the chip runs them, one per line (``0x10 LB: > { ... }``).
    The grid loop runs from the bundle marked ``LB:`` to the backward
    ``sbr.rel``, then its branch delay slots; ``scmp.ge ... N /* loop exit test */``
    holds the loop's trip count, the grid steps this core runs + 2 (the pipeline's
    prologue and epilogue iterations). A forward ``sbr.rel ... target = $regionN``
    skips a predicated region (a ``pl.when`` body, a copy the pipeline does only
    when a block index changes) up to the bundle that opens ``regionN``.
    Every loop (Pallas' grid loop, an ``emit_pipeline``, a ``fori_loop`` the
    compiler kept) runs from its ``LB:`` bundle, which opens ``regionN``, to the
    backward ``sbr.rel ... target = $regionN``; its exit test compares an
    induction variable (``sadd.s32 STEP, %phi``, the ``sphi`` of an ``smov``
    constant and itself) against the limit. The grid loop is the one whose
    ``sphi`` copies say ``iteration index, stage`` (the pipeliner's own).
``*-<name>-NN-critical-path.txt``
    per basic block, ``Length to end:`` of each instruction on its critical path,
    in cycles: the MXU's result pops stall, so a matmul block's critical path
    exceeds its bundle count.
``*-<name>-NN-schedule-analysis_final_bundles.txt``
    ``total scheduled bundles``.
``*-<name>-NN-post-delay-converter.txt`` (or another late LLO file)
    the kernel's allocations, ``space=vmem ... size = 0x...``, ``scoped``.

Everything here is libtpu-internal: :func:`read_kernel_schedules` never raises on
a format it does not know. A metric it cannot read is None and
:attr:`Schedule.notes` says why in one line each.
"""

from __future__ import annotations

import dataclasses
import os
import re

#: Bytes of one DMA granule (``size_in_granules=``): a (128, 128) bfloat16 block is 1024.
DMA_GRANULE_BYTES = 32

_BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+|\d+)\s+(LB:|LH:|LE:|PB:|PF:|CT:)?\s*:?\s*(>*)\s*\{(.*)$")
_BRANCH = re.compile(r"sbr\.rel\s*(\([^)]*\))?\s*target = \$region(\d+)")
_EXIT_TEST = re.compile(r"scmp\.ge\.s32\.totalorder %\w+, (\d+) /\* loop exit test \*/")
_DMA_SIZE = re.compile(r"dma\.(hbm_to_vmem|vmem_to_hbm)\b.*?/\*size_in_granules=\*/(\d+)")
_SPILL = re.compile(r"\b(sst|sld|vst|vld)\b[^;{}]*_spill\]")
_DEFINED = re.compile(r"%([a-z]?)(\d+)(?:_[a-z]+\d+)? = ")
_CP_BLOCK = re.compile(r"^New basic block in region: region(\d+) \{[^}]*parent=(\d+)")
_CP_LENGTH = re.compile(r"^\s*Length to end: (\d+), %([a-z]?)(\d+)")
_TOTAL = re.compile(r"total scheduled bundles:\s*(\d+)")
_VMEM_ALLOC = re.compile(r"space=vmem, size = (0x[0-9a-f]+)[^\n]*\bscoped\b")

_BACKWARD = re.compile(r"sbr\.rel\s*\((!?)%(\w+)\)\s*target = \$region(\d+)")
_COMPARE = re.compile(r"^scmp\.(ge|gt|lt|le|ne)\.s32\.totalorder %(\w+), (%\w+|-?\d+)")
_INSTRUCTION = re.compile(r"^\s*(?:\([^)]*\)\s*)?%(\w+) = (.*)$", re.S)
_GRID_LOOP_PHI = "iteration index, stage"
_SPILL_STORE = re.compile(r"= sst \[smem:\[#(allocation\d+_spill)\]\] %(\w+)")

_NOT_KERNELS = ("TLP", "<late-")  # the program around the kernels, libtpu's own code


@dataclasses.dataclass(frozen=True)
class Region:
    """A predicated region of the grid loop: bundles ``[start, end)`` run only when taken."""

    start: int
    end: int
    has_dma: bool  # the pipeline's own copy-or-not regions (and the epilogue skip)


@dataclasses.dataclass(frozen=True)
class Block:
    """One basic block of the critical-path file: where it starts and its length in cycles."""

    address: int | None  # its first instruction's bundle, None when not found
    cycles: int


@dataclasses.dataclass(frozen=True)
class Loop:
    """A loop of the kernel: bundles ``[start, end)`` (delay slots included) run ``trips`` times.

    ``trips`` is None where the dump does not give it as constants (a trip count
    read from data: scalar prefetch, ragged group sizes); ``grid`` marks Pallas'
    grid loop, whose trips are the steps this TensorCore runs + 2.
    """

    start: int
    end: int
    trips: int | None
    grid: bool
    dma_bytes: int  # copies the body's bundles issue, predicated ones included
    # dma_bytes replaced by the copies an emit_pipeline's index maps imply
    copies_from_index_maps: bool = False
    # per pl.when region of the body (outside its inner loops), the share of trips that run it
    region_shares: tuple[float | None, ...] | None = None


@dataclasses.dataclass
class Schedule:
    """What the dump of one kernel says; None where it could not be read (see ``notes``)."""

    total_bundles: int | None = None
    loop_steps: int | None = None  # grid steps this core runs (the loop's trip count - 2)
    loop_start: int | None = None
    loop_end: int | None = None  # one past the last delay slot
    regions: list[Region] = dataclasses.field(default_factory=list)
    blocks: list[Block] = dataclasses.field(default_factory=list)
    dma_bytes_in_loop: int | None = None  # every copy the loop body issues, taken or not
    spills: int | None = None  # spill stores and fill loads in the loop body
    vmem_bytes: int | None = None
    custom_call: bool = False  # a Pallas kernel (its entry bundle names a custom-call)
    loops: list[Loop] = dataclasses.field(default_factory=list)  # every loop, outer first
    dma_in_bytes_outside_loops: int = 0  # copies into VMEM before or between the loops
    dma_out_bytes_outside_loops: int = 0  # copies out of VMEM after or between them
    notes: list[str] = dataclasses.field(default_factory=list)
    # Each instruction's bundle, for placing the critical-path file's blocks.
    addresses: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def loop_bundles(self) -> int | None:
        if self.loop_start is None or self.loop_end is None:
            return None
        return self.loop_end - self.loop_start


def kernel_files(directory: str) -> dict[str, dict[str, str]]:
    """Per kernel name, its dump files by kind (``final_bundles``, ``critical_path``, ...)."""
    found: dict[str, dict[str, str]] = {}
    pattern = re.compile(r"^\d+-(.+)-(\d+)-(final_bundles|critical-path|"
                         r"schedule-analysis_final_bundles|post-delay-converter)\.txt$")
    for name in sorted(os.listdir(directory)):
        match = pattern.match(name)
        if not match or match.group(1).startswith(_NOT_KERNELS):
            continue
        kind = match.group(3).replace("-", "_")
        found.setdefault(match.group(1), {})[kind] = os.path.join(directory, name)
    return found


def read_kernel_schedules(directory: str, delay_slots: int) -> dict[str, Schedule]:
    """Every kernel's :class:`Schedule` in a dump directory (empty when there is none)."""
    schedules = {}
    for kernel, files in kernel_files(directory).items():
        texts = {}
        for kind, path in files.items():
            try:
                with open(path, errors="replace") as handle:
                    texts[kind] = handle.read()
            except OSError:
                continue
        schedules[kernel] = parse_schedule(texts, delay_slots)
    return schedules


def parse_schedule(texts: dict[str, str], delay_slots: int) -> Schedule:
    """A :class:`Schedule` from a kernel's dump texts by kind; never raises."""
    schedule = Schedule()
    steps = (("final_bundles", _read_bundles), ("critical_path", _read_critical_path),
             ("schedule_analysis_final_bundles", _read_total),
             ("post_delay_converter", _read_vmem))
    for kind, read in steps:
        text = texts.get(kind)
        if text is None:
            schedule.notes.append(f"libtpu wrote no {kind.replace('_', '-')} file")
            continue
        try:
            read(text, schedule, delay_slots)
        except Exception as error:  # noqa: BLE001  # an unknown format is a note, never a failure
            schedule.notes.append(f"{kind.replace('_', '-')}: format not understood ({error})")
    return schedule


def _read_bundles(text: str, schedule: Schedule, delay_slots: int) -> None:
    bundles: list[tuple[int, str, str]] = []  # (address, marker, text)
    for line in text.splitlines():
        match = _BUNDLE.match(line)
        if match:
            bundles.append((int(match.group(1), 0), match.group(2) or "", match.group(4)))
        elif bundles:  # a bundle's comment may run over several lines
            address, marker, body = bundles[-1]
            bundles[-1] = (address, marker, body + "\n" + line)
    if not bundles:
        schedule.notes.append("final-bundles: no bundle lines recognised")
        return
    schedule.custom_call = "custom-call(" in bundles[0][2]
    schedule.loops = _read_loops(bundles, delay_slots, schedule.notes)
    grid = next((loop for loop in schedule.loops if loop.grid), None)
    if grid is None:
        # No grid loop (a grid of one step per core: pl.kernel and pl.core_map on a
        # TensorCore mesh, emit_pipeline in a grid-less pallas_call): one step is
        # the whole kernel, its own loops weighed by their trips.
        schedule.loop_steps = 1
        schedule.loop_start, schedule.loop_end = 0, bundles[-1][0] + 1
    else:
        schedule.loop_start, schedule.loop_end = grid.start, grid.end
        schedule.loop_steps = None if grid.trips is None else max(grid.trips - 2, 1)
        if grid.trips is None:
            schedule.notes.append("final-bundles: the grid loop's trip count is not a constant")
    outside = [a for a, _, _ in bundles if not any(
        loop.start <= a < loop.end for loop in schedule.loops)]
    outside_set = set(outside)
    for address, _, body in bundles:
        if address in outside_set:
            schedule.dma_in_bytes_outside_loops += _dma_bytes(body, "hbm_to_vmem")
            schedule.dma_out_bytes_outside_loops += _dma_bytes(body, "vmem_to_hbm")
    loop_start, loop_end = schedule.loop_start, schedule.loop_end
    in_loop = [(a, m, b) for a, m, b in bundles if loop_start <= a < loop_end]
    # Forward branches inside the loop: the region up to the bundle opening the target.
    for index, (address, _, body) in enumerate(in_loop):
        match = _BRANCH.search(body)
        if not match:
            continue
        opens = re.compile(rf"\bregion {match.group(2)}\b|\$?region{match.group(2)}\b")
        target = next((a for a, marker, later in in_loop[index + 1:]
                       if marker == "PF:" and opens.search(later.split("/*", 1)[-1])), None)
        if target is None:
            continue  # the backward branch, or a target outside the loop
        start = address + 1 + delay_slots
        if target <= start:
            continue
        # A copy region: a DMA, or (7x, operands XLA placed in VMEM) vector loads and
        # stores that signal the copy's semaphore with vsyncadd.
        has_dma = any("dma." in later or "vsyncadd" in later
                      for a, _, later in in_loop if start <= a < target)
        schedule.regions.append(Region(start, target, has_dma))
    granules = 0
    for _, _, body in in_loop:
        for instruction in body.split(";;"):
            if "shalt" in instruction:  # a bounds check quoting the copy it guards
                continue
            granules += sum(int(m.group(2)) for m in _DMA_SIZE.finditer(instruction))
    schedule.dma_bytes_in_loop = granules * DMA_GRANULE_BYTES
    schedule.spills = sum(len(_SPILL.findall(body)) for _, _, body in in_loop)
    for address, _, body in bundles:
        for m in _DEFINED.finditer(body):
            schedule.addresses.setdefault(m.group(2), address)


def _dma_bytes(body: str, direction: str | None = None) -> int:
    """Bytes the DMAs of one bundle move (a bounds check quoting a copy is no copy)."""
    granules = 0
    for instruction in body.split(";;"):
        if "shalt" in instruction:
            continue
        granules += sum(int(m.group(2)) for m in _DMA_SIZE.finditer(instruction)
                        if direction is None or m.group(1) == direction)
    return granules * DMA_GRANULE_BYTES


def _read_loops(bundles: list[tuple[int, str, str]], delay_slots: int,
                notes: list[str]) -> list[Loop]:
    """Every loop of the bundles: its extent, trips (None when data decides) and copies."""
    definitions: dict[str, str] = {}
    for _, _, body in bundles:
        for instruction in body.split(";;"):
            text = instruction.strip().lstrip(">").lstrip("{").strip()
            match = _INSTRUCTION.match(text)
            if match:
                definitions.setdefault(match.group(1), match.group(2))
            # A spill store, for following a reload back to the value spilled (the only
            # store to a spill slot of a loop counter, as libtpu 0.0.42.1 writes them).
            spill = _SPILL_STORE.search(text)
            if spill:
                definitions.setdefault(spill.group(1), spill.group(2))
    opened: dict[str, int] = {}
    for address, marker, body in bundles:
        if marker == "LB:":
            for region in re.findall(r"Start region (\d+)", body):
                opened.setdefault(region, address)
    loops = []
    for index, (address, _, body) in enumerate(bundles):
        branch = _BACKWARD.search(body)
        if not branch or branch.group(3) not in opened or opened[branch.group(3)] > address:
            continue
        start = opened[branch.group(3)]
        end = address + 1 + delay_slots
        in_loop = [(a, b) for a, _, b in bundles if start <= a < end]
        trips = _trip_count(branch.group(2), branch.group(1) == "!", definitions)
        is_grid = _GRID_LOOP_PHI in bundles[next(
            i for i, (a, _, _) in enumerate(bundles) if a == start)][2]
        loops.append(Loop(start, end, trips, is_grid, sum(_dma_bytes(b) for _, b in in_loop)))
    loops.sort(key=lambda loop: (loop.start, -loop.end))
    # A loop's copies are its own bundles' (those of loops inside it are theirs).
    own = []
    for loop in loops:
        inner = [other for other in loops if other is not loop
                 and loop.start <= other.start and other.end <= loop.end]
        nested = sum(other.dma_bytes for other in inner if not any(
            o is not other and o.start <= other.start and other.end <= o.end for o in inner))
        own.append(dataclasses.replace(loop, dma_bytes=loop.dma_bytes - nested))
    unknown = sum(1 for loop in own if loop.trips is None)
    if unknown:
        notes.append(f"{unknown} loop(s) whose trip count is read from data (scalar prefetch, "
                     "group sizes): each counted as running once")
    return own


@dataclasses.dataclass(frozen=True)
class _Test:
    counter: str  # the incremented induction variable
    limit: str  # a constant, or a register (read from data)
    inclusive: bool  # the loop runs at the limit too (i > n exits, i <= n goes on)


def _trip_count(predicate: str, negated: bool, definitions: dict[str, str]) -> int | None:
    """How many times the loop body runs, from its exit test; None unless all constants.

    The backward branch is taken while the counter has not reached the limit:
    ``!(i >= n)`` (libtpu marks that test ``loop exit test``) or ``i < n``.
    """
    compare = _COMPARE.match(definitions.get(predicate, ""))
    if compare is None:
        return None
    kind = compare.group(1)
    if (negated and kind not in ("ge", "gt")) or (not negated and kind not in ("lt", "le", "ne")):
        return None
    test = _Test(compare.group(2), compare.group(3), kind in ("gt", "le"))
    limit = test.limit
    if not re.fullmatch(r"-?\d+", limit):
        return None  # a limit held in a register: read from data
    def resolved(name: str) -> str:
        """The value behind register copies ("smov %x") and spill reloads of it."""
        for _ in range(8):
            definition = definitions.get(name, "")
            copy = re.match(r"smov %(\w+)", definition)
            reload = re.match(r"sld \[smem:\[#(allocation\d+_spill)\]\]", definition)
            if copy:
                name = copy.group(1)
            elif reload and reload.group(1) in definitions:
                name = definitions[reload.group(1)]
            else:
                break
        return name

    step_def = definitions.get(test.counter, "")
    step = re.match(r"sadd\.s32 (-?\d+), %(\w+)|sadd\.s32 %(\w+), (-?\d+)", step_def)
    if not step:
        return None
    increment = int(step.group(1) or step.group(4))
    phi = resolved(step.group(2) or step.group(3))
    phi_def = re.match(r"sphi %(\w+), %(\w+)", definitions.get(phi, ""))
    if not phi_def or increment <= 0:
        return None
    if resolved(phi_def.group(2)) == test.counter:
        initial = phi_def.group(1)
    elif resolved(phi_def.group(1)) == test.counter:
        initial = phi_def.group(2)
    else:
        return None
    constant = re.match(r"smov (-?\d+)\b", definitions.get(resolved(initial), "")) or \
        re.match(r"smov (-?\d+)\b", definitions.get(initial, ""))
    if not constant:
        return None
    span = int(limit) - int(constant.group(1)) + (1 if test.inclusive else 0)
    return max(1, -(-span // increment))


def _read_critical_path(text: str, schedule: Schedule, delay_slots: int) -> None:
    addresses = schedule.addresses
    block: list[tuple[int, str]] | None = None
    blocks: list[list[tuple[int, str]]] = []
    for line in text.splitlines():
        if _CP_BLOCK.match(line):
            block = []
            blocks.append(block)
            continue
        length = _CP_LENGTH.match(line)
        if length and block is not None:
            block.append((int(length.group(1)), length.group(3)))
    for lengths in blocks:
        if not lengths:
            continue
        # The block starts at the earliest bundle of any instruction on its path
        # (the first may have been folded into another by the scheduler).
        found = [addresses[i] for _, i in lengths if i in addresses]
        schedule.blocks.append(Block(min(found) if found else None, lengths[0][0]))
    if not schedule.blocks:
        schedule.notes.append("critical-path: no 'Length to end' blocks recognised")


def _read_total(text: str, schedule: Schedule, delay_slots: int) -> None:
    match = _TOTAL.search(text)
    if match:
        schedule.total_bundles = int(match.group(1))
    else:
        schedule.notes.append("schedule-analysis: no 'total scheduled bundles' line")


def _read_vmem(text: str, schedule: Schedule, delay_slots: int) -> None:
    sizes = [int(m.group(1), 16) for m in _VMEM_ALLOC.finditer(text)]
    if sizes:
        schedule.vmem_bytes = sum(sizes)
    else:
        schedule.notes.append("post-delay-converter: no scoped VMEM allocation lines")


_VMATMUL_MODE = re.compile(r"llo\.vmatmul\b[^\n]*?matmul_mode<(\w+)>")


def matmul_modes(directory: str) -> dict[str, int]:
    """How many ``llo.vmatmul`` of each ``matmul_mode`` (``round``: one bfloat16 pass;
    ``high``, ``low``, ``soft_low_eight``, ``soft_middle_eight``: the passes of
    ``precision=HIGHEST``) the ``*post-lower-to-llo*`` dumps under ``directory`` hold.
    Empty when there are none, or the format moved."""
    counts: dict[str, int] = {}
    for root, _, names in os.walk(directory):
        for name in names:
            if "post-lower-to-llo" not in name:
                continue
            with open(os.path.join(root, name), errors="replace") as file:
                for mode in _VMATMUL_MODE.findall(file.read()):
                    counts[mode] = counts.get(mode, 0) + 1
    return counts


# XLA's own fusions: the first LLO of each (``<id>-<unit>-NN-original.txt``), whose unit is
# the HLO instruction's name. A Pallas kernel is a unit too (its ``tpu_custom_call``), told
# apart by the program's HLO (``TLP-hlo.txt``).
_LLO_ORIGINAL = re.compile(r"^\d+-(.+)-\d+-original\.txt$")
_LLO_VMATMUL = re.compile(r"= vmatmul\.([a-z0-9]+)")
_LLO_FLOAT32_MULTIPLY = re.compile(r"= vmul\.f32\b")
_TPU_CUSTOM_CALL = re.compile(r"%([\w.\-]+) = [^\n]*custom-call\([^\n]*"
                              r"custom_call_target=\"tpu_custom_call\"")


@dataclasses.dataclass(frozen=True)
class DotInstructions:
    """What the dots of one compiled program became, from its dump (see
    :func:`dot_instructions`)."""

    kernel_modes: dict[str, int]  # Mosaic's llo.vmatmul per matmul_mode (``round``: 1 pass)
    xla_formats: dict[str, int]  # XLA's own vmatmul per data format (``bf16``, ``f32``, ...)
    float32_multiplies: int  # vmul.f32 in any unit: products computed in float32, off the MXU


def dot_instructions(directory: str) -> DotInstructions:
    """The matrix-unit and vector instructions of every unit under ``directory``: a Pallas
    kernel's ``llo.vmatmul`` by ``matmul_mode`` (:func:`matmul_modes`); XLA's own fusions'
    ``vmatmul`` by the data format their LLO names (``vmatmul.bf16``: operands taken as
    bfloat16; ``vmatmul.f32``: float32 data, whose mode that text does not print; v4 names
    its passes ``hi`` and ``low``); ``vmul.f32`` anywhere. Empty counts where the format
    moved."""
    kernels: set[str] = set()
    originals: list[tuple[str, str]] = []
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            if name.endswith("TLP-hlo.txt"):
                kernels.update(_TPU_CUSTOM_CALL.findall(_read(path)))
            match = _LLO_ORIGINAL.match(name)
            if match and not match.group(1).startswith(_NOT_KERNELS):
                originals.append((match.group(1), path))
    formats: dict[str, int] = {}
    multiplies = 0
    for unit, path in originals:
        text = _read(path)
        multiplies += len(_LLO_FLOAT32_MULTIPLY.findall(text))
        if unit in kernels:
            continue  # a kernel's modes are read from Mosaic's own dump
        for data_format in _LLO_VMATMUL.findall(text):
            formats[data_format] = formats.get(data_format, 0) + 1
    return DotInstructions(matmul_modes(directory), formats, multiplies)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as file:
            return file.read()
    except OSError:
        return ""


# A kernel's memory accesses after libtpu's bounds-check pass (``*-post-bounds-check.txt``):
# ``%s25 = sld [smem:[#allocation4 + %s0]]``, ``%32 = vst [vmem:[%s31] ...``,
# ``%26 = dma.hbm_to_vmem [thread:$0] /*hbm=*/%s22, ...``; each check the pass added halts
# just before its access: ``shalt.err (...) /* BoundsCheck 0 [deref of %s22] for %26 =
# dma.hbm_to_vmem ...`` (libtpu 0.0.42), ``... [deref of opnd#0] for dma.hbm_to_vmem``
# (0.0.50, naming the instruction only: the next one of that name is the one checked).
_ACCESS = re.compile(
    r"^\s*%(\w+) = (?:(?P<op>[sv](?:ld|st)) \[(?P<space>\w+):\[(?P<address>[^\]]*)\]"
    r"|(?P<dma>dma\.(?!done\b)\w+)\b)")
_CHECKED = re.compile(
    r"shalt\.err [^\n]*?/\* BoundsCheck \d+ \[deref of [^\]]+\] for (?:%(\w+) = )?([\w.]+)")


@dataclasses.dataclass(frozen=True)
class MemoryAccess:
    """One load, store or DMA of a kernel as libtpu's bounds-check pass left it."""

    instruction: str  # "sld", "sst", "vld", "vst" or the DMA's, "dma.hbm_to_vmem"
    space: str  # "smem", "vmem" (loads and stores); "" for a DMA, whose ends its name says
    dynamic: bool  # its address is computed at run time (a register), not a constant
    checked: bool  # a BoundsCheck halts the kernel before it when out of bounds


def memory_accesses(directory: str) -> list[MemoryAccess]:
    """The loads, stores and DMAs of the Pallas kernels dumped under ``directory``, each with
    whether libtpu's bounds-check pass guards it. Empty when there is no such dump or the
    format moved."""
    found = []
    pattern = re.compile(r"^\d+-(.+)-\d+-post-bounds-check\.txt$")
    for root, _, names in os.walk(directory):
        for name in sorted(names):
            match = pattern.match(name)
            if not match or match.group(1).startswith(_NOT_KERNELS):
                continue
            with open(os.path.join(root, name), errors="replace") as file:
                found += _accesses(file.read())
    return found


def _accesses(text: str) -> list[MemoryAccess]:
    checked = {number for number, _ in _CHECKED.findall(text) if number}
    pending: list[str] = []  # checks that name their instruction only, in order
    found = []
    for line in text.splitlines():
        check = _CHECKED.search(line)
        if check is not None and not check[1]:
            pending.append(check[2])
        access = _ACCESS.match(line)
        if access is None:
            continue
        instruction = access["dma"] or access["op"]
        guarded = access[1] in checked or instruction in pending
        if instruction in pending:
            pending.remove(instruction)
        if access["dma"]:
            found.append(MemoryAccess(instruction, "", True, guarded))
        else:
            found.append(MemoryAccess(instruction, access["space"], "%" in access["address"],
                                      guarded))
    return found
