"""How often the conformance suite's value property misses a seeded bug, over many seeds.

The seeded bugs of ``tests/seeded_bugs/blocks.py`` hide in multi-block code (they show
only when the kernel's grid takes several steps); those of
``tests/seeded_bugs/structure.py`` and ``kernels.ppermute_wrong_direction`` show on one
structural value only (GQA, s != t, a page size of 8, more than two devices). For each
seed the script runs the value property (``-k test_value``, no shrinking, no compile
check) on every bug, before and after:

* blocks bugs: before is the kernel without its ``@supports(blocks=...)`` declaration
  (the suite calls it with its default blocks, as it did before declarations existed;
  an undeclared implementation's draws are unchanged), after is the declared kernel;
* structure bugs: before is the suite of ``--before-python`` (an environment with the
  previous release installed; the column is left out without it), after this checkout's.

One pytest process per seed runs every bug whose op differs; the table is printed after
every seed, so an interrupted run still says what it measured. Run it on a machine
without other JAX work to keep it short.

    python benchmarks/seeded_bug_miss_rates.py --before-python /path/to/old/venv/bin/python
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

# (op, bug, before target, after target); "old:" runs in --before-python's environment.
BUGS = (
    ("matmul", "blocks.matmul_k_steps_overwrite", "blocks:undeclared.matmul_k_steps_overwrite",
     "blocks:matmul_k_steps_overwrite"),
    ("attention", "blocks.attention_kv_blocks_missing_rescale",
     "blocks:undeclared.attention_kv_blocks_missing_rescale",
     "blocks:attention_kv_blocks_missing_rescale"),
    ("rms_norm", "blocks.rms_norm_ragged_rows_dropped",
     "blocks:undeclared.rms_norm_ragged_rows_dropped", "blocks:rms_norm_ragged_rows_dropped"),
    ("flash_attention", "structure.flash_attention_gqa_head_modulo",
     "old:structure:flash_attention_gqa_head_modulo",
     "structure:flash_attention_gqa_head_modulo"),
    ("flash_attention", "structure.flash_attention_key_mask_from_query_length",
     "old:structure:flash_attention_key_mask_from_query_length",
     "structure:flash_attention_key_mask_from_query_length"),
    ("paged_attention", "structure.paged_attention_page_size_16",
     "old:structure:paged_attention_page_size_16", "structure:paged_attention_page_size_16"),
    ("ppermute", "kernels.ppermute_wrong_direction", "old:kernels:ppermute_wrong_direction",
     "kernels:ppermute_wrong_direction"),
)
COLUMNS = ("before", "after")
_JUDGED = ("shape_dtype", "finite", "value")


def _processes(seed_tasks: list[tuple[str, str, str, str]]) -> list[tuple[str, list]]:
    """(environment, tasks) per process: tasks of one environment, no op twice."""
    processes: list[tuple[str, list]] = []
    for task in seed_tasks:
        environment, op = task[0], task[1]
        for env, tasks in processes:
            if env == environment and all(other[1] != op for other in tasks):
                tasks.append(task)
                break
        else:
            processes.append((environment, [task]))
    return processes


def run_process(python: str, tasks: list, seed: int, examples: int,
                directory: Path) -> dict[tuple[str, str], bool]:
    """Per (bug, column) of ``tasks``: whether the value property caught it at ``seed``."""
    report = directory / f"report-{seed}.json"
    impls = [arg for _, op, target, _, _ in tasks
             for arg in ("--pallas-impl", f"{op}=seeded_bugs.{target}")]
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
    ops = json.loads(report.read_text())["ops"] if report.exists() else {}
    report.unlink(missing_ok=True)
    return {(bug, column): any(ops.get(op, {}).get("properties", {}).get(name, {})
                               .get("verdict") == "fail" for name in _JUDGED)
            for _, op, _, bug, column in tasks}


def table(missed: dict, seeds: int, examples: int, seconds: float) -> str:
    lines = [f"runs that missed the bug, of {seeds} seeds (0-{seeds - 1}), value property at "
             f"--pallas-examples={examples} ({seconds:.0f} s)",
             "| seeded bug | op | " + " | ".join(COLUMNS) + " |", "|---|---|---|---|"]
    for op, bug, *_ in BUGS:
        cells = []
        for column in COLUMNS:
            if (bug, column) not in missed:
                cells.append("not run")
                continue
            found = missed[(bug, column)]
            listed = ", ".join(map(str, found[:8])) + (", ..." if len(found) > 8 else "")
            cells.append(f"{len(found)} of {seeds}" + (f" (seeds {listed})" if found else ""))
        lines.append(f"| `{bug}` | {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40, help="seeds 0..N-1 (default 40)")
    parser.add_argument("--examples", type=int, default=10,
                        help="--pallas-examples of each run (default 10, the ci profile's)")
    parser.add_argument("--python", default=sys.executable, help="this checkout's interpreter")
    parser.add_argument("--before-python", default=None,
                        help="an interpreter with the previous release of pytest-pallas")
    options = parser.parse_args(argv)
    tasks = []
    for op, bug, before, after in BUGS:
        for column, target in (("before", before), ("after", after)):
            environment = "old" if target.startswith("old:") else "new"
            if environment == "old" and options.before_python is None:
                continue
            tasks.append((environment, op, target.removeprefix("old:"), bug, column))
    pythons = {"new": options.python, "old": options.before_python}
    missed: dict[tuple[str, str], list[int]] = {(bug, column): [] for _, _, _, bug, column
                                                 in tasks}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pallas-miss-rates-") as name:
        for seed in range(options.seeds):
            for environment, group in _processes(tasks):
                caught = run_process(pythons[environment], group, seed, options.examples,
                                     Path(name))
                for key, found in caught.items():
                    if not found:
                        missed[key].append(seed)
            print(table(missed, seed + 1, options.examples, time.perf_counter() - start),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
