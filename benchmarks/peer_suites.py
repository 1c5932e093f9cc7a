"""JAX's and tokamax's own TPU tests on the CPU: with the plugin off, then opted in, and the table.

    # JAX's tests/pallas TPU files at the tag of the installed jax, from a clone of JAX
    # (a checkout, or a bare git directory: git clone --bare https://github.com/jax-ml/jax)
    python benchmarks/peer_suites.py jax --jax-source ~/src/jax --sample 10 -n 2

    # tokamax's TPU tests, from its installed wheel (pip install tokamax==0.0.17)
    python benchmarks/peer_suites.py tokamax --sample 10 -n 2

    # tokamax whole, in slices and chunks that survive a stop: run again to resume
    python benchmarks/peer_suites.py tokamax --sample 20 --slice 3 --chunks 8 \
        --workdir runs/tokamax-slice3 -n 2

    # the tables again, from the JUnit XML of an earlier run
    python benchmarks/peer_suite_results.py WORK/off.xml WORK/on.xml

Each suite runs twice in a work folder (``--workdir``, default a fresh temporary one): with
``-p no:pallas``, then opted in (``--opt-in``, default ``--pallas-interpret=tpu``); each run
writes JUnit XML there (off.xml, on.xml) and its ``--durations`` output (off.log, on.log).
``--also-opt-in`` adds opted-in runs under other configurations (on2.xml, ...), taken
together with the first: a TPU CI runs a suite on a single chip and on a slice, and the
tests that want one device skip beside the run's eight simulated ones. ``--chunks N`` splits
the files into N runs, each with its own XML (off-3.xml, on-3.xml); a run stopped (Ctrl-C
ends pytest and all its workers) keeps the chunks it finished, and the same command resumes
after them. ``--sample K --slice J`` measures one K-th of the suite; the K slices are the
whole.
The tables (docs/peer-suites.md) count, per file, the TPU-only tests (skipped with the plugin
off) and what became of them opted in, and class every skip and failure by cause.

JAX's test files come from the JAX source at the tag ``jax-v<installed version>`` (``--ref``
to name another); a checkout without git is used as it is. The wheel lacks two of their
utilities (``jax._src.pallas.pallas_test_util``, ``jax._src.hypothesis_test_util``): they are
copied from the same source beside the tests and served by benchmarks/peer_suite_shim.py
(copied there, loaded with ``-p``), which also keeps every K-th test id (``--sample K``) and ends
a test past ``--timeout`` seconds. The installed jax is not modified. JAX's own pytest settings
(its pyproject.toml, at the same tag) apply, as in JAX's CI: warnings are errors.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peer_suite_results  # noqa: E402  (beside this script)

JAX_FILES = (
    "tpu_pallas_test.py",
    "tpu_ops_test.py",
    "tpu_paged_attention_kernel_test.py",
    "tpu_pallas_pipeline_test.py",
    "tpu_pallas_async_test.py",
    "tpu_ragged_paged_attention_test.py",
)
JAX_SUPPORT = {
    "jax/_src/pallas/pallas_test_util.py": "pallas_test_util.py",
    "jax/_src/hypothesis_test_util.py": "hypothesis_test_util.py",
}
# A tokamax test file is a TPU one when its path names the TPU or its text asks for one.
TOKAMAX_PATH = r"(?i)tpu"
TOKAMAX_ASKS = r"[!=]= *['\"]tpu['\"]|get_tpu_info"
NO_SOURCE = ("no JAX source: give --jax-source PATH (or PEER_SUITES_JAX_SOURCE), a clone of "
             "https://github.com/jax-ml/jax, e.g. git clone --bare https://github.com/jax-ml/jax")


@functools.cache
def _installed() -> tuple[str, str | None]:
    """The versions of jax and libtpu (None without it) as the runs will import them
    (``PYTHONPATH`` included): the libtpu decides the TPU compiler check's verdicts and
    which tests a libtpu-date gate lets run. Asked once, of a fresh interpreter."""
    probe = ("import importlib.metadata as m, jax\n"
             "try: libtpu = m.version('libtpu')\n"
             "except m.PackageNotFoundError: libtpu = ''\n"
             "print(jax.__version__); print(libtpu)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    jax_version, libtpu = (out.stdout.splitlines() + [""])[:2]
    return jax_version.strip(), libtpu.strip() or None


def _installed_jax_version() -> str:
    return _installed()[0]


def _installed_versions() -> str:
    """"jax 0.10.2, libtpu 0.0.43.2", for the report's header."""
    jax_version, libtpu = _installed()
    return f"jax {jax_version}, " + (f"libtpu {libtpu}" if libtpu else "no libtpu")


def _git_dir(source: pathlib.Path) -> pathlib.Path | None:
    for candidate in (source / ".git", source):
        if (candidate / "objects").is_dir() and (candidate / "HEAD").exists():
            return candidate
    return None


def fetch_jax_files(source: pathlib.Path, ref: str | None, files, workdir: pathlib.Path) -> str:
    """Copies JAX's test files and their two utilities into ``workdir``; returns what was used."""
    wanted = {f"tests/pallas/{name}": workdir / "tests" / "pallas" / name for name in files}
    wanted.update({path: workdir / "_jax_test_support" / name
                   for path, name in JAX_SUPPORT.items()})
    wanted["pyproject.toml"] = workdir / "pyproject.toml"
    git = _git_dir(source)
    if git is not None and ref != "worktree":
        ref = ref or f"jax-v{_installed_jax_version()}"
        for path, target in wanted.items():
            shown = subprocess.run(["git", "--git-dir", str(git), "show", f"{ref}:{path}"],
                                   capture_output=True)
            if shown.returncode:
                raise SystemExit(f"{git} has no {path} at {ref}: fetch the tag "
                                 f"(git -C {source} fetch --tags) or name one with --ref.")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(shown.stdout)
        commit = subprocess.run(["git", "--git-dir", str(git), "rev-parse", ref],
                                capture_output=True, text=True).stdout.strip()
        return f"{ref} ({commit[:12]})"
    for path, target in wanted.items():
        if not (source / path).exists():
            raise SystemExit(f"{source} has no {path}: give the root of a JAX checkout.")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / path, target)
    return f"the checkout {source}"


def prepare_workdir(workdir: pathlib.Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    # Loaded with -p (not as a conftest.py), so that it also serves tests outside the folder.
    shutil.copyfile(HERE / "peer_suite_shim.py", workdir / "peer_suite_shim.py")


def run_pytest(workdir: pathlib.Path, paths, label: str, plugin_args, args) -> pathlib.Path:
    """One pytest run over ``paths`` in ``workdir``; returns its JUnit XML. An XML already
    there is kept (``--chunks``: a long measurement resumes where it stopped)."""
    xml = workdir / f"{label}.xml"
    if xml.exists() and args.chunks > 1:
        print(f"  {xml.name}: kept from an earlier run", flush=True)
        return xml
    command = [sys.executable, "-m", "pytest", *map(str, paths), "-p", "peer_suite_shim",
               *plugin_args,
               f"--junitxml={xml}", "-o", "junit_family=xunit1", "-q", "-rN",
               f"--durations={args.durations}", "-p", "no:cacheprovider"]
    command += ["-n", str(args.workers)] if args.workers else ["-p", "no:xdist"]
    command += args.pytest_args
    path = os.pathsep.join(filter(None, [str(workdir), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PEER_SUITE_SAMPLE=str(args.sample), PEER_SUITE_SLICE=str(args.slice),
               PEER_SUITE_TIMEOUT=str(args.timeout), PYTHONHASHSEED="0", PYTHONPATH=path)
    shown = command[1:]
    if len(paths) > 8:  # tokamax's ninety files: name the folder, not each file
        shown = [*command[1:3], f"<{len(paths)} files under {os.path.commonpath(paths)}>",
                 *command[3 + len(paths):]]
    print(f"$ (cd {workdir} && PEER_SUITE_SAMPLE={args.sample} PEER_SUITE_SLICE={args.slice} "
          f"PEER_SUITE_TIMEOUT={args.timeout} python {' '.join(shown)})", flush=True)
    start = time.monotonic()
    partial = xml.with_suffix(".partial.xml")
    command[command.index(f"--junitxml={xml}")] = f"--junitxml={partial}"
    with open(workdir / f"{label}.log", "w") as log:
        status = _run_to_the_end(command, workdir, env, log)
    print(f"  exit {status}, {time.monotonic() - start:.0f} s wall; log {workdir / label}.log",
          flush=True)
    if not partial.exists():
        raise SystemExit(f"pytest wrote no {xml}; see {workdir / label}.log")
    # Written under another name until pytest ends, so that a stopped run leaves no XML that
    # a resumed one would take for a finished chunk.
    partial.replace(xml)
    return xml


def _run_to_the_end(command, workdir, env, log) -> int:
    """Runs pytest in a process group of its own. Ctrl-C (or SIGTERM) ends the whole group:
    pytest-xdist's controller does not stop for it while its workers are inside XLA, and
    replaces a worker that is killed alone."""
    process = subprocess.Popen(command, cwd=workdir, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return process.wait()
    except KeyboardInterrupt:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise SystemExit(f"stopped: pytest and its workers ended; the chunks measured so far "
                         f"are kept in {workdir}")
    finally:
        signal.signal(signal.SIGTERM, previous)


def _chunks(paths, count: int) -> list[list]:
    """``paths`` in ``count`` contiguous groups of about equal length (files, not tests: a
    chunk is one pytest run)."""
    count = max(1, min(count, len(paths)))
    size, extra = divmod(len(paths), count)
    groups, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        groups.append(paths[start:end])
        start = end
    return groups


def measure(workdir: pathlib.Path, paths, args) -> None:
    """The runs, chunk by chunk (``--chunks``), then the tables over all chunks."""
    chunks = _chunks(paths, args.chunks)
    offs, ons, also_on = [], [], []
    for number, chunk in enumerate(chunks):
        suffix = f"-{number}" if len(chunks) > 1 else ""
        if len(chunks) > 1:
            print(f"chunk {number + 1} of {len(chunks)}: {len(chunk)} files", flush=True)
        if args.mode in ("off", "both"):
            offs.append(run_pytest(workdir, chunk, f"off{suffix}", ["-p", "no:pallas"], args))
        if args.mode in ("on", "both"):
            ons.append(run_pytest(workdir, chunk, f"on{suffix}", shlex.split(args.opt_in), args))
            also_on += [run_pytest(workdir, chunk, f"on{runs}{suffix}", shlex.split(opt_in),
                                   args)
                        for runs, opt_in in enumerate(args.also_opt_in, start=2)]
    if offs and ons:
        pairs = [path for off, on in zip(offs, ons) for path in (off, on)]
        print(peer_suite_results.report(*pairs, also_on=also_on))
    else:  # one run only: its tables, chunk by chunk
        for xml in (*offs, *ons, *also_on):
            print(peer_suite_results.report(xml))


def tokamax_test_files(exclude: str) -> tuple[pathlib.Path, list[pathlib.Path]]:
    """The installed tokamax's TPU test files (TOKAMAX_PATH, TOKAMAX_ASKS) whose path does not
    match ``exclude``."""
    out = subprocess.run([sys.executable, "-c", "import tokamax, os; "
                          "print(os.path.dirname(tokamax.__file__))"],
                         capture_output=True, text=True)
    if out.returncode:
        why = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"tokamax does not import ({why}): pip install tokamax==0.0.17 with "
                         "its dependencies (it needs jax 0.12 and Python 3.12+).")
    root = pathlib.Path(out.stdout.strip())
    files = sorted(
        path for path in root.rglob("*_test.py")
        if not re.search(exclude, str(path.relative_to(root)))
        and (re.search(TOKAMAX_PATH, str(path.relative_to(root)))
             or re.search(TOKAMAX_ASKS, path.read_text(errors="replace"))))
    return root, files


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=("jax", "tokamax"))
    parser.add_argument("--jax-source", default=os.environ.get("PEER_SUITES_JAX_SOURCE"),
                        help="a JAX checkout or git directory (jax suite)")
    parser.add_argument("--ref", help="git tag or commit of the tests (default "
                        "jax-v<installed version>; 'worktree' uses a checkout's files as they are)")
    parser.add_argument("--files", nargs="+", default=list(JAX_FILES),
                        help="JAX test files under tests/pallas (default: the six TPU files)")
    parser.add_argument("--tokamax-exclude", default="torch",
                        help="leave out tokamax test files whose path matches this regular "
                        "expression (default: the PyTorch front end's)")
    parser.add_argument("--workdir", type=pathlib.Path,
                        help="where the tests, the XML and the logs go (default: a new temp dir)")
    parser.add_argument("--mode", choices=("off", "on", "both"), default="both")
    parser.add_argument("--opt-in", default="--pallas-interpret=tpu",
                        help="the pytest arguments of the opted-in run")
    parser.add_argument("--also-opt-in", action="append", default=[], metavar="ARGS",
                        help="the pytest arguments of a further opted-in run, taken together "
                        "with the first (\"--pallas-interpret=tpu --pallas-devices=1\": the "
                        "single-device tests); repeatable")
    parser.add_argument("--sample", type=int, default=1, help="keep every K-th test id per file")
    parser.add_argument("--slice", type=int, default=0, metavar="J",
                        help="with --sample K, keep the ids J, J+K, ... (0 to K-1): the K "
                        "slices together are the whole suite")
    parser.add_argument("--chunks", type=int, default=1,
                        help="split the files into this many pytest runs, each with its own "
                        "XML in the work folder; run again with the same --workdir to resume "
                        "after a stop (chunks already measured are kept)")
    parser.add_argument("-n", "--workers", type=int, default=0, help="pytest-xdist workers")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a test may run (0: no limit)")
    parser.add_argument("--durations", type=int, default=25)
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    argv = sys.argv[1:] if argv is None else list(argv)
    # argparse gives a positional list nothing once the suite's name is read, so the
    # arguments after "--" are taken apart here.
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.pytest_args += pytest_args
    if not 0 <= args.slice < max(args.sample, 1):
        parser.error(f"--slice {args.slice}: give 0 to {max(args.sample, 1) - 1} "
                     f"(the slices of --sample {args.sample})")
    if args.chunks < 1:
        parser.error(f"--chunks {args.chunks}: give 1 or more")

    # Absolute: each pytest runs inside it, and its XML and logs are named from there.
    workdir = (args.workdir or pathlib.Path(tempfile.mkdtemp(prefix=f"peer-{args.suite}-"))
               ).resolve()
    prepare_workdir(workdir)
    if args.suite == "jax":
        if not args.jax_source:
            raise SystemExit(NO_SOURCE)
        used = fetch_jax_files(pathlib.Path(args.jax_source).expanduser(), args.ref,
                               args.files, workdir)
        print(f"JAX's tests from {used}; installed: {_installed_versions()}", flush=True)
        paths = [pathlib.Path("tests", "pallas", name) for name in args.files]
    else:
        root, paths = tokamax_test_files(args.tokamax_exclude)
        print(f"tokamax's tests from {root}: {len(paths)} files", flush=True)
    measure(workdir, paths, args)


if __name__ == "__main__":
    main()
