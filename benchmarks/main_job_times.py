"""The main job's wall time as a new user meets it: fresh clones, the README's install, cold
then warm.

    python benchmarks/main_job_times.py --pairs 5            # HEAD of this checkout
    python benchmarks/main_job_times.py --commit 7351b36 --installs . .[tpu]
    python benchmarks/main_job_times.py --installs . --bytecode kept not-kept
    python benchmarks/main_job_times.py --commit b947028 HEAD --installs . --pairs 3

For each install (``.``, the README's; ``.[tpu]``, with libtpu's compile check) the script
clones the commit into a temporary directory, makes a virtual environment there and runs
``pip install -c constraints/ci.txt -e <install>``. Then, pair after pair and install
after install in turn (so that a slow minute of a shared host falls on both), it removes
``.pytest_cache`` and runs ``pytest --pallas-conformance`` twice: cold, then warm. Each
run draws a new random seed, as a user's does.

Around every run, a fixed CPU probe (the same pure-Python loop on each core at once, the
slowest core's seconds) says how fast the machine was just then: on a shared host the same
run's time moves with it. The table gives each run's wall time, the probe before and
after, pytest's last line and the count of ``not exercised`` lines; then the medians.
``--bytecode`` compares how Python's compiled modules are kept: ``kept`` removes
``PYTHONDONTWRITEBYTECODE`` from the runs' environment, ``not-kept`` sets it (as many
container images do), ``as-is`` (the default) leaves the environment alone. pytest rewrites
the asserts of every module of a package that provides a pytest plugin (Hypothesis,
pytest-benchmark, pytest-xdist, this one) and keeps the result beside the source only when
Python may write bytecode; otherwise each process, controller and workers, does it again.
Each (install, bytecode) pair gets a clone of its own, since a module compiled in one is
read in the other. Several ``--commit`` values get a clone each too, their runs alternating
in the same way: a before and an after measured in the same minutes. Each run's CPU
seconds (user and system, pytest's process and its workers) move less with a shared host's
load than its wall time.

Nothing is asserted: the numbers go to docs/main-job.md#time.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROBE = "import time\nt = time.perf_counter()\ns = 0\nfor i in range(6_000_000): s += i * i % 7\n" \
        "print(time.perf_counter() - t)"


def probe() -> float:
    """The seconds of the probe loop on the slowest of this machine's cores, all at once."""
    runs = [subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True)
            for _ in range(os.cpu_count() or 1)]
    return max(float(run.communicate()[0]) for run in runs)


def prepare(commit: str, install: str, where: pathlib.Path) -> pathlib.Path:
    """A fresh clone of ``commit`` with its own environment; the environment's ``bin``."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=where, check=True)
    subprocess.run([sys.executable, "-m", "venv", ".venv"], cwd=where, check=True)
    started = time.perf_counter()
    subprocess.run([str(where / ".venv/bin/pip"), "install", "-q", "-c", "constraints/ci.txt",
                    "-e", install], cwd=where, check=True, stdout=subprocess.DEVNULL)
    print(f"{install}: installed in {time.perf_counter() - started:.0f} s", flush=True)
    return where / ".venv/bin"


BYTECODE = {"as-is": None, "kept": False, "not-kept": True}  # PYTHONDONTWRITEBYTECODE set?


def main_job(clone: pathlib.Path, bin_dir: pathlib.Path, bytecode: str) -> dict:
    """One ``pytest --pallas-conformance`` in ``clone``: wall seconds, last line, misses."""
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": str(bin_dir.parent)}
    env.pop("PYTHONPATH", None)
    if BYTECODE[bytecode] is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if BYTECODE[bytecode]:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
    before = probe()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([str(bin_dir / "pytest"), "--pallas-conformance"], cwd=clone, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime
    lines = done.stdout.strip().splitlines() or [""]
    return {"wall": wall, "cpu": cpu, "probe": (before, probe()), "rc": done.returncode,
            "last": lines[-1].strip("= "),
            "not_exercised": len(re.findall(r"not exercised", done.stdout))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", nargs="+", default=["HEAD"],
                        help="what to clone (default: HEAD); several: a clone each, alternating")
    parser.add_argument("--installs", nargs="+", default=[".", ".[tpu]"],
                        help="pip install targets, one fresh clone each (default: . .[tpu])")
    parser.add_argument("--pairs", type=int, default=3, help="cold/warm pairs per install")
    parser.add_argument("--bytecode", nargs="+", choices=BYTECODE, default=["as-is"],
                        help="PYTHONDONTWRITEBYTECODE removed (kept), set (not-kept) or as "
                             "inherited (as-is, the default); several: a clone each")
    args = parser.parse_args()
    commits = [subprocess.run(["git", "rev-parse", "--short", commit], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
               for commit in args.commit]
    results: dict[tuple[str, str, str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="main-job-times-") as scratch:
        clones = {}
        for commit in commits:
            for install in args.installs:
                for bytecode in args.bytecode:
                    where = pathlib.Path(scratch) / f"clone{len(clones)}"
                    clones[commit, install, bytecode] = (where, prepare(commit, install, where))
        print(f"\n{'commit':8} {'install':10} {'bytecode':8} {'pair':>4} {'run':5} "
              f"{'wall (s)':>8} {'cpu (s)':>7} {'probe (s)':>11} {'not exercised':>13}  pytest")
        for pair in range(1, args.pairs + 1):
            for (commit, install, bytecode), (clone, bin_dir) in clones.items():
                shutil.rmtree(clone / ".pytest_cache", ignore_errors=True)  # cold
                for run in ("cold", "warm"):
                    result = main_job(clone, bin_dir, bytecode)
                    results.setdefault((commit, install, bytecode, run), []).append(result)
                    probes = "/".join(f"{p:.2f}" for p in result["probe"])
                    print(f"{commit:8} {install:10} {bytecode:8} {pair:>4} {run:5} "
                          f"{result['wall']:8.1f} {result['cpu']:7.1f} {probes:>11} "
                          f"{result['not_exercised']:>13}  "
                          f"{result['last']}{'' if result['rc'] == 0 else ' (FAILED)'}",
                          flush=True)
    print(f"\n{'commit':8} {'install':10} {'bytecode':8} {'run':5} {'runs':>4} "
          f"{'median (s)':>10} {'range (s)':>14} {'cpu median (s)':>14} {'range (s)':>14}")
    for (commit, install, bytecode, run), runs in results.items():
        walls, cpus = [r["wall"] for r in runs], [r["cpu"] for r in runs]
        print(f"{commit:8} {install:10} {bytecode:8} {run:5} {len(runs):>4} "
              f"{statistics.median(walls):10.1f} {min(walls):6.1f} to {max(walls):4.1f} "
              f"{statistics.median(cpus):14.1f} {min(cpus):6.1f} to {max(cpus):4.1f}")


if __name__ == "__main__":
    main()
