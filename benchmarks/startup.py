"""What installing pytest-pallas costs a test suite that does not use it.

pytest loads the plugin in every run of an environment where it is installed,
so its import must stay cheap (no JAX). This script times, in fresh processes,
``pytest --version`` and a run of one trivial test file, with the plugin and
with ``-p no:pallas``, and prints the median wall time and the median CPU time
(user + system of the pytest process) of each, and their ratios. The goal is a
CPU ratio of at most 1.02; CPU time is what a loaded machine distorts least.

    python benchmarks/startup.py            # 10 runs of each
    python benchmarks/startup.py --runs 30
    python benchmarks/startup.py --fail-above 1.1   # exit 1 past that CPU ratio (for CI)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIVIAL_TEST = '''
def test_arithmetic():
    assert 1 + 1 == 2


def test_strings():
    assert "pallas".upper() == "PALLAS"
'''

CASES = (
    ("pytest --version", ["--version"]),
    ("pytest test_trivial.py", ["-q", "-p", "no:cacheprovider", "test_trivial.py"]),
)
WITHOUT = ["-p", "no:pallas"]


def time_once(python: str, args: list[str], directory: Path, environ: dict[str, str]
              ) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one pytest process."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    completed = subprocess.run([python, "-m", "pytest", *args], cwd=directory, env=environ,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               check=False)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
    if completed.returncode != 0:
        raise SystemExit(f"`pytest {' '.join(args)}` failed ({completed.returncode}):\n"
                         f"{completed.stdout}")
    return elapsed, cpu


def measure(python: str, runs: int) -> list[tuple[str, float, float, float, float]]:
    """Per command: median wall and CPU seconds with the plugin, then with -p no:pallas."""
    # Without PYTHONDONTWRITEBYTECODE: a user's Python keeps compiled modules (the warm-up
    # run below writes them), and compiling the plugin's sources in every run would charge
    # it for a setting of the measuring machine (4 ms for plugin/session.py alone).
    environ = {name: value for name, value in os.environ.items()
               if not name.startswith(("PYTEST_", "JAX_", "XLA_"))
               and name != "PYTHONDONTWRITEBYTECODE"}
    rows = []
    with tempfile.TemporaryDirectory(prefix="pallas-startup-") as name:
        directory = Path(name)
        # An ini file of its own, so that no project configuration up the tree applies.
        (directory / "pytest.ini").write_text("[pytest]\n")
        (directory / "test_trivial.py").write_text(TRIVIAL_TEST)
        for label, args in CASES:
            with_plugin, without_plugin = [], []
            for args_of in (args, WITHOUT + args):  # warm the file system caches
                time_once(python, args_of, directory, environ)
            for _ in range(runs):
                # Interleaved, so that drift in the machine's load hits both alike.
                with_plugin.append(time_once(python, args, directory, environ))
                without_plugin.append(time_once(python, WITHOUT + args, directory, environ))
            rows.append((label,
                         statistics.median(wall for wall, _ in with_plugin),
                         statistics.median(cpu for _, cpu in with_plugin),
                         statistics.median(wall for wall, _ in without_plugin),
                         statistics.median(cpu for _, cpu in without_plugin)))
    return rows


def format_table(rows: list[tuple[str, float, float, float, float]], runs: int) -> str:
    header = ("command", "wall with", "wall without", "ratio", "CPU with", "CPU without",
              "ratio")
    width = max(len(header[0]), *(len(row[0]) for row in rows))
    lines = [f"medians of {runs} runs each (fresh processes; with the plugin, and with "
             "-p no:pallas; CPU: user + system)",
             f"{header[0]:<{width}}  {header[1]:>10}  {header[2]:>12}  {header[3]:>5}  "
             f"{header[4]:>9}  {header[5]:>11}  {header[6]:>5}"]
    for label, wall, cpu, wall_without, cpu_without in rows:
        lines.append(f"{label:<{width}}  {wall:>8.3f} s  {wall_without:>10.3f} s  "
                     f"{wall / wall_without:>5.2f}  {cpu:>7.3f} s  {cpu_without:>9.3f} s  "
                     f"{cpu / cpu_without:>5.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each command (default 10)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose pytest is timed (default: this one)")
    parser.add_argument("--fail-above", type=float, default=None, metavar="RATIO",
                        help="exit with status 1 when a CPU ratio exceeds RATIO")
    options = parser.parse_args(argv)
    if options.runs < 1:
        parser.error("--runs must be at least 1")
    rows = measure(options.python, options.runs)
    print(format_table(rows, options.runs))
    worst = max(cpu / cpu_without for _, _, cpu, _, cpu_without in rows)
    if options.fail_above is not None and worst > options.fail_above:
        print(f"CPU ratio {worst:.3f} is above {options.fail_above}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
