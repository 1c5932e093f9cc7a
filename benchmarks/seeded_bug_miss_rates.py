"""How often the conformance suite's value property misses a seeded bug, over many seeds.

Each seeded bug of ``tests/seeded_bugs/blocks.py`` hides in multi-block code: it shows
only when its kernel's grid takes several steps. This script runs the value property
(``-k test_value``, no shrinking, no compile check) once per seed on each bug, as
declared (``@supports(blocks=...)``: the suite picks small blocks) and undeclared (the
suite calls it with its default blocks, as it did before block declarations existed),
and prints how many runs of each missed the bug. One pytest process per seed and
column runs every bug's op; run it on a machine without other JAX work to keep it short.

    python benchmarks/seeded_bug_miss_rates.py               # seeds 0-39, 10 examples
    python benchmarks/seeded_bug_miss_rates.py --seeds 5 --examples 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (op, attribute of seeded_bugs.blocks): one bug per op, so one run checks them all.
BUGS = (
    ("matmul", "matmul_k_steps_overwrite"),
    ("attention", "attention_kv_blocks_missing_rescale"),
    ("rms_norm", "rms_norm_ragged_rows_dropped"),
)
COLUMNS = (("declared blocks", "seeded_bugs.blocks:{}"),
           ("undeclared (default blocks)", "seeded_bugs.blocks:undeclared.{}"))
_JUDGED = ("shape_dtype", "finite", "value")


def run_seed(python: str, seed: int, examples: int, target: str,
             directory: Path) -> dict[str, bool]:
    """Per op: whether the value property caught its bug at ``seed``."""
    report = directory / f"report-{seed}.json"
    impls = [arg for op, bug in BUGS for arg in ("--pallas-impl", f"{op}={target.format(bug)}")]
    environ = dict(os.environ, CI="true",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "tests"),
                                               os.environ.get("PYTHONPATH", "")]))
    subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "_pallas_no_shrink", "--pallas-conformance", *impls, "-k", "test_value",
         f"--pallas-seed={seed}", f"--pallas-examples={examples}", "--pallas-compile=none",
         f"--pallas-report={report}"],
        cwd=ROOT, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        check=False)
    ops = json.loads(report.read_text())["ops"]
    return {op: any(ops[op]["properties"].get(name, {}).get("verdict") == "fail"
                    for name in _JUDGED) for op, _ in BUGS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40, help="seeds 0..N-1 (default 40)")
    parser.add_argument("--examples", type=int, default=10,
                        help="--pallas-examples of each run (default 10, the ci profile's)")
    parser.add_argument("--python", default=sys.executable)
    options = parser.parse_args(argv)
    missed = {(label, op): [] for label, _ in COLUMNS for op, _ in BUGS}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pallas-miss-rates-") as name:
        for seed in range(options.seeds):
            for label, target in COLUMNS:
                caught = run_seed(options.python, seed, options.examples, target, Path(name))
                for op, _ in BUGS:
                    if not caught[op]:
                        missed[(label, op)].append(seed)
    print(f"runs that missed the bug, of {options.seeds} seeds (0-{options.seeds - 1}), value "
          f"property at --pallas-examples={options.examples} "
          f"({time.perf_counter() - start:.0f} s)")
    print("| seeded bug | " + " | ".join(label for label, _ in COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for op, bug in BUGS:
        cells = []
        for label, _ in COLUMNS:
            seeds = missed[(label, op)]
            cells.append(f"{len(seeds)} of {options.seeds}"
                         + (f" (seeds {', '.join(map(str, seeds[:8]))}"
                            f"{', ...' if len(seeds) > 8 else ''})" if seeds else ""))
        print(f"| `{bug}` ({op}) | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
