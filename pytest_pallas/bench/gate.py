"""A regression gate that holds on noisy shared CI: each kernel judged by its time
relative to XLA's.

    python -m pytest_pallas.benchmark_gate --baseline BASE.json [MORE.json ...] \\
        --current CURRENT.json [--max-slowdown 1.5] [--statistic both|min|median] \\
        [--fail-on-missing]

Both files are pytest-benchmark JSON (``--benchmark-json=PATH``, or what
``--benchmark-autosave``/``--benchmark-save`` write under ``.benchmarks/``) of
benchmarks run through ``pallas_benchmark``, which times the plain XLA version
of each op in the same rounds as the kernel. For each benchmark of both files
(matched by its pytest node id)::

    ratio  = kernel time / XLA time, both from the same run
    change = current ratio / baseline ratio

Each round of ``pallas_benchmark`` times the XLA version just before the
kernel, and it records two ratios: ``kernel_over_xla_min``, the fastest kernel
round over the fastest XLA round (the rounds least disturbed by a busy
machine's other work), and ``kernel_over_xla``, the median over rounds of the
kernel's time over its round's XLA time. ``--statistic min`` or ``median``
judges by one; ``both`` (the default) by the smaller of the two changes, so a
regression must show in the fastest rounds and in the typical one: a single
lucky or unlucky round cannot raise an alarm, and a kernel that really got
slower is slower in both (docs/evidence/regression-gate.md has the measurements).

A slower or busier machine slows the kernel and XLA alike and leaves the ratio
nearly alone, so the baseline may come from another runner. (Nearly: on the CPU
the interpreted kernel is Python and XLA's version native code, which a busy
neighbour slows somewhat differently; docs/evidence/regression-gate.md has the spread.)
Given several baseline files, the baseline ratio is the median of theirs. ``change > max_slowdown``
is a regression; ``change < 1 / max_slowdown`` an improvement (reported, never
failing). A benchmark whose shapes, dtypes, backend or chip changed is not
compared; one without an XLA time (``xla_fn=None``) cannot be.

pytest-benchmark's own ``--benchmark-compare``/``--benchmark-compare-fail``
compare absolute times, which is right on a dedicated machine and raises false
alarms on shared runners; this gate is for the latter.

Where the runs had libtpu, each benchmark also carries the TPU compiler's
estimate per chip (``extra_info["tpu_estimate"]``); ``bench.estimate_gate`` judges
those without noise when the jax and libtpu versions match (``--max-estimate-change``).

Exit status: 0 no regression, 1 a regression (or, with ``--fail-on-missing``, a
baseline benchmark absent from the current run), 2 unusable input (unreadable
file, no benchmark with an XLA time in common).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from . import estimate_gate

DEFAULT_MAX_SLOWDOWN = 1.5
DEFAULT_STATISTIC = "both"

# What must match for two runs' ratios to be compared.
_SAME = ("shapes", "dtypes", "backend", "chip")


# The ratios pallas_benchmark records (extra_info key), and what --statistic accepts.
RATIOS = {"min": "kernel_over_xla_min", "median": "kernel_over_xla"}
STATISTICS = ("both", *RATIOS)


@dataclasses.dataclass(frozen=True)
class Result:
    """One benchmark of a pytest-benchmark JSON file.

    ``ratios`` holds the kernel's time over XLA's (above 1: slower than XLA):
    ``min``, fastest kernel round over fastest XLA round; ``median``, the median
    over rounds of the kernel's time over the XLA time measured just before it
    (older files without it: the ratio of the medians). None: no XLA time.
    """

    name: str
    median: float
    xla_median: float | None
    identity: tuple[Any, ...]
    ratios: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def ratio(self, statistic: str = "min") -> float | None:
        return self.ratios.get(statistic)


@dataclasses.dataclass(frozen=True)
class Verdict:
    name: str
    status: str  # ok, regressed, improved, new, missing, incomparable, no XLA time
    baseline_ratio: float | None = None
    current_ratio: float | None = None
    note: str = ""

    @property
    def change(self) -> float | None:
        if self.baseline_ratio is None or self.current_ratio is None:
            return None
        return self.current_ratio / self.baseline_ratio


class GateInputError(Exception):
    """A file the gate cannot use; the message is one line."""


def load_results(path: str) -> dict[str, Result]:
    """The benchmarks of a pytest-benchmark JSON file, by node id."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except OSError as error:
        raise GateInputError(f"cannot read {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise GateInputError(f"{path} is not JSON: {error}") from None
    benchmarks = document.get("benchmarks") if isinstance(document, dict) else None
    if not isinstance(benchmarks, list):
        raise GateInputError(
            f"{path} is not a pytest-benchmark JSON file (no 'benchmarks' list); write one with "
            "--benchmark-json=PATH or --benchmark-autosave."
        )
    if (document.get("pallas") or {}).get("complete") is False:
        raise GateInputError(
            f"{path} is from an interrupted run ({len(benchmarks)} benchmarks, maybe not all); "
            "run the benchmarks to the end and use that file."
        )
    results = {}
    for entry in benchmarks:
        name = entry.get("fullname") or entry.get("name")
        info = entry.get("extra_info") or {}
        identity = tuple(json.dumps(info.get(key), sort_keys=True) for key in _SAME)
        median = float(entry["stats"]["median"])
        xla_median = info.get("xla_median")
        ratios = {statistic: info.get(key) for statistic, key in RATIOS.items()}
        if ratios["median"] is None and xla_median:
            ratios["median"] = median / xla_median
        results[name] = Result(name=name, median=median, xla_median=xla_median,
                               identity=identity, ratios=ratios)
    return results


def combine_baselines(runs: list[dict[str, Result]]) -> dict[str, Result]:
    """Several baseline runs as one: per benchmark, the median of their ratios.

    A single run can be an outlier on a shared machine; the median of a few
    (the last runs of the main branch, say) is a steadier reference. Runs whose
    shapes, dtypes, backend or chip differ from the last run's are left out.
    """
    if len(runs) == 1:
        return runs[0]
    combined = {}
    for name, last in runs[-1].items():
        same = [run[name] for run in runs if name in run and run[name].identity == last.identity]
        xla = [result.xla_median for result in same if result.xla_median]
        ratios = {}
        for statistic in RATIOS:
            values = [r.ratio(statistic) for r in same if r.ratio(statistic)]
            ratios[statistic] = statistics.median(values) if values else None
        combined[name] = Result(
            name=name, median=statistics.median(result.median for result in same),
            xla_median=statistics.median(xla) if xla else None, identity=last.identity,
            ratios=ratios)
    return combined


def _compared(before: Result, now: Result, statistic: str) -> tuple[float, float] | None:
    """(baseline ratio, current ratio) by ``statistic``; for ``both``, the pair whose
    change is smaller: a regression must show in the fastest rounds and in the median."""
    names = RATIOS if statistic == "both" else (statistic,)
    pairs = [(before.ratio(name), now.ratio(name)) for name in names]
    pairs = [(old, new) for old, new in pairs if old and new]
    return min(pairs, key=lambda pair: pair[1] / pair[0]) if pairs else None


def judge(baseline: dict[str, Result], current: dict[str, Result],
          max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
          statistic: str = DEFAULT_STATISTIC) -> list[Verdict]:
    """A verdict for every benchmark of either run, in the current run's order."""
    verdicts = []
    for name, now in current.items():
        before = baseline.get(name)
        if before is None:
            verdicts.append(Verdict(name, "new", current_ratio=now.ratio()))
            continue
        if before.identity != now.identity:
            changed = [key for key, old, new in zip(_SAME, before.identity, now.identity)
                       if old != new]
            verdicts.append(Verdict(name, "incomparable", before.ratio(), now.ratio(),
                                    note=f"{', '.join(changed)} changed"))
            continue
        pair = _compared(before, now, statistic)
        if pair is None:
            verdicts.append(Verdict(name, "no XLA time", note="benchmarked with xla_fn=None"))
            continue
        change = pair[1] / pair[0]
        status = ("regressed" if change > max_slowdown
                  else "improved" if change < 1 / max_slowdown else "ok")
        verdicts.append(Verdict(name, status, *pair))
    verdicts += [Verdict(name, "missing", before.ratio()) for name, before in baseline.items()
                 if name not in current]
    return verdicts


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x XLA"


def report_lines(verdicts: list[Verdict], max_slowdown: float) -> list[str]:
    """The table the command prints, and one closing line."""
    header = ("benchmark", "baseline", "current", "change", "verdict")
    rows = [(
        verdict.name,
        _ratio(verdict.baseline_ratio),
        _ratio(verdict.current_ratio),
        "-" if verdict.change is None else f"{verdict.change:.2f}x",
        verdict.status.upper() if verdict.status == "regressed" else verdict.status,
        verdict.note,
    ) for verdict in verdicts]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             + (f"  ({row[5]})" if len(row) > 5 and row[5] else "") for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    counts = {status: sum(v.status == status for v in verdicts)
              for status in ("regressed", "improved", "ok")}
    compared = sum(counts.values())
    lines.append(
        f"benchmark gate: {counts['regressed']} regressed, {counts['improved']} improved, "
        f"{counts['ok']} ok of {compared} compared (a regression: kernel/XLA ratio more than "
        f"{max_slowdown:g}x the baseline's)"
    )
    return lines


def exit_status(verdicts: list[Verdict], *, fail_on_missing: bool = False) -> int:
    if any(v.status == "regressed" for v in verdicts):
        return 1
    if fail_on_missing and any(v.status == "missing" for v in verdicts):
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_pallas.benchmark_gate",
        description="Fail when a Pallas kernel got slower relative to the XLA version timed "
        "in the same run (pytest-benchmark JSON from pallas_benchmark).",
    )
    parser.add_argument("--baseline", required=True, nargs="+", metavar="JSON",
                        help="pytest-benchmark JSON of the reference run; several: the median "
                        "of their ratios")
    parser.add_argument("--current", required=True, metavar="JSON",
                        help="pytest-benchmark JSON of the run to judge")
    parser.add_argument("--max-slowdown", type=float, default=DEFAULT_MAX_SLOWDOWN,
                        metavar="FACTOR",
                        help="largest allowed growth of kernel/XLA "
                             f"(default {DEFAULT_MAX_SLOWDOWN})")
    parser.add_argument("--statistic", choices=STATISTICS, default=DEFAULT_STATISTIC,
                        help="min: fastest kernel round / fastest XLA round; median: median "
                        "over rounds of kernel time / XLA time of the same round; both: a "
                        f"regression must show in both (default {DEFAULT_STATISTIC})")
    parser.add_argument("--fail-on-missing", action="store_true",
                        help="also fail when a baseline benchmark is absent from the current run")
    parser.add_argument("--max-estimate-change", type=float,
                        default=estimate_gate.DEFAULT_MAX_CHANGE, metavar="FACTOR",
                        help="largest allowed growth of a TPU-compiler estimate metric (seconds, "
                        "cycles, HBM bytes, spills), judged when jax and libtpu match "
                        f"(default {estimate_gate.DEFAULT_MAX_CHANGE})")
    options = parser.parse_args(argv)
    if options.max_slowdown <= 1:
        parser.error(f"--max-slowdown must be above 1, got {options.max_slowdown:g}")
    try:
        baseline = combine_baselines([load_results(path) for path in options.baseline])
        current = load_results(options.current)
    except GateInputError as error:
        print(f"benchmark gate: {error}", file=sys.stderr)
        return 2
    verdicts = judge(baseline, current, options.max_slowdown, options.statistic)
    for line in report_lines(verdicts, options.max_slowdown):
        print(line)
    # The TPU compiler's estimates (deterministic): the newest baseline file's against these.
    regressions, compared, notes = estimate_gate.judge_estimates(
        estimate_gate.estimates_of(options.baseline[-1]),
        estimate_gate.estimates_of(options.current), options.max_estimate_change)
    for line in estimate_gate.report(regressions, compared, notes, options.max_estimate_change):
        print(line)
    if regressions:
        return 1
    if not compared and not notes and not any(
            v.status in ("ok", "regressed", "improved") for v in verdicts):
        print("benchmark gate: no benchmark with an XLA time is in both files; nothing was "
              "judged (were both runs made with pallas_benchmark, on the same sizes?)",
              file=sys.stderr)
        return 2
    return exit_status(verdicts, fail_on_missing=options.fail_on_missing)


if __name__ == "__main__":
    sys.exit(main())
