"""Does the ratio gate hold on a noisy machine? Ten unchanged reruns, then an injected 2x slowdown.

    python benchmarks/regression_study.py [--reruns 10] [--slow-op softmax] [--factor 2]
        [--max-slowdown 1.5] [-k reference] [--out DIR] [--analyze-only] [-- PYTEST ARGS]

1. A baseline run of the selected benchmarks (``pytest benchmarks --benchmark-only
   --benchmark-json=...``; by default the contract ops' reference kernels).
2. ``--reruns`` runs of the same, unchanged code: every verdict should be "ok".
3. One run with ``--bench-slowdown OP=FACTOR``: OP's kernel runs FACTOR times per
   call; the gate should call OP "regressed" and nothing else.

Each run is judged against the baseline by ``pytest_pallas.bench.gate``, with
each of its statistics, and, for contrast, by an absolute comparison of medians
as pytest-benchmark's ``--benchmark-compare-fail=median:P%`` makes it, with the
same threshold. Prints one row per benchmark and a summary per statistic; the
JSON files stay in ``--out`` (``--analyze-only`` judges them again).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

from pytest_pallas.bench.gate import DEFAULT_STATISTIC, STATISTICS, judge, load_results

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCHMARKS)


def run_benchmarks(path: str, selection: str, extra: list[str]) -> float:
    command = [sys.executable, "-m", "pytest", BENCHMARKS, "--benchmark-only", "-q",
               "-p", "no:cacheprovider", "--pallas-seed=0", f"--benchmark-json={path}",
               *(["-k", selection] if selection else []), *extra]
    started = time.time()
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        sys.exit(f"benchmark run failed ({' '.join(command)}):\n{completed.stdout[-3000:]}"
                 f"\n{completed.stderr[-2000:]}")
    return time.time() - started


def slowed_benchmarks(path: str, op: str) -> set[str]:
    """The benchmarks whose kernel --bench-slowdown slowed: the op's reference kernel."""
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    return {entry["fullname"] for entry in document["benchmarks"]
            if entry["extra_info"].get("operation") == op
            and entry["extra_info"].get("implementation") == "reference"}


def verdict_of(baseline, current, name, limit, statistic):
    return next(v for v in judge(baseline, current, limit, statistic) if v.name == name)


def analyze(out: str, slow_op: str, factor: int, limit: float) -> dict:
    rerun_paths = sorted(glob.glob(os.path.join(out, "rerun*.json")))
    slowed_path = os.path.join(out, f"slowdown_{slow_op}_x{factor}.json")
    target = slowed_benchmarks(slowed_path, slow_op)
    summary = {"reruns": len(rerun_paths), "max_slowdown": limit, "statistics": {}}
    baseline = load_results(os.path.join(out, "baseline.json"))
    reruns = [load_results(path) for path in rerun_paths]
    slowed = load_results(slowed_path)
    for statistic in STATISTICS:
        rows = []
        for name, base in baseline.items():
            changes = [verdict_of(baseline, run, name, limit, statistic).change
                       for run in reruns]
            absolute = [run[name].median / base.median for run in reruns]
            injected = verdict_of(baseline, slowed, name, limit, statistic)
            rows.append({
                "benchmark": name.split("::")[-1], "slowed": name in target,
                "kernel_median_ms": base.median * 1e3,
                "xla_median_ms": (base.xla_median or 0) * 1e3,
                "ratio_min": base.ratio("min"), "ratio_median": base.ratio("median"),
                "rerun_changes": changes,
                "rerun_alarms": sum(change > limit for change in changes),
                "rerun_absolute_changes": absolute,
                "rerun_absolute_alarms": sum(a > limit for a in absolute),
                "injected_change": injected.change, "injected_verdict": injected.status,
                "injected_absolute_change": slowed[name].median / base.median,
            })
        print_table(statistic, rows, slow_op, factor, limit, len(reruns))
        summary["statistics"][statistic] = rows
    return summary


def print_table(statistic, rows, slow_op, factor, limit, reruns) -> None:
    print(f"\n== gate --statistic {statistic} --max-slowdown {limit:g} ==")
    header = (f"{'benchmark':30} {'kernel':>9} {'XLA':>9} {'ratio':>7} | "
              f"{'reruns: change':>15} {'alarms':>6} | {'absolute':>12} {'alarms':>6} | "
              f"{f'x{factor} {slow_op}':>14} {'verdict':9} {'absolute':>8}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['benchmark'][:30]:30} {r['kernel_median_ms']:7.2f}ms "
              f"{r['xla_median_ms']:7.3f}ms {r['ratio_min']:7.1f} | "
              f"{min(r['rerun_changes']):6.2f}..{max(r['rerun_changes']):<5.2f}  "
              f"{r['rerun_alarms']:>6} | "
              f"{min(r['rerun_absolute_changes']):5.2f}..{max(r['rerun_absolute_changes']):<5.2f} "
              f"{r['rerun_absolute_alarms']:>6} | {r['injected_change']:13.2f}x "
              f"{r['injected_verdict']:9} {r['injected_absolute_change']:7.2f}x")
    changes = [c for r in rows for c in r["rerun_changes"]]
    absolute = [c for r in rows for c in r["rerun_absolute_changes"]]
    target = [r for r in rows if r["slowed"]]
    others = [r for r in rows if not r["slowed"] and r["injected_verdict"] == "regressed"]
    caught = bool(target) and all(r["injected_verdict"] == "regressed" for r in target)
    print(f"unchanged: {reruns} reruns x {len(rows)} benchmarks = {len(changes)} verdicts; "
          f"ratio gate: {sum(c > limit for c in changes)} alarms (change "
          f"{min(changes):.2f}..{max(changes):.2f}); absolute medians "
          f"(--benchmark-compare-fail=median:{(limit - 1) * 100:.0f}%): "
          f"{sum(a > limit for a in absolute)} alarms (change {min(absolute):.2f}.."
          f"{max(absolute):.2f})")
    print(f"injected {factor}x slowdown of {slow_op}: "
          + ", ".join(f"{r['benchmark']} {r['injected_change']:.2f}x" for r in target)
          + f" -> {'caught' if caught else 'MISSED'}; other benchmarks flagged: {len(others)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reruns", type=int, default=10)
    parser.add_argument("--slow-op", default="softmax", help="op whose kernel is slowed down")
    parser.add_argument("--factor", type=int, default=2, help="the injected slowdown")
    parser.add_argument("--max-slowdown", type=float, default=1.5)
    parser.add_argument("-k", dest="selection", default="reference",
                        help="pytest -k expression (default: the contract ops' reference kernels)")
    parser.add_argument("--out", default=None, help="directory for the JSON files")
    parser.add_argument("--analyze-only", action="store_true",
                        help="judge the JSON files already in --out again")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    options = parser.parse_args(argv)
    out = options.out or tempfile.mkdtemp(prefix="pallas-regression-study-")
    os.makedirs(out, exist_ok=True)

    if not options.analyze_only:
        print(f"benchmark runs in {out}", file=sys.stderr)
        runs = [("baseline", [])]
        runs += [(f"rerun{i + 1:02d}", []) for i in range(options.reruns)]
        runs += [(f"slowdown_{options.slow_op}_x{options.factor}",
                  [f"--bench-slowdown={options.slow_op}={options.factor}"])]
        for label, extra in runs:
            seconds = run_benchmarks(os.path.join(out, f"{label}.json"), options.selection,
                                     [*options.pytest_args, *extra])
            print(f"  {label}: {seconds:.0f} s", file=sys.stderr, flush=True)
    summary = analyze(out, options.slow_op, options.factor, options.max_slowdown)
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1)
    rows = summary["statistics"][DEFAULT_STATISTIC]
    caught = all(r["injected_verdict"] == "regressed" for r in rows if r["slowed"])
    quiet = not any(r["rerun_alarms"] for r in rows)
    return 0 if caught and quiet else 1


if __name__ == "__main__":
    sys.exit(main())
