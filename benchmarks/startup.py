"""What installing pytest-pallas costs a test suite that does not use it.

pytest loads the plugin in every run of an environment where it is installed,
so its import must stay cheap (no JAX). This script times, in fresh processes,
``pytest --version`` and a run of one trivial test file, with the plugin and
with ``-p no:pallas``, and prints the median wall time of each and the ratio.
The goal is a ratio of at most 1.1.

    python benchmarks/startup.py            # 10 runs of each
    python benchmarks/startup.py --runs 30
    python benchmarks/startup.py --fail-above 1.1   # exit 1 past that ratio (for CI)
"""

from __future__ import annotations

import argparse
import os
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


def time_once(python: str, args: list[str], directory: Path, environ: dict[str, str]) -> float:
    start = time.perf_counter()
    completed = subprocess.run([python, "-m", "pytest", *args], cwd=directory, env=environ,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               check=False)
    elapsed = time.perf_counter() - start
    if completed.returncode != 0:
        raise SystemExit(f"`pytest {' '.join(args)}` failed ({completed.returncode}):\n"
                         f"{completed.stdout}")
    return elapsed


def measure(python: str, runs: int) -> list[tuple[str, float, float]]:
    environ = {name: value for name, value in os.environ.items()
               if not name.startswith(("PYTEST_", "JAX_", "XLA_"))}
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
            rows.append((label, statistics.median(with_plugin), statistics.median(without_plugin)))
    return rows


def format_table(rows: list[tuple[str, float, float]], runs: int) -> str:
    header = ("command", "with plugin", "-p no:pallas", "ratio")
    width = max(len(header[0]), *(len(label) for label, _, _ in rows))
    lines = [f"median wall time of {runs} runs each (fresh processes)",
             f"{header[0]:<{width}}  {header[1]:>12}  {header[2]:>12}  {header[3]:>6}"]
    for label, with_plugin, without_plugin in rows:
        lines.append(f"{label:<{width}}  {with_plugin:>10.3f} s  {without_plugin:>10.3f} s  "
                     f"{with_plugin / without_plugin:>6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each command (default 10)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose pytest is timed (default: this one)")
    parser.add_argument("--fail-above", type=float, default=None, metavar="RATIO",
                        help="exit with status 1 when a ratio exceeds RATIO")
    options = parser.parse_args(argv)
    if options.runs < 1:
        parser.error("--runs must be at least 1")
    rows = measure(options.python, options.runs)
    print(format_table(rows, options.runs))
    worst = max(with_plugin / without_plugin for _, with_plugin, without_plugin in rows)
    if options.fail_above is not None and worst > options.fail_above:
        print(f"ratio {worst:.2f} is above {options.fail_above}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
