"""Where an opted-in test's time goes: tracing, lowering, XLA's compile and running, for its
kernels and for its own program, the TPU compiler check, JAX's checks, and the plugin's own
bookkeeping. Samples every thread of one pytest process with py-spy (``pip install py-spy``)
and classes each sample by the frames on its stack.

    python benchmarks/profile_phases.py --cwd WORK -- tests/pallas/x_test.py::T::test_a \\
        -p peer_suite_shim --pallas-interpret=tpu

Prints a table of seconds per phase (CPU: py-spy counts a thread only while it runs) and
writes the raw samples beside it (``--output``). Several ids run in one process; each id is
profiled alone with ``--each``. pytest's cache is off, so every compilation is paid
(cold); ``--warm`` profiles a second run instead, after one that fills a fresh cache
directory, as a CI that keeps ``.pytest_cache`` between runs sees it (the plugin keeps JAX's
compiled executables and the TPU compiler's verdicts there).
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

# (phase, test on one frame of a sample) in order: the first that any frame matches wins.
KERNEL = "jax/_src/pallas/"
PHASES = (
    ("TPU compiler check", lambda f: "pytest_pallas/checks/compile_check" in f
     or "pytest_pallas/_compat/compiled_artefacts" in f),
    ("JAX's own checks (jax_enable_checks)", lambda f: f.startswith(("check_jaxpr ",
                                                                    "_check_jaxpr "))),
    ("XLA compile", lambda f: f.startswith(("backend_compile", "compile_or_get_cached",
                                            "_cached_compilation"))),
    ("lowering", lambda f: "jax/_src/interpreters/mlir.py" in f
     or f.startswith(("lower_sharding_computation", "_pjit_lower", "lower_jaxpr_to_module"))),
    ("tracing", lambda f: f.startswith(("trace_to_jaxpr", "make_jaxpr", "_create_pjit_jaxpr",
                                        "trace_to_subjaxpr"))),
    ("running: interpreter callbacks", lambda f: "jax/_src/pallas/mosaic/interpret/" in f
     or "jax/_src/pallas/mosaic_gpu/interpret/" in f or "jax/_src/callback.py" in f),
    ("running: XLA execution", lambda f: f.startswith(("_execute_compiled", "__call__ (jax/_src/"
                                                       "interpreters/pxla.py", "call_impl_cache",
                                                       "_pjit_call_impl"))),
    ("plugin bookkeeping", lambda f: "pytest_pallas/" in f and "reference_kernels" not in f),
)
SPLIT = ("XLA compile", "lowering", "tracing", "running: XLA execution")


IDLE = ("wait (threading.py", "Event.wait (threading.py", "Condition.wait (threading.py",
        "_wait_for_tstate_lock (threading.py", "sleep (")


def classify(frames: list[str]) -> str | None:
    """The phase of one sample, its frames outermost first (the first names its thread);
    None for a thread that only waits."""
    thread, frames = frames[0], frames[1:]
    if frames and frames[-1].startswith(IDLE):
        return None
    if not frames:
        return "native threads (XLA's, libtpu's)" if "MainThread" not in thread else (
            "start-up, collection and exit")
    in_test = any("runtestprotocol" in frame for frame in frames)
    if "MainThread" in thread and not in_test:
        return "start-up, collection and exit"
    for phase, matches in PHASES:
        if any(matches(frame) for frame in frames):
            if phase in SPLIT:
                whose = "kernel" if any(KERNEL in frame for frame in frames) else "test's own"
                return f"{phase} ({whose})"
            return phase
    if any("_pytest/" in frame or "pluggy/" in frame for frame in frames[-3:]):
        return "pytest"
    return "test's own Python (and idle waits)"


def read_samples(path: pathlib.Path, rate: int) -> dict[str, float]:
    """Seconds per phase from py-spy's raw output (folded stacks and their counts)."""
    seconds: dict[str, float] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame.strip() for frame in stack.split(";")]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        phase = classify(frames)
        if phase is not None:
            seconds[phase] += int(count) / rate
    return dict(seconds)


def profile(args: list[str], cwd: pathlib.Path, output: pathlib.Path, rate: int,
            env: dict[str, str], warm: bool = False) -> tuple[dict[str, float], float]:
    pytest = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q"]
    if warm:
        cache = ["-o", f"cache_dir={tempfile.mkdtemp(prefix='profile-cache-')}"]
        filling = [*pytest, *cache, *args]
        print("$", shlex.join(filling), " # fills the cache", flush=True)
        subprocess.run(filling, cwd=cwd, env=env, capture_output=True)
    else:
        cache = ["-p", "no:cacheprovider"]
    command = ["py-spy", "record", "--format", "raw", "--threads", "--rate", str(rate),
               "--output", str(output), "--", *pytest, *cache, *args]
    print("$", shlex.join(command), flush=True)
    import time

    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    tail = (done.stdout.strip().splitlines() or [""])[-1]
    print(f"  {tail} ({wall:.1f} s wall)", flush=True)
    return read_samples(output, rate), wall


def print_table(rows: list[tuple[str, dict[str, float], float]]) -> None:
    phases = sorted({phase for _, seconds, _ in rows for phase in seconds},
                    key=lambda phase: -sum(seconds.get(phase, 0) for _, seconds, _ in rows))
    print("\n| phase | " + " | ".join(name for name, _, _ in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for phase in phases:
        print(f"| {phase} | " + " | ".join(f"{seconds.get(phase, 0):.1f}"
                                            for _, seconds, _ in rows) + " |")
    print("| **CPU sampled** | " + " | ".join(f"{sum(seconds.values()):.1f}"
                                             for _, seconds, _ in rows) + " |")
    print("| wall | " + " | ".join(f"{wall:.1f}" for _, _, wall in rows) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cwd", type=pathlib.Path, default=pathlib.Path.cwd(),
                        help="where pytest runs (a peer suite's work folder)")
    parser.add_argument("--output", type=pathlib.Path, help="a folder for the raw samples")
    parser.add_argument("--rate", type=int, default=100, help="samples per second")
    parser.add_argument("--each", action="store_true",
                        help="profile each test id alone (ids are the arguments that hold ::)")
    parser.add_argument("--warm", action="store_true",
                        help="profile a second run, after one that fills a fresh pytest cache")
    parser.add_argument("pytest_args", nargs="+", help="pytest's arguments (after --)")
    args = parser.parse_args(argv)
    output = args.output or pathlib.Path(tempfile.mkdtemp(prefix="profile-"))
    output.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(args.cwd), os.environ.get("PYTHONPATH", "")]))}
    ids = [arg for arg in args.pytest_args if "::" in arg]
    rest = [arg for arg in args.pytest_args if "::" not in arg]
    runs = [[test_id] for test_id in ids] if args.each and ids else [ids]
    rows = []
    for index, selected in enumerate(runs):
        name = selected[0].rpartition("::")[2] if len(selected) == 1 else "all"
        seconds, wall = profile([*selected, *rest], args.cwd,
                                output / f"samples-{index}.txt", args.rate, env, args.warm)
        rows.append((name, seconds, wall))
    print_table(rows)
    print(f"\nraw samples in {output}")


if __name__ == "__main__":
    main()
