"""The results of a peer-suite run (JUnit XML), classed by cause and tabulated.

Pure: reads the XML pytest wrote with ``--junitxml`` (``-o junit_family=xunit1``, which keeps
each test's file), and returns tables as text. benchmarks/peer_suites.py runs the suites;
this module only reads what they left. ``python benchmarks/peer_suite_results.py OFF.xml ON.xml``
prints the tables again from the files of an earlier run.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import xml.etree.ElementTree as ET

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclasses.dataclass(frozen=True)
class Result:
    test_id: str      # file::Class::name, as pytest names it
    file: str         # the test file's name (tpu_pallas_test.py)
    outcome: str      # passed, failed (a failure or an error) or skipped (skip or xfail)
    reason: str       # "ExceptionType: first line" of a failure, a skip's reason
    seconds: float
    detail: str = ""  # a failure's whole text (its traceback)


def read_junit(path) -> list[Result]:
    """Every test case of a JUnit XML file, in file order."""
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        file = case.get("file") or classname.replace(".", "/").rsplit("/", 1)[0] + ".py"
        test_id = f"{file}::{classname.rsplit('.', 1)[-1]}::{name}" if "." in classname \
            else f"{file}::{name}"
        outcome, reason, detail = PASSED, "", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, reason, detail = FAILED, _failure_reason(child), child.text or ""
                break
            if child.tag == "skipped":
                outcome, reason = SKIPPED, child.get("message") or child.text or ""
                break
        results.append(Result(test_id, file.rsplit("/", 1)[-1], outcome, reason,
                              float(case.get("time") or 0.0), detail))
    return results


def _failure_reason(element) -> str:
    """'Type: first line' of a failure: pytest's message attribute is the exception's repr
    line; where it has no type (an assert rewritten by pytest), the E-lines of the text say it."""
    message = (element.get("message") or "").strip()
    text = element.text or ""
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    typed = next((line for line in reversed(errors)
                  if re.match(r"^[\w.]+(Error|Exception|Timeout|Violation|Failure)\b", line)), None)
    if typed and not re.match(r"^[\w.]+(Error|Exception|Timeout|Violation|Failure)\b", message):
        return typed
    return message or (errors[-1] if errors else element.get("type", "failure"))


_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(\.\d+)?(e[-+]?\d+)?")


def normalise(reason: str) -> str:
    """The first line of a reason with numbers, addresses and long quotes blanked, so that
    one cause with different shapes or sizes is one class."""
    line = (reason.strip().splitlines() or [""])[0]
    line = re.sub(r"^.*?\.py:\d+: ", "", line)          # a skip's "file.py:12: " prefix
    line = re.sub(r"\b(?:\w+\.)+(\w+(?:Error|Exception|Violation|Timeout)\b)", r"\1", line)
    line = re.sub(r"0x[0-9a-fA-F]+", "0x…", line)
    line = re.sub(r"'[^']{40,}'", "'…'", line)
    line = re.sub(r"\([^()]*\bshape[^()]*\)", "(…)", line)
    line = _NUMBER.sub("N", line)
    line = re.sub(r"\s+", " ", line).strip()
    return line[:160] + ("…" if len(line) > 160 else "")


# (pattern searched in the outcome and the reason, the cause in words). First match wins, so
# the specific come before the general. Each cause is what the measurement found behind it.
TPU_GATE = "gates on a TPU or a TPU generation the device under test is not"
# jtu.is_cloud_tpu_at_least(date), answered for the installed libtpu's build date: a TPU with
# the libtpu this jax pins (jax[tpu]) skips the test too.
NEWER_LIBTPU = "needs a newer libtpu than the installed one (skips on a TPU with it too)"
KEPT_OFF_TPUS = "the suite keeps the test off every TPU (its own gate)"
GPU_TEST = "a GPU test"
CAUSES: list[tuple[str, str]] = [
    (r"PeerSuiteTimeout|Timeout|ran longer than --pallas-timeout",
     "timeout: the test ran past the per-test limit"),
    # Python 3.11's ast check, hit by pytest rendering a Hypothesis test's failure after its
    # time limit (tpu_pallas_pipeline_test.py's padded matmuls).
    (r"AST constructor recursion depth mismatch",
     "timeout: the test ran past the per-test limit (pytest then failed to render it)"),
    (r"crashed while running|node down|Not properly terminated",
     "crash: the test's process died (pytest-xdist replaced the worker)"),
    (r"JaxFeatureOff|device under test is off",
     "the plugin's device-under-test declaration is off on this JAX"),
    # JAX main's tests (cec06d1) against the installed jax 0.12.0.1, whose explicit MXU
    # takes accumulator refs: the test calls an API its JAX no longer has.
    (r"unexpected keyword argument 'acc_addr'",
     "the tests' JAX (main at cec06d1) and the installed one disagree: the explicit MXU's API"),
    # ... and calls pl.core_map, which jax 0.12.0.1 deprecates (its warnings are errors).
    (r"core_map is deprecated, use jax\.experimental\.pallas\.kernel",
     "the tests' JAX (main at cec06d1) and the installed one disagree: pl.core_map deprecated"),
    (r"(un)?pack_elementwise",
     "JAX interpreter limit: pack_elementwise/unpack_elementwise have no CPU rule"),
    (r"dma_sem", "JAX interpreter limit: an uninitialised DMA semaphore (nan + dma_sem)"),
    (r"discharge rule implemented for primitive: io_callback|empty_ref",
     "JAX interpreter limit: jax.empty_ref in a kernel (no discharge rule for io_callback)"),
    (r"JaxprInputEffect",
     "JAX interpreter limit: the emit_pipeline primitive's state effects (no jaxpr input)"),
    (r"Incorrect output shape for return value",
     "JAX interpreter limit: a ref bitcast between packings returns the wrong shape"),
    (r"keeps an operand in host memory",
     "JAX interpreter limit: a kernel with an operand in host memory (pl.HOST)"),
    (r"needs about [\d.]+ GiB of host memory",
     "this host's memory: the interpreter's copies of the kernel's arrays would not fit"),
    (r"callbacks are only supported in spmd computations",
     "JAX interpreter limit: host callbacks in a program under a partly automatic mesh"),
    (r"DMA partial discharge add=True",
     "JAX interpreter limit: an adding indexed DMA (neither interpreter, jax 0.12)"),
    (r"neither of JAX's interpreters can run",
     "JAX interpreter limit: neither interpreter runs the kernel (a primitive with no CPU rule)"),
    (r"Only interpret mode is supported on CPU backend",
     "false alarm: the compile check lowered an interpret-only kernel for the CPU"),
    (r"Cannot lower a pallas_call with constants",
     "false alarm: the compile check cannot lower a kernel that closes over constants"),
    (r"input window allocation|scoped allocation|Ran out of memory\)\|\(exceed memory",
     "expects the TPU compiler's words for a VMEM overflow (the plugin's static rule answered)"),
    (r"Cannot resolve attribute pretty_print",
     "a TypeError inside JAX's jaxpr printer on a nested ref selection (not examined further)"),
    (r"TpuRuleViolation.*(Mosaic failed to compile|the TPU compiler \(libtpu [^)]*\) rejects)",
     "the TPU compiler rejects the kernel for the stand-in chip"),
    (r"TpuRuleViolation", "the plugin's TPU check rejected the kernel"),
    (r"cost_analysis|used_scoped_memory|as_text\(\)|debug=True|HloModule"
     r"|different from the lowering platform tpu",
     "reads a compiled artefact (cost analysis, the HLO's memory configs, debug MLIR)"),
    (r"MosaicError|Only i1 and i32|LoweringException|MLIRError",
     "expects the chip's rejection (Mosaic lowering or the TPU compiler)"),
    # The test's own: its kv-head Megacore mode wants an even head count, on any chip.
    (r"when num_kv_heads is odd", "the test's own parameter skip (skips on the chip too)"),
    (r"Megacore|megacore", "Megacore only: the stand-in chip has one TensorCore"),
    (r"(?i)interpret not supported|non-interpret mode|fail on interpreter"
     r"|interpret mode does not support|not supported in interpret mode"
     r"|add interpret support",
     "the test declines the interpreter (it runs compiled only)"),
    # The test's own, on any chip: "Requires TPU v5+ and not too large stride." skips the
    # large strides on a v5+ too; "doesn't work yet." skips unconditionally.
    (r"not too large stride|doesn't work yet|not yet supported by the emit_pipeline primitive"
     # A SparseCore class with and without TC tiling skips what the other runs; a head count
     # the shards do not divide.
     r"|TC tiling is not supported|Test only works under TC tiling"
     r"|requires \d+ heads, but has only \d+ head shards"
     r"|interleaved-minor-\d+ unsupported|Requires pytest -s \(no capture\)",
     "the test's own parameter skip (skips on the chip too)"),
    (r"Only run interpret tests on CPU|interpret.*on CPU",
     "interpret-mode test: runs only where the device under test is the CPU"),
    (r"(?i)only \d+ device is supported|single device",
     "wants one device: the run simulates several"),
    (r"(?i)needs? \d+ (JAX )?devices|requires \d+ JAX devices",
     "wants more devices than the run has"),
    (r"ModuleNotFoundError|No module named", "a test dependency is not installed"),
    (r"(?i)sparsecore", "needs a SparseCore"),
    (r"(?i)hopper|blackwell|\bgpu|triton", GPU_TEST),
    (r"no sharding on runners", "the suite's own skip of sharded tests on its CI runners"),
    (r"Bitcasting with bool|No bitcast needed|Bitwidths must match|out of bounds for packing"
     r"|Requires aligned shape|Shift amount out of range"
     r"|only supported for shapes with vreg alignment|Requires jax_use_emit_pipeline_primitive"
     r"|Requires axis < rank|Scalar output not supported|Negative shift amount for unsigned",
     "the test's own parameter skip (skips on the chip too)"),
    (r"(?i)needs? a newer libtpu", NEWER_LIBTPU),
    (r"FP8 matmul is not supported on this device", TPU_GATE),
    # A suite that keeps a test off every TPU, or skips it on every machine (its own slow or
    # unfinished cases): a TPU run of the suite skips it too.
    (r"(?i)not supported on tpus\b|disabled on tpu|^disabled for now|fails to compile in mosaic",
     KEPT_OFF_TPUS),
    (r"(?i)too slow for|not implemented yet|^Test not supported: None"
     r"|not supported by the kernel|^TODO: |requires .+ in this config|^v\d does not support",
     "the test's own parameter skip (skips on the chip too)"),
    (r"Device kind cpu is not supported|device kind",
     "asks the device kind: the CPU is no TPU generation"),
    (r"(?i)tpu|device_under_test|not supported on (the )?cpu|requires? .*(accelerator|device)",
     TPU_GATE),
    # An integer's maximum where the chip's poison is its minimum (int32, int16, int8).
    (r"Arrays are not equal.*\b(2147483647|32767|127) \(ACTUAL\), -(2147483648|32768|128) "
     r"\(DESIRED\)",
     "value comparison: the test reads uninitialised memory (another poison value)"),
    (r"Not equal to tolerance|Arrays are not|Mismatch|allclose|not close",
     "value comparison: the result differs from the test's expectation"),
    # JAX's padded-matmul tests: their own 'deterministic' profile draws too few inputs past
    # their assume()s with Hypothesis 6.170 (reproduced with Hypothesis alone, no kernel).
    (r"FailedHealthCheck", "Hypothesis health check: the test's own profile fails it with the "
     "installed Hypothesis"),
    (r"hypothesis|Hypothesis", "Hypothesis health check or its settings"),
]
# Tried on a failure's whole text (its traceback) when its first line matched none of CAUSES:
# a test whose own assertion failed on something it read, named only in its source line.
DETAIL_CAUSES: list[tuple[str, str]] = [
    # JAX's own interpret classes skip these ("Interpret mode does not support host memory.").
    (r"memory_kind='pinned_host'",
     "host memory: the CPU backend cannot lower a pinned_host placement (a JAX limit)"),
    (r"\.num_cores\b[^\n]*\n(.*\n)*?E\s+AttributeError",
     "reads a TPU attribute of JAX's device object (num_cores): the devices stay CPU devices"),
    (r"assert triton_\w+ is not None", "a GPU test (its Triton ops are not installed)"),
    (r"cost_analysis|used_scoped_memory_configs|\.as_text\(\)|compiler_ir\(\)|debug_string"
     r"|debug=True",
     "reads a compiled artefact (cost analysis, the HLO's memory configs, debug MLIR)"),
    (r"Incorrect output shape for return value",
     "JAX interpreter limit: a ref bitcast between packings returns the wrong shape"),
]
UNCLASSED = "unclassed"


def cause(outcome: str, reason: str, detail: str = "") -> str:
    if outcome == PASSED:
        return ""
    # A skip's "tests/pallas/tpu_ops_test.py:416: " names the file, not the cause.
    reason = re.sub(r"^\S*\.py:\d+: ", "", reason.strip())
    for pattern, words in CAUSES:
        if re.search(pattern, reason, re.DOTALL):
            return words
    for pattern, words in DETAIL_CAUSES:
        if re.search(pattern, detail):
            return words
    return UNCLASSED


@dataclasses.dataclass
class FileRow:
    file: str
    ids: int = 0
    skipped_off: int = 0          # with the plugin off: the TPU-only tests
    passed_off: int = 0
    run_on: int = 0               # of the TPU-only tests, opted in: run (not skipped)
    passed_on: int = 0
    failed_on: int = 0
    skipped_on: int = 0
    lost: int = 0                 # passed with the plugin off, not opted in
    seconds_off: float = 0.0      # the tests' own time (setup, call, teardown), summed
    seconds_on: float = 0.0


def compare(off: list[Result], on: list[Result] | None):
    """Per file, the counts of both runs, and the classes of what did not pass opted in:
    {(outcome, cause, normalised reason): count}. Without ``on``, the classes of ``off``'s skips
    and failures. A test absent from one run (a run cut short) is not counted in either."""
    on_by_id = {result.test_id: result for result in on or []}
    rows: dict[str, FileRow] = {}
    classes: collections.Counter = collections.Counter()
    for before in off:
        after = on_by_id.get(before.test_id) if on is not None else None
        if on is not None and after is None:
            continue
        row = rows.setdefault(before.file, FileRow(before.file))
        row.ids += 1
        row.passed_off += before.outcome == PASSED
        row.skipped_off += before.outcome == SKIPPED
        row.seconds_off += before.seconds
        if on is None:
            if before.outcome != PASSED:
                classes[_class_of(before)] += 1
            continue
        row.seconds_on += after.seconds
        if before.outcome == SKIPPED:
            row.run_on += after.outcome != SKIPPED
            row.passed_on += after.outcome == PASSED
            row.failed_on += after.outcome == FAILED
            row.skipped_on += after.outcome == SKIPPED
            if after.outcome != PASSED:
                classes[_class_of(after)] += 1
        elif before.outcome == PASSED and after.outcome != PASSED:
            row.lost += 1
            classes[("lost: " + after.outcome, *_class_of(after)[1:])] += 1
    return list(rows.values()), classes


# Skips that the suite's own TPU CI also takes on every chip, and GPU tests: these tests run
# on no TPU, so they are not counted among the TPU-only tests the CPU could run.
# (the CPU fails the gate; on a TPU the interpret class skips itself)
GATED_INTERPRET_CLASS = "interpret class gated on a TPU generation: skips in JAX's CI too"
RUN_NOWHERE = {
    GATED_INTERPRET_CLASS,
    KEPT_OFF_TPUS,
    GPU_TEST,
    "the test's own parameter skip (skips on the chip too)",
    "the test declines the interpreter (it runs compiled only)",
}


# ... and those a TPU with the libtpu installed here skips as well.
SKIPPED_ON_THE_CHIP = RUN_NOWHERE | {NEWER_LIBTPU}


# Skips another configuration is there to open (another chip, one device): where that
# configuration skipped the test too, its own reason is the one that says why.
_GATES_OPENED = {TPU_GATE, "wants one device: the run simulates several",
                 "Megacore only: the stand-in chip has one TensorCore"}


def merge_configurations(on: list[Result], *others: list[Result]) -> list[Result]:
    """One opted-in result per test from runs of the same tests under several configurations
    (one simulated device and eight, as a TPU CI runs a suite on a single chip and on a
    slice): failed where any run failed it, else passed where any passed it, else the
    first run's skip (a later run's where the first skipped at a gate the later one opened,
    for another chip or one device). A test only some runs hold keeps the outcomes it has."""
    by_id: dict[str, list[Result]] = collections.defaultdict(list)
    for results in (on, *others):
        for result in results:
            by_id[result.test_id].append(result)
    merged = []
    for test_id, results in by_id.items():
        chosen = (next((r for r in results if r.outcome == FAILED), None)
                  or next((r for r in results if r.outcome == PASSED), None)
                  or next((r for r in results
                           if cause(r.outcome, r.reason, r.detail) not in _GATES_OPENED), None)
                  or results[0])
        merged.append(dataclasses.replace(chosen, seconds=sum(r.seconds for r in results)))
    return merged


def split_by_chip(results: list[Result]) -> list[list[Result]]:
    """A run of several chips (``--pallas-chip=v5e,v6e``: each test once per chip, its id
    suffixed ``[v6e]`` or ``[3-v6e]``) as one list of results per chip, the suffix taken off,
    for :func:`merge_configurations`; a test is one chip's copy when its id with another
    chip's suffix is in the run too (a parameter that merely reads as a chip stays)."""
    from pytest_pallas.plugin.chips import chip_of_test_id, test_id_without_chip
    from pytest_pallas.settings import KNOWN_CHIPS

    def parts(test_id: str) -> tuple[str, str] | None:
        chip = chip_of_test_id(test_id, KNOWN_CHIPS)
        return None if chip is None else (test_id_without_chip(test_id, chip), chip)

    chips_of: dict[str, set[str]] = collections.defaultdict(set)
    for result in results:
        if (split := parts(result.test_id)) is not None:
            chips_of[split[0]].add(split[1])
    per_chip: dict[str, list[Result]] = {}
    for result in results:
        split = parts(result.test_id)
        if split is None or len(chips_of[split[0]]) < 2:
            per_chip.setdefault("", []).append(result)
            continue
        per_chip.setdefault(split[1], []).append(dataclasses.replace(result, test_id=split[0]))
    return list(per_chip.values()) or [results]


def _class_of(result: Result) -> tuple[str, str, str]:
    words = cause(result.outcome, result.reason, result.detail)
    test_class = result.test_id.split("::")[-2] if result.test_id.count("::") >= 2 else ""
    if (result.outcome == SKIPPED and words == TPU_GATE
            and "Interpret" in test_class):
        words = GATED_INTERPRET_CLASS
    return (result.outcome, words, normalise(result.reason))


def table(rows: list[FileRow], opted_in: bool = True) -> str:
    if opted_in:
        header = ("file", "ids", "skipped off", "passed off", "run on", "passed on",
                  "failed on", "skipped on", "lost on", "test s off", "test s on")
        total = FileRow("total")
        for row in rows:
            for field in dataclasses.fields(FileRow)[1:]:
                setattr(total, field.name, getattr(total, field.name) + getattr(row, field.name))
        body = [(r.file, r.ids, r.skipped_off, r.passed_off, r.run_on, r.passed_on,
                 r.failed_on, r.skipped_on, r.lost, f"{r.seconds_off:.0f}", f"{r.seconds_on:.0f}")
                for r in [*rows, total]]
    else:
        header = ("file", "ids", "passed", "skipped", "failed", "test s")
        body = [(r.file, r.ids, r.passed_off, r.skipped_off, r.ids - r.passed_off - r.skipped_off,
                 f"{r.seconds_off:.0f}") for r in rows]
    return _markdown(header, body)


def class_table(classes: collections.Counter) -> str:
    body = [(count, outcome, words, f"`{reason}`")
            for (outcome, words, reason), count in sorted(
                classes.items(), key=lambda item: (-item[1], item[0]))]
    return _markdown(("count", "outcome", "cause", "exception or reason (normalised)"), body)


def cause_table(classes: collections.Counter) -> str:
    """The classes summed per cause: one line each."""
    per_cause: collections.Counter = collections.Counter()
    for (outcome, words, _), count in classes.items():
        per_cause[(outcome, words)] += count
    body = [(count, outcome, words) for (outcome, words), count in sorted(
        per_cause.items(), key=lambda item: (-item[1], item[0]))]
    return _markdown(("count", "outcome", "cause"), body)


def slowest(results: list[Result], count: int = 10) -> str:
    body = [(f"{r.seconds:.1f}", r.outcome, r.test_id)
            for r in sorted(results, key=lambda r: -r.seconds)[:count]]
    return _markdown(("seconds", "outcome", "test"), body)


def _markdown(header, body) -> str:
    lines = ["| " + " | ".join(map(str, header)) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |"
              for row in body]
    return "\n".join(lines)


def report(off_path, on_path=None, *more_runs, also_on=()) -> str:
    """The tables of one run (``off_path``, ``on_path``), or of several taken together
    (``more_runs``: further off and on paths, in pairs: the files of one suite measured in
    separate runs). ``also_on``: opted-in runs of the same tests under other configurations,
    taken together with the opted-in run by :func:`merge_configurations`."""
    off = read_junit(off_path)
    on = read_junit(on_path) if on_path else None
    for more_off, more_on in zip(more_runs[::2], more_runs[1::2]):
        off += read_junit(more_off)
        on = (on or []) + read_junit(more_on)
    if on is not None and (also_on or len(split_by_chip(on)) > 1):
        on = merge_configurations(*split_by_chip(on),
                                  *(runs for path in also_on
                                    for runs in split_by_chip(read_junit(path))))
    rows, classes = compare(off, on)
    parts = [table(rows, opted_in=on is not None), "", cause_table(classes), "",
             class_table(classes)]
    if on is not None:
        tpu_only = sum(row.skipped_off for row in rows)
        passed = sum(row.passed_on for row in rows)
        nowhere = sum(count for (outcome, words, _), count in classes.items()
                      if outcome == SKIPPED and words in RUN_NOWHERE)
        if tpu_only:
            parts += ["", f"TPU-only tests passing opted in: {passed} of {tpu_only} "
                          f"({100 * passed / tpu_only:.1f}%)"]
        if nowhere and tpu_only - nowhere > 0:
            parts += [f"... of those that run on some TPU (less {nowhere} that skip on every "
                      f"TPU chip, or are GPU tests): {passed} of {tpu_only - nowhere} "
                      f"({100 * passed / (tpu_only - nowhere):.1f}%)"]
        on_chip = sum(count for (outcome, words, _), count in classes.items()
                      if outcome == SKIPPED and words in SKIPPED_ON_THE_CHIP)
        if on_chip > nowhere and tpu_only - on_chip > 0:
            parts += [f"... of those a TPU with the installed libtpu runs (less {on_chip}): "
                      f"{passed} of {tpu_only - on_chip} "
                      f"({100 * passed / (tpu_only - on_chip):.1f}%)"]
    parts += ["", "slowest opted in:" if on is not None else "slowest:",
              slowest(on if on is not None else off)]
    return "\n".join(parts)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("off", help="JUnit XML of the run with the plugin off")
    parser.add_argument("on", nargs="?", help="JUnit XML of the opted-in run")
    parser.add_argument("more", nargs="*",
                        help="the off and on XML of further runs, in pairs, taken together")
    parser.add_argument("--also-on", nargs="+", default=[], metavar="XML",
                        help="opted-in runs of the same tests under other configurations "
                        "(--pallas-devices=1): a test fails if any run failed it, and passes "
                        "if any run passed it")
    args = parser.parse_args(argv)
    if len(args.more) % 2:
        parser.error("give further runs as pairs: OFF.xml ON.xml")
    if args.also_on and not args.on:
        parser.error("--also-on needs the opted-in run's XML")
    print(report(args.off, args.on, *args.more, also_on=args.also_on))


if __name__ == "__main__":
    main()
