"""Each pytest-xdist worker's CPU seconds in the main job: what a host with a free core for
every worker would wait for, measured on a host with fewer.

    python benchmarks/worker_seconds.py -n 16            # cold: an empty cache directory
    python benchmarks/worker_seconds.py -n 16 --warm     # again, on the cache of a first run
    python benchmarks/worker_seconds.py -n 16 --alone    # then each worker's share alone

A run on N workers ends when its busiest worker does. On a host with N free cores each
worker has a core of its own, and its wall time is about its CPU time; on a host with fewer
cores the workers share them, the wall time says little, but each worker's CPU seconds
(``os.times()``: its user and system time, every thread of it) still say how much work it
was handed. So the table gives, per worker: the CPU seconds until its collection was done
(start-up: Python, pytest, Hypothesis, JAX, the suite's modules), each test's CPU seconds
in the order it ran, and the total. The busiest worker's total, plus the controller's
start-up before the workers, is a floor for the wall time on a host with N free cores
(sharing 2 cores inflates CPU time: caches, memory bandwidth). ``--alone`` then runs each
worker's tests again, alone in one process with nothing else running and a cache as cold
as the run's: a worker's wall time without the others in its way, its start-up included.
Nothing is asserted: the numbers go to docs/main-job.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from worker_seconds_probe import DIRECTORY_VARIABLE, ONLY_VARIABLE

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(workers: int, seed: int, cache_dir: pathlib.Path, out: pathlib.Path,
        only: list[str] | None = None) -> tuple[float, str]:
    """One main job on ``workers`` workers (0: one process) with the probe plugin, of the
    tests named ``only`` if given; wall seconds, pytest's last line."""
    env = {**os.environ, DIRECTORY_VARIABLE: str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                       os.environ.get("PYTHONPATH")]))}
    if only:
        env[ONLY_VARIABLE] = "\n".join(only)
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--pallas-conformance", f"--pallas-seed={seed}",
         "-n", str(workers), "-q", "-p", "worker_seconds_probe", "-o", f"cache_dir={cache_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    lines = result.stdout.strip().splitlines()
    return wall, lines[-1] if lines else f"exit {result.returncode}: {result.stderr[-300:]}"


def alone(workers: list[dict], seed: int, scratch: pathlib.Path) -> None:
    """Each worker's tests again, alone in one process, from a cold cache: its wall seconds."""
    print("\n| worker | its tests alone: wall s | CPU s | pytest |\n|---|---|---|---|")
    walls = []
    for number, worker in enumerate(workers):
        out = scratch / f"alone{number}"
        out.mkdir()
        wall, last = run(0, seed, scratch / f"cache-alone{number}", out,
                         only=[name for name, _ in worker["tests"]])
        (record,) = records(out)
        walls.append(wall)
        print(f"| {worker['name']} | {wall:.2f} | {record['cpu']:.2f} | {last} |", flush=True)
    print(f"\nalone, the longest share: {max(walls):.2f} s wall "
          f"(median share {statistics.median(walls):.2f} s)")


def records(out: pathlib.Path) -> list[dict]:
    """What each process of a run wrote (the probe plugin's records)."""
    return [json.loads(path.read_text()) for path in out.glob("*.json")]


def workers_of(processes: list[dict]) -> list[dict]:
    """The workers' records, the busiest last."""
    return sorted((p for p in processes if p["name"] != "controller"), key=lambda p: p["cpu"])


def table(processes: list[dict]) -> None:
    workers = workers_of(processes)
    print("| process | start-up CPU s | tests CPU s | total CPU s | tests (CPU s each, in order) |")
    print("|---|---|---|---|---|")
    for process in [p for p in processes if p["name"] == "controller"] + workers:
        tests = process["tests"]
        print(f"| {process['name']} | {process['collected']:.2f} | "
              f"{sum(s for _, s in tests):.2f} | {process['cpu']:.2f} | "
              + ", ".join(f"{name} {seconds:.2f}" for name, seconds in tests) + " |")
    if workers:
        busiest = workers[-1]
        print(f"\nbusiest worker: {busiest['name']}, {busiest['cpu']:.2f} CPU s; "
              f"all {len(workers)} workers: {sum(p['cpu'] for p in workers):.1f} CPU s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--workers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm", action="store_true",
                        help="run once to fill the cache directory, then measure the second run")
    parser.add_argument("--alone", action="store_true",
                        help="then run each worker's tests alone in one process, cold")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        cache_dir, out = pathlib.Path(scratch, "cache"), pathlib.Path(scratch, "out")
        out.mkdir()
        if args.warm:
            run(args.workers, args.seed, cache_dir, pathlib.Path(scratch))
        wall, last = run(args.workers, args.seed, cache_dir, out)
        print(f"{'warm' if args.warm else 'cold'} main job on {args.workers} workers, "
              f"{os.cpu_count()} cores here, seed {args.seed}: {wall:.1f} s wall ({last})\n")
        processes = records(out)
        table(processes)
        if args.alone:
            alone(workers_of(processes), args.seed, pathlib.Path(scratch))


if __name__ == "__main__":
    main()
