"""How often the conformance suite misses each seeded bug, over seeds 0..N-1.

For every seeded bug of ``tests/seeded_bugs/`` (the lists of ``tests/test_suite_power.py``,
the multi-block bugs of ``blocks.py`` and the one-structure bugs of ``structure.py``) the
script runs the suite's check of the bug's op with the bug as the implementation
(``--pallas-impl OP=seeded_bugs.MODULE:NAME --pallas-seed=S``, the default profile and
examples, only the conformance test that judges the bug's property) at every seed, and
prints a table: bug, op, misses of N, and the seeds that missed.

One pytest process per bug runs all its seeds in turn (``pytest.main`` in-process, so JAX's
compilations of one seed serve the next), each stopping at its first failure (Hypothesis
without its shrink and explain phases, which only simplify a failure already found;
``-x``). The runs keep pytest's cache directory, with JAX's persistent compilation cache in
it, under ``--workdir``: a second invocation is warm. The TPU compiler check is off: what is
measured is whether the suite's properties fail the bug.

``--before-python`` adds a "before" column: the same bugs, the same seeds, run by another
environment's pytest-pallas (an older checkout installed there); the bugs are always this
checkout's, so both columns judge the same code. For the multi-block bugs, before is the
kernel without its block declaration (``blocks:undeclared.NAME``), which an older suite
calls with its default blocks as it called every kernel.

    python benchmarks/miss_rates.py                          # every bug, 40 seeds
    python benchmarks/miss_rates.py --seeds 5 --bugs rms_norm_without_eps,blocks.
    python benchmarks/miss_rates.py --before-python OLD_VENV/bin/python --only-before-listed

Run it with ``nice -n 19`` on a shared machine; it prints the table as each bug finishes.
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
TESTS = ROOT / "tests"

# The conformance test that judges each property (as tests/test_suite_power.py).
_TEST_OF_PROPERTY = {"shape_dtype": "test_value", "finite": "test_value", "value": "test_value",
                     "written": "test_written_and_deterministic",
                     "deterministic": "test_written_and_deterministic", "vmap": "test_vmap"}
_VALUE = ("shape_dtype", "finite", "value")

# Bugs beside the lists of tests/test_suite_power.py: (op, module, name, properties).
_MORE_BUGS = (
    ("matmul", "blocks", "matmul_k_steps_overwrite", _VALUE),
    ("attention", "blocks", "attention_kv_blocks_missing_rescale", _VALUE),
    ("rms_norm", "blocks", "rms_norm_ragged_rows_dropped", _VALUE),
    ("flash_attention", "structure", "flash_attention_gqa_head_modulo", _VALUE),
    ("flash_attention", "structure", "flash_attention_key_mask_from_query_length", _VALUE),
    ("paged_attention", "structure", "paged_attention_page_size_16", _VALUE),
    ("rms_norm", "structure", "rms_norm_without_eps", _VALUE),
)

# The bugs whose catch depended on the seed before the sweep's structural cases and the
# declared blocks: those --only-before-listed runs in the before column.
SEED_DEPENDENT = ("structure.flash_attention_gqa_head_modulo",
                  "structure.flash_attention_key_mask_from_query_length",
                  "kernels.ppermute_wrong_direction", "structure.paged_attention_page_size_16",
                  "structure.rms_norm_without_eps", "blocks.matmul_k_steps_overwrite",
                  "blocks.attention_kv_blocks_missing_rescale",
                  "blocks.rms_norm_ragged_rows_dropped")


def seeded_bugs() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(bug, op, test, properties) of every seeded bug; bug is ``module.name``."""
    sys.path.insert(0, str(TESTS))
    try:
        import test_suite_power as power
    finally:
        sys.path.remove(str(TESTS))
    listed = ([(op, "kernels", name, props) for op, name, props in power.BUGS]
              + [(op, "new_ops", name, props) for op, name, props in power.NEW_OP_BUGS]
              + list(_MORE_BUGS))
    bugs = []
    for op, module, name, properties in listed:
        (test,) = {_TEST_OF_PROPERTY[p] for p in properties}
        judged = tuple(p for p, t in _TEST_OF_PROPERTY.items() if t == test)
        bugs.append((f"{module}.{name}", op, test, judged))
    return bugs


def _target(bug: str, column: str) -> str:
    module, name = bug.split(".")
    if column == "before" and module == "blocks":
        return f"seeded_bugs.blocks:undeclared.{name}"
    return f"seeded_bugs.{module}:{name}"


# --- the worker: one process, one bug, every seed --------------------------------------------


class _NoShrink:
    """Hypothesis's explicit and generate phases only: a failure found ends the example
    search at once (its shrinking would only simplify it)."""

    def __init__(self):
        try:
            from pytest_pallas._compat.hypothesis_internals import change_settings, is_given_test
        except ImportError:  # an older checkout (--before-python), before the regrouping
            from pytest_pallas._hypothesis_compat import change_settings, is_given_test
        self._change, self._is_given = change_settings, is_given_test

    def pytest_runtest_setup(self, item):
        from hypothesis import Phase

        function = getattr(item, "obj", None)
        function = getattr(function, "__func__", function)
        if self._is_given(function):
            self._change(function, phases=(Phase.explicit, Phase.generate), database=None)

    pytest_runtest_setup.trylast = True  # after pytest-pallas gives the test its settings


def worker(op: str, target: str, test: str, seeds: list[int], results: Path) -> None:
    """Run ``test`` of ``op`` on ``target`` at each seed; one JSON line per seed."""
    import contextlib

    import pytest

    no_shrink = _NoShrink()
    for seed in seeds:
        report = results.with_suffix(f".{seed}.json")
        start = time.perf_counter()
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            code = pytest.main(
                ["-q", "-x", "-p", "no:xdist", "--pallas-conformance", f"--pallas-ops={op}",
                 "--pallas-impl", f"{op}={target}", "-k", test, f"--pallas-seed={seed}",
                 "--pallas-compile=none", f"--pallas-report={report}"],
                plugins=[no_shrink])
        document = json.loads(report.read_text()) if report.exists() else {}
        report.unlink(missing_ok=True)
        properties = document.get("ops", {}).get(op, {}).get("properties", {})
        line = {"seed": seed, "exit": int(code), "seconds": time.perf_counter() - start,
                "complete": bool(document.get("complete")),
                "failed": sorted(n for n, p in properties.items() if p["verdict"] == "fail")}
        with results.open("a") as out:
            out.write(json.dumps(line) + "\n")


# --- the driver ------------------------------------------------------------------------------


def measure(python: str, bug: str, op: str, test: str, column: str, seeds: int,
            workdir: Path) -> list[dict]:
    """The worker's per-seed lines for ``bug`` in ``column`` (run by ``python``)."""
    directory = workdir / column  # pytest's rootdir and cache, kept between invocations
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pallas-miss-rates-") as scratch:
        results = Path(scratch) / "results.jsonl"
        environ = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
        environ.pop("CI", None)  # the default (dev) profile, not the ci one
        subprocess.run([python, str(Path(__file__).resolve()), "--worker", op,
                        _target(bug, column), test, str(seeds), str(results)],
                       cwd=directory, env=environ, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        return ([json.loads(line) for line in results.read_text().splitlines()]
                if results.exists() else [])


def verdict(lines: list[dict], seeds: int, judged: tuple[str, ...]) -> tuple[list, list]:
    """(seeds that missed, seeds that did not run to a report)."""
    # exit 0 or 1: tests ran (passed or failed); 2 to 5: interrupted, a usage error, none ran
    by_seed = {line["seed"]: line for line in lines
               if line["complete"] and line["exit"] in (0, 1)}
    missed = [s for s in range(seeds)
              if s in by_seed and not set(by_seed[s]["failed"]) & set(judged)]
    broken = [s for s in range(seeds) if s not in by_seed]
    return missed, broken


def _cell(missed: list[int] | None, broken: list[int], seeds: int) -> str:
    if missed is None:
        return "not run"
    ran = seeds - len(broken)
    text = f"{len(missed)}/{ran}"
    caught = [s for s in range(seeds) if s not in missed and s not in broken]
    if missed and len(missed) > ran // 2:
        text += " (caught at seed" + "s" * (len(caught) > 1) + " " + ", ".join(
            map(str, caught)) + " only)" if caught else ""
    elif missed:
        text += " (seeds " + ", ".join(map(str, missed)) + ")"
    if broken:
        text += f", {len(broken)} without a verdict"
    return text


def table(rows: list[tuple], columns: list[str], seeds: int) -> str:
    lines = [f"misses of {seeds} seeds (0-{seeds - 1}); a miss: the run's report shows no "
             "failed property of the bug's conformance test",
             "| seeded bug | op | test | " + " | ".join(columns) + " | s/seed (after) |",
             "|---" * (len(columns) + 4) + "|"]
    for bug, op, test, cells, seconds in rows:
        lines.append(f"| `{bug}` | {op} | {test} | " + " | ".join(cells[c] for c in columns)
                     + f" | {seconds} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        op, target, test, seeds, results = argv[1:]
        worker(op, target, test, list(range(int(seeds))), Path(results))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40, help="seeds 0..N-1 (default 40)")
    parser.add_argument("--bugs", default="",
                        help="comma-separated parts of bug names to run (default: all)")
    parser.add_argument("--skip", default="",
                        help="comma-separated parts of bug names to leave out")
    parser.add_argument("--python", default=sys.executable, help="this checkout's interpreter")
    parser.add_argument("--before-python", default=None,
                        help="an interpreter whose pytest-pallas is the older suite")
    parser.add_argument("--only-before-listed", action="store_true",
                        help="run the before column for the seed-dependent bugs only")
    parser.add_argument("--no-after", action="store_true", help="the before column only")
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "pallas-miss-rates",
                        help="pytest's rootdir and cache of the runs (kept: reruns are warm)")
    parser.add_argument("--json", type=Path, default=None, help="also write the lines here")
    options = parser.parse_args(argv)
    wanted = [part for part in options.bugs.split(",") if part]
    skipped = [part for part in options.skip.split(",") if part]
    bugs = [b for b in seeded_bugs() if (not wanted or any(part in b[0] for part in wanted))
            and not any(part in b[0] for part in skipped)]
    columns = (["before"] if options.before_python else []) + ([] if options.no_after
                                                               else ["after"])
    pythons = {"before": options.before_python, "after": options.python}
    rows, raw = [], {}
    start = time.perf_counter()
    for bug, op, test, judged in bugs:
        cells, seconds = {}, "-"
        for column in columns:
            if (column == "before" and options.only_before_listed
                    and bug not in SEED_DEPENDENT):
                cells[column] = "not run"
                continue
            lines = measure(pythons[column], bug, op, test, column, options.seeds,
                            options.workdir)
            raw[f"{bug} {column}"] = lines
            cells[column] = _cell(*verdict(lines, options.seeds, judged),
                                  options.seeds)
            if column == "after" and lines:
                times = sorted(line["seconds"] for line in lines)
                seconds = f"{times[len(times) // 2]:.1f}"
        rows.append((bug, op, test, cells, seconds))
        print(table(rows, columns, options.seeds), flush=True)
        print(f"({time.perf_counter() - start:.0f} s so far)\n", flush=True)
        if options.json:
            options.json.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
