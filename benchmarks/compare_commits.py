"""The same tests with an earlier commit of pytest-pallas and with the working tree, back to
back: CPU, wall time and every verdict that differs.

    # JAX's TPU tests fetched by peer_suites.py into WORK, a fixed sample of ids
    python benchmarks/compare_commits.py --base 3e2d98c --cwd WORK \\
        --ids benchmarks/data/sample_ids.txt -- -p peer_suite_shim --pallas-interpret=tpu -n 2

Each side runs from a snapshot of its own files (``pytest_pallas``, ``reference_kernels`` and
``conformance``, laid out as installed) put first on ``PYTHONPATH``, in the same environment
(jax, libtpu, pytest), with pytest's cache off so that neither reuses the other's
compilations. CPU is the pytest process's and its children's (pytest-xdist's workers) user and
system time. The verdicts are read from each run's JUnit XML. ``--repeat N`` alternates the
two sides N times and prints the medians. ``--base-from OUT`` takes the base side from an
earlier run's folder, so that a change to the tree is measured without running the base again
(its XML and timings, ``base-N.xml`` and ``base-N.json``). The tests that kept their verdict
are compared by their JUnit time too: a test that fails at once on one side and runs on the
other would skew the run's CPU. ``--warm`` measures both sides as a CI that keeps
``.pytest_cache`` between runs sees them: each side first runs once, unmeasured, into a cache
directory of its own (the plugin keeps JAX's compiled executables and the TPU compiler's
verdicts there), and its measured runs reuse it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The repository's folders and where an install puts them (pyproject.toml's package-dir).
INSTALLED = {"pytest_pallas": "pytest_pallas",
             "reference_kernels": "pytest_pallas/reference_kernels",
             "conformance": "pytest_pallas/conformance"}


def snapshot(commit: str | None, into: pathlib.Path) -> pathlib.Path:
    """The package as installed from ``commit`` (None: the working tree), under ``into``."""
    source = into / "source"
    if commit is None:
        for folder in INSTALLED:
            shutil.copytree(ROOT / folder, source / folder,
                            ignore=shutil.ignore_patterns("__pycache__"))
    else:
        source.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, *INSTALLED],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    package = into / "site"
    for folder, installed in INSTALLED.items():
        shutil.copytree(source / folder, package / installed, dirs_exist_ok=True)
    for data in (ROOT / "pytest_pallas").rglob("*.json"):  # package data the code reads
        target = package / data.relative_to(ROOT)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(data, target)
    return package


def test_seconds(junit: pathlib.Path) -> dict[str, float]:
    """Test id -> the seconds JUnit XML gives it (setup, call and teardown, wall time)."""
    if not junit.exists():
        return {}
    return {f"{case.get('classname')}::{case.get('name')}": float(case.get("time") or 0)
            for case in ElementTree.parse(junit).getroot().iter("testcase")}


def verdicts(junit: pathlib.Path) -> dict[str, str]:
    """Test id -> passed, failed, error or skipped (with the skip's first line)."""
    found = {}
    if not junit.exists():
        return found
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = child.tag if child.tag == "error" else "failed"
            elif child.tag == "skipped":
                outcome = "skipped: " + (child.get("message") or "").splitlines()[0][:120]
        found[name] = outcome
    return found


def run_side(label: str, package: pathlib.Path, cwd: pathlib.Path, ids: list[str],
             pytest_args: list[str], out: pathlib.Path,
             cache: pathlib.Path | None = None) -> tuple[float, float, dict[str, str]]:
    """One measured pytest run of a side; ``cache``: its pytest cache directory (None: off)."""
    junit = out / f"{label}.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(package), str(cwd), os.environ.get("PYTHONPATH", "")]))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cache_args = ["-o", f"cache_dir={cache}"] if cache else ["-p", "no:cacheprovider"]
    command = [sys.executable, "-m", "pytest", *ids, *pytest_args, "-q", *cache_args,
               f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(out / f"{label}.log", "w") as log:
        subprocess.run(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    (out / f"{label}.json").write_text(json.dumps({"cpu": cpu, "wall": wall,
                                                   "warm": cache is not None}))
    return cpu, wall, verdicts(junit)


def earlier_side(out: pathlib.Path, label: str,
                 warm: bool) -> tuple[float, float, dict[str, str]]:
    """A side as an earlier run of this script left it in ``out`` (its XML and timings)."""
    timings = json.loads((out / f"{label}.json").read_text())
    earlier_warm = timings.get("warm", False)
    if earlier_warm != warm:
        raise SystemExit(f"{out / label}.json was measured {'warm' if earlier_warm else 'cold'}: "
                         f"run with{'' if earlier_warm else 'out'} --warm to compare like with "
                         "like, or measure the base again (no --base-from)")
    return timings["cpu"], timings["wall"], verdicts(out / f"{label}.xml")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--cwd", type=pathlib.Path, default=pathlib.Path.cwd(),
                        help="where the tests run (a peer suite's work folder)")
    parser.add_argument("--ids", type=pathlib.Path,
                        help="a file of test ids, one per line (# comments allowed)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--out", type=pathlib.Path, help="where the logs and XML go")
    parser.add_argument("--base-from", type=pathlib.Path, metavar="OUT",
                        help="take the base side from an earlier run's folder (its base-N.xml "
                        "and base-N.json) instead of running it again")
    parser.add_argument("--warm", action="store_true",
                        help="measure each side with a pytest cache its own first run filled")
    parser.add_argument("pytest_args", nargs="*", help="pytest's arguments (after --)")
    args = parser.parse_args(argv)
    ids = []
    if args.ids:
        ids = [line.split("#")[0].strip() for line in args.ids.read_text().splitlines()]
        ids = [test_id for test_id in ids if test_id]
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="compare-"))
    out.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base],
                          capture_output=True, text=True, check=True).stdout.strip()
    sides = {f"base {head}": snapshot(args.base, out / "base"),
             "working tree": snapshot(None, out / "tree")}
    results: dict[str, list[tuple[float, float, dict[str, str]]]] = {name: [] for name in sides}
    caches = {name: None for name in sides}
    if args.base_from:  # like with like, said before anything runs
        earlier_side(args.base_from, "base-0", args.warm)
    if args.warm:
        for index, (name, package) in enumerate(sides.items()):
            if index == 0 and args.base_from:
                continue
            side = "base" if index == 0 else "tree"
            caches[name] = out / f"cache-{side}"
            cpu, wall, _ = run_side(f"{side}-fill", package, args.cwd, ids, args.pytest_args,
                                    out, caches[name])
            print(f"{name}, filling its cache: {cpu:.0f} s CPU, {wall:.0f} s wall", flush=True)
    for round_index in range(args.repeat):
        for index, (name, package) in enumerate(sides.items()):
            label = f"{'base' if index == 0 else 'tree'}-{round_index}"
            if index == 0 and args.base_from:
                cpu, wall, found = earlier_side(args.base_from, label, args.warm)
            else:
                cpu, wall, found = run_side(label, package, args.cwd, ids, args.pytest_args, out,
                                            caches[name])
            results[name].append((cpu, wall, found))
            print(f"{name}, round {round_index + 1}: {cpu:.0f} s CPU, {wall:.0f} s wall, "
                  f"{len(found)} tests", flush=True)
    state = "warm (each side's own cache, filled by a first run)" if args.warm else "cold"
    print(f"\n{len(ids) or 'the'} test ids, {args.repeat} round(s), {state}, medians; "
          f"logs in {out}\n")
    print("| | CPU s | wall s | passed | failed | skipped |")
    print("|---|---|---|---|---|---|")
    medians = {}
    for name, runs in results.items():
        cpu = statistics.median(run[0] for run in runs)
        wall = statistics.median(run[1] for run in runs)
        found = runs[-1][2]
        counts = [sum(1 for v in found.values() if v.startswith(kind))
                  for kind in ("passed", "failed", "skipped")]
        medians[name] = cpu, wall
        print(f"| {name} | {cpu:.0f} | {wall:.0f} | " + " | ".join(map(str, counts)) + " |")
    (base_cpu, base_wall), (tree_cpu, tree_wall) = medians.values()
    print(f"\nworking tree / base: CPU {tree_cpu / base_cpu:.2f}x, "
          f"wall {tree_wall / base_wall:.2f}x")
    base_found, tree_found = (runs[-1][2] for runs in results.values())
    differ = sorted(test_id for test_id in set(base_found) | set(tree_found)
                    if base_found.get(test_id) != tree_found.get(test_id))
    # The tests whose verdict is the same on both sides, by their JUnit time: a test that
    # failed at once on one side and ran on the other would skew the whole run's CPU.
    base_xml = (args.base_from or out) / f"base-{args.repeat - 1}.xml"
    base_seconds = test_seconds(base_xml)
    tree_seconds = test_seconds(out / f"tree-{args.repeat - 1}.xml")
    same = [test_id for test_id in base_found if test_id not in differ
            and test_id in tree_seconds and not base_found[test_id].startswith("skipped")]
    if same:
        before = sum(base_seconds.get(test_id, 0) for test_id in same)
        now = sum(tree_seconds[test_id] for test_id in same)
        print(f"\nthe {len(same)} tests that ran with the same verdict, JUnit seconds: "
              f"base {before:.0f}, tree {now:.0f}, {now / max(before, 1e-9):.2f}x")
    print(f"\nverdicts that differ: {len(differ)}")
    for test_id in differ:
        print(f"  {test_id}: {base_found.get(test_id, 'absent')} -> "
              f"{tree_found.get(test_id, 'absent')}")


if __name__ == "__main__":
    main()
