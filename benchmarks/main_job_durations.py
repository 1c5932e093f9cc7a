"""Per-op seconds of main-job runs, from their ``--durations=0`` output, side by side.

    rm -rf .pytest_cache
    /usr/bin/time -v pytest --pallas-conformance --durations=0 > cold.log 2>&1
    /usr/bin/time -v pytest --pallas-conformance --durations=0 > warm.log 2>&1
    python benchmarks/main_job_durations.py cold.log warm.log

With ``--typical``, the seconds of each packaged conformance test of one run in one
process (``-p no:xdist``) are written to the plugin's ``typical_seconds.json``: the order
in which a run that has timed nothing yet hands the tests to pytest-xdist's workers::

    pytest --pallas-conformance --pallas-seed=0 -p no:xdist --durations=0 > one.log
    python benchmarks/main_job_durations.py --typical one.log

Each column is one run: the seconds of each op's tests (setup, call and teardown, as
pytest reports them; under pytest-xdist they add up the workers' time, not the wall),
then the run's wall and, when /usr/bin/time -v wrapped it, its user CPU and peak memory.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re

_DURATION = re.compile(r"^([\d.]+)s (?:setup|call|teardown)\s+\S+::(\w+)\[(\w+)\]")
_TIME_FIELDS = {
    "wall (s)": re.compile(r"Elapsed \(wall clock\) time .*: (?:(\d+):)?(\d+):([\d.]+)"),
    "user CPU (s)": re.compile(r"User time \(seconds\): ([\d.]+)"),
    "peak memory (MB)": re.compile(r"Maximum resident set size \(kbytes\): (\d+)"),
}


def _durations(text: str):
    """(test function, op name, seconds) of each ``--durations`` line of a conformance test:
    its setup, call or teardown."""
    for line in text.splitlines():
        match = _DURATION.match(line.strip())
        if match:
            yield match.group(2), match.group(3), float(match.group(1))


def per_op(text: str) -> dict[str, float]:
    seconds: dict[str, float] = collections.defaultdict(float)
    for _, op_name, value in _durations(text):
        seconds[op_name] += value
    return dict(seconds)


def per_test(text: str) -> dict[str, float]:
    """Seconds per conformance test (``test_value[matmul]``): setup, call and teardown."""
    seconds: dict[str, float] = collections.defaultdict(float)
    for test, op_name, value in _durations(text):
        seconds[f"{test}[{op_name}]"] += value
    return dict(seconds)


def write_typical(log: pathlib.Path) -> None:
    from pytest_pallas.plugin.conformance_order import TYPICAL_SECONDS_FILE

    text = log.read_text()
    seconds = per_test(text)
    if not seconds:
        raise SystemExit(f"{log}: no conformance test durations; run with --durations=0")
    table = {"about": "Seconds of each packaged conformance test in one process of the main "
                      "job (pytest --pallas-conformance --pallas-seed=0 -p no:xdist), written "
                      "by benchmarks/main_job_durations.py --typical: the order a run that "
                      "has timed nothing yet hands the tests to pytest-xdist's workers.",
             "seconds": {name: round(value, 2) for name, value in sorted(seconds.items())}}
    TYPICAL_SECONDS_FILE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(seconds)} tests, {sum(seconds.values()):.1f} s: {TYPICAL_SECONDS_FILE}")


def run_facts(text: str) -> dict[str, float]:
    facts = {}
    for name, pattern in _TIME_FIELDS.items():
        match = pattern.search(text)
        if not match:
            continue
        if name == "wall (s)":
            hours, minutes, seconds = match.groups()
            facts[name] = int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)
        elif name == "peak memory (MB)":
            facts[name] = int(match.group(1)) / 1024
        else:
            facts[name] = float(match.group(1))
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=pathlib.Path,
                        help="the output of `pytest --pallas-conformance --durations=0` runs")
    parser.add_argument("--typical", action="store_true",
                        help="write the plugin's typical_seconds.json from one -p no:xdist run")
    args = parser.parse_args()
    if args.typical:
        write_typical(args.logs[0])
        return
    texts = [log.read_text() for log in args.logs]
    ops = [per_op(text) for text in texts]
    names = sorted({op for run in ops for op in run}, key=lambda op: -ops[0].get(op, 0.0))
    print("| op | " + " | ".join(log.stem for log in args.logs) + " |")
    print("|---|" + "---|" * len(args.logs))
    for name in names:
        print(f"| `{name}` | " + " | ".join(f"{run.get(name, 0.0):.1f}" for run in ops) + " |")
    print("| all ops (s) | " + " | ".join(f"{sum(run.values()):.1f}" for run in ops) + " |")
    facts = [run_facts(text) for text in texts]
    for field in _TIME_FIELDS:
        if any(field in run for run in facts):
            print(f"| {field} | " + " | ".join(
                f"{run[field]:.1f}" if field in run else "-" for run in facts) + " |")


if __name__ == "__main__":
    main()
