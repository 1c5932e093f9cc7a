"""Command-line and ini options: declared once, validated once, into one frozen object.

Nothing here imports JAX: the plugin loads in every pytest run of an
environment that has it installed, and most of those runs never touch Pallas.
Every user mistake becomes a ``pytest.UsageError`` (exit status 4) whose one
line names the option, the bad value and what would be accepted.
"""

from __future__ import annotations

import os
import random

import pytest

from .. import hosts
from ..numerics import DEFAULT_NUMERICS, NUMERICS
from ..settings import (  # noqa: F401  (the settings, read by the plugin's glue from here too)
    CI_SEED,
    COMPILER_CHIPS,
    DEFAULT_CHIP,
    DEFAULT_DEVICES,
    DEFAULT_INTERPRETER,
    DEFAULT_TIMEOUT_SECONDS,
    INTERPRETER_CHOICES,
    INTERPRETERS,
    KNOWN_CHIPS,
    PROFILES,
    TPU_ALWAYS,
    PallasOptions,
    device_count_from_xla_flags,
)
from . import implementations, versions
from .persistent_cache import add_ini_option as add_persistent_cache_option

# Where a pytest-xdist worker finds its controller's seed (config.workerinput).
WORKER_SEED_KEY = "pallas_seed"
# Set for the pytest that replaces one whose test was stuck past --pallas-timeout: the file
# of what it was handed (plugin.stuck_tests).
RESUME_ENV = "PYTEST_PALLAS_RESUME"


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("pallas", "Pallas kernels (pytest-pallas)")
    group.addoption(
        "--pallas-tpu", action="store_true", default=False,
        help="run kernels compiled for the TPU that JAX sees; stop with exit 4 if none is visible.",
    )
    group.addoption(
        "--pallas-gpu", action="store_true", default=False,
        help="run kernels compiled for the GPU that JAX sees (Mosaic GPU; Triton where a kernel "
        "asks for it); stop with exit 4 if none is visible.",
    )
    group.addoption(
        "--pallas-interpret", metavar="MODE", default=None,
        help=f"interpreter on the CPU: 'tpu' (simulated VMEM, DMAs, semaphores, NaN-poisoned "
        "memory; a kernel it would run no differently runs in JAX's plain interpreter), "
        f"'{TPU_ALWAYS}' (the TPU interpreter for every kernel) or 'plain' (interpret=True, "
        f"fastest). Default: {DEFAULT_INTERPRETER}.",
    )
    group.addoption(
        "--pallas-chip", metavar="NAME", default=None,
        help=f"TPU generation the CPU run stands in for ({', '.join(KNOWN_CHIPS)}). "
        f"Default: {DEFAULT_CHIP}.",
    )
    group.addoption(
        "--pallas-detect-races", action="store_true", default=False,
        help="TPU interpret mode with race detection; a detected race fails the test.",
    )
    group.addoption(
        "--pallas-devices", metavar="N", default=None,
        help=f"simulated CPU devices for multi-device kernels (default {DEFAULT_DEVICES}; "
        "ignored when XLA_FLAGS already sets --xla_force_host_platform_device_count).",
    )
    group.addoption(
        "--pallas-seed", metavar="N", default=None,
        help="fix every random draw (Hypothesis and array data). Default: a fresh seed, "
        f"printed; {CI_SEED} under the ci profile.",
    )
    group.addoption(
        "--pallas-examples", metavar="N", default=None,
        help="Hypothesis examples per property (overrides the profile).",
    )
    group.addoption(
        "--pallas-profile", metavar="NAME", default=None,
        help="Hypothesis settings profile: ci (a fixed seed, few examples), dev (default), "
        "thorough (nightly). Default: ci when the CI environment variable is set, else dev.",
    )
    group.addoption(
        "--pallas-processes", metavar="N", default=None,
        help="run each test in N JAX processes on this host joined by jax.distributed (CPU "
        "collectives), as the N hosts of a TPU slice; the simulated devices are split among them.",
    )
    group.addoption(
        "--pallas-timeout", metavar="SECONDS", default=None,
        help="fail a kernel call that runs longer "
        f"(default {DEFAULT_TIMEOUT_SECONDS:g}; 0 disables).",
    )
    group.addoption(
        "--pallas-conformance", action="store_true", default=False,
        help="add the installed conformance suite to the collected tests.",
    )
    group.addoption(
        "--pallas-impl", metavar="OP=MODULE:ATTR", action="append", default=[],
        help="check this callable for OP in the conformance suite (repeatable).",
    )
    group.addoption(
        "--pallas-ops", metavar="OP[,OP...]", default=None,
        help="restrict the conformance suite to these ops.",
    )
    group.addoption(
        "--pallas-sweep-first", metavar="N", default=None,
        help="run sweep case N of each op's value property first (the reproduce line of a "
        "failed sweep case sets it).",
    )
    group.addoption(
        "--pallas-compile", metavar="CHIP[,CHIP...]", default=None,
        help="also compile every pallas_call a Pallas test traces with the TPU compiler "
        f"(libtpu, no TPU needed) for these chips ({', '.join(COMPILER_CHIPS)}), 'all', or "
        "'none'. Default: the run's chip when libtpu is installed, else none.",
    )
    group.addoption(
        "--pallas-judge", action="store_true", default=False,
        help="judge every conformance implementation as a Pallas kernel: arithmetic outside "
        "the kernels, host callbacks, state kept across calls or a result that ignores its "
        "inputs fails its tests (reported, not failed, without it).",
    )
    group.addoption(
        "--pallas-numerics", metavar="chip|exact", default=None,
        help="chip (default): kernels interpreted for a TPU, and the test's own XLA dots, "
        "compute a default-precision float32 matmul as the chip does (bfloat16 operands, "
        "float32 sums); exact: float32 products.",
    )
    group.addoption(
        "--pallas-report", metavar="PATH", default=None,
        help="write a JSON conformance report to PATH.",
    )
    parser.addini(
        "pallas_devices", default=None,
        help="simulated CPU devices to create for this project's tests (like --pallas-devices).",
    )
    parser.addini("pallas_chip", default=None, help="default for --pallas-chip.")
    parser.addini("pallas_interpret", default=None, help="default for --pallas-interpret.")
    parser.addini(
        "pallas_scope", default="marked",
        help="'marked' (default): only tests with a pallas marker or fixture run in the Pallas "
        "backend; 'all': every test does.",
    )
    add_persistent_cache_option(parser)


def _positive_int(value: str, option: str, *, allow_zero: bool = False) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{option}={value!r} is not a whole number; give e.g. {option}=8.")
    if number < 0 or (number == 0 and not allow_zero):
        floor = 0 if allow_zero else 1
        raise pytest.UsageError(f"{option}={value} must be at least {floor}.")
    return number


def _option(config: pytest.Config, name: str, ini: str | None = None):
    value = config.getoption(name)
    if value is None and ini is not None:
        value = config.getini(ini) or None
    return value


def parse_options(config: pytest.Config, environ=os.environ) -> PallasOptions:
    """Validate every Pallas option of ``config``; raise ``pytest.UsageError`` on the first
    bad one."""
    tpu = bool(config.getoption("--pallas-tpu"))
    gpu = bool(config.getoption("--pallas-gpu"))
    detect_races = bool(config.getoption("--pallas-detect-races"))
    check_gpu_flag(gpu, tpu=tpu, detect_races=detect_races,
                   chip_given=config.getoption("--pallas-chip") is not None,
                   compile_given=config.getoption("--pallas-compile") is not None)

    interpreter = _option(config, "--pallas-interpret", "pallas_interpret") or DEFAULT_INTERPRETER
    if interpreter not in INTERPRETER_CHOICES:
        raise pytest.UsageError(
            f"--pallas-interpret={interpreter!r} is not an interpreter; use one of "
            f"{', '.join(INTERPRETER_CHOICES)}."
        )
    tpu_interpreter_always = interpreter == TPU_ALWAYS
    if tpu_interpreter_always:
        interpreter = "tpu"
    if detect_races and interpreter != "tpu":
        raise pytest.UsageError(
            "--pallas-detect-races needs the TPU interpreter; drop --pallas-interpret=plain."
        )

    chip_value = _option(config, "--pallas-chip", "pallas_chip")
    chips = parse_chip_flag(chip_value, tpu=tpu)
    chip = chips[0]

    devices_value = _option(config, "--pallas-devices", "pallas_devices")
    devices = DEFAULT_DEVICES
    if devices_value is not None:
        devices = _positive_int(devices_value, "--pallas-devices")

    profile = config.getoption("--pallas-profile") or ("ci" if environ.get("CI") else "dev")
    if profile not in PROFILES:
        raise pytest.UsageError(
            f"--pallas-profile={profile!r} is not a profile; use one of {', '.join(PROFILES)}."
        )

    seed_value = config.getoption("--pallas-seed")
    if seed_value is not None:
        seed = _positive_int(seed_value, "--pallas-seed", allow_zero=True)
    elif WORKER_SEED_KEY in getattr(config, "workerinput", {}):
        seed = int(config.workerinput[WORKER_SEED_KEY])  # a worker: the controller's draw
    elif profile == "ci":
        # A gate must not pass or fail on the luck of the draw: the ci profile is
        # derandomized, and so is the array data, with a fixed seed.
        seed = CI_SEED
    else:
        seed = random.SystemRandom().randrange(2**31)

    examples_value = config.getoption("--pallas-examples")
    examples = None
    if examples_value is not None:
        examples = _positive_int(examples_value, "--pallas-examples")

    timeout_value = config.getoption("--pallas-timeout")
    timeout_seconds = DEFAULT_TIMEOUT_SECONDS
    if timeout_value is not None:
        try:
            timeout_seconds = float(timeout_value)
        except ValueError:
            raise pytest.UsageError(
                f"--pallas-timeout={timeout_value!r} is not a number of seconds; "
                "give e.g. --pallas-timeout=120 (0 disables)."
            )
        if timeout_seconds < 0:
            raise pytest.UsageError(f"--pallas-timeout={timeout_value} must be 0 or more seconds.")

    compile_value = config.getoption("--pallas-compile")
    libtpu = hosts.installed_libtpu()
    compile_chips = () if gpu else parse_compile_flag(compile_value, chips=chips, tpu=tpu,
                                                      libtpu=libtpu)

    impls = implementations.parse_impl_flags(config.getoption("--pallas-impl"))
    ops_value = config.getoption("--pallas-ops")
    ops = implementations.parse_ops_flag(ops_value)
    implementations.check_ops_have_implementations(ops, impls, ops_value)
    report_path = _report_path(config.getoption("--pallas-report"))
    sweep_first_value = config.getoption("--pallas-sweep-first")
    sweep_first = (None if sweep_first_value is None
                   else _positive_int(sweep_first_value, "--pallas-sweep-first"))

    numerics = config.getoption("--pallas-numerics") or DEFAULT_NUMERICS
    if numerics not in NUMERICS:
        raise pytest.UsageError(
            f"--pallas-numerics={numerics!r} is not a choice; use chip (the chip's "
            "rounding, the default) or exact (float32 products).")

    return PallasOptions(
        tpu=tpu,
        gpu=gpu,
        interpreter=interpreter,
        tpu_interpreter_always=tpu_interpreter_always,
        chip=chip,
        chips=chips,
        chip_given=config.getoption("--pallas-chip") is not None,
        interpreter_given=config.getoption("--pallas-interpret") is not None,
        interpreter_in_ini=bool(config.getini("pallas_interpret")),
        detect_races=detect_races,
        devices=devices,
        devices_requested=devices_value is not None,
        seed=seed,
        seed_given=seed_value is not None,
        examples=examples,
        profile=profile,
        timeout_seconds=timeout_seconds,
        # Naming ops to check is asking for the suite, and a flag that silently does
        # nothing is a trap. --pallas-report reports the conformance tests the run has
        # (the suite's, or a test module's conformance_tests classes): it adds none.
        conformance=bool(config.getoption("--pallas-conformance") or impls or ops),
        implementations=impls,
        ops=ops,
        report_path=report_path,
        sweep_first=sweep_first,
        compile_chips=compile_chips,
        compile_given=compile_value is not None,
        libtpu=libtpu,
        judge=bool(config.getoption("--pallas-judge")),
        numerics=numerics,
    )


def check_gpu_flag(gpu: bool, *, tpu: bool, detect_races: bool, chip_given: bool,
                   compile_given: bool) -> None:
    """``--pallas-gpu`` with a flag that cannot go with it: a usage error naming both."""
    if not gpu:
        return
    clash = ("--pallas-tpu" if tpu else "--pallas-detect-races" if detect_races
             else "--pallas-chip" if chip_given else "--pallas-compile" if compile_given else None)
    if clash is None:
        return
    why = {
        "--pallas-tpu": "a run compiles for one kind of device",
        "--pallas-detect-races": "races are found by JAX's interpreters on the CPU, not on a GPU",
        "--pallas-chip": "it names the TPU a CPU run stands in for",
        "--pallas-compile": "it compiles for TPUs on a host without one",
    }[clash]
    raise pytest.UsageError(f"--pallas-gpu cannot go with {clash} ({why}); drop one of them.")


def _report_path(path: str | None) -> str | None:
    """``--pallas-report``'s PATH, checked before the run; missing directories are created
    when the report is written (as ``--junitxml`` does), and the summary says so."""
    if path is None:
        return None
    if not path.strip():
        raise pytest.UsageError("--pallas-report is empty; give a file, e.g. "
                                "--pallas-report=conformance.json.")
    if os.path.isdir(path):
        raise pytest.UsageError(
            f"--pallas-report={path!r} is a directory; give a file in it, e.g. "
            f"--pallas-report={os.path.join(path, 'conformance.json')}.")
    ancestor = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise pytest.UsageError(
            f"--pallas-report={path!r}: {ancestor} is a file, so the report's directory cannot "
            "be created; choose another path.")
    return path


def report_directory_to_create(path: str) -> str | None:
    """The report's directory, relative to the cwd, if it does not exist yet (it will be made)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(directory):
        return None
    return os.path.relpath(directory)




def parse_chip_flag(value: str | None, *, tpu: bool = False) -> tuple[str, ...]:
    """The chips of ``--pallas-chip``: one (``v5e``), several (``v5e,v6e,7x``: each test runs
    once per chip) or ``all`` (every generation the TPU compiler check compiles for that this
    JAX knows); the default chip when ``value`` is None."""
    if value is None:
        return (DEFAULT_CHIP,)
    words = [word.strip() for word in value.split(",") if word.strip()]
    if words == ["all"]:
        words = [chip for chip in COMPILER_CHIPS if versions.chip_needs_newer_jax(chip) is None]
    if not words:
        raise pytest.UsageError(
            f"--pallas-chip={value!r} names no chip; give e.g. --pallas-chip=v5e, "
            "--pallas-chip=v5e,v6e,7x or --pallas-chip=all.")
    chips = []
    for word in words:
        chip = _chip_word(word)
        if chip not in KNOWN_CHIPS:
            raise pytest.UsageError(
                f"--pallas-chip={value!r}: {word!r} is not a TPU generation JAX knows; use "
                f"{', '.join(KNOWN_CHIPS)}, a comma-separated list of them, or all.")
        if (too_old := versions.chip_needs_newer_jax(chip)) is not None:
            raise pytest.UsageError(
                f"--pallas-chip={value!r}: {too_old}; upgrade jax or pick another chip.")
        if chip not in chips:
            chips.append(chip)
    if tpu and len(chips) > 1:
        raise pytest.UsageError(
            f"--pallas-chip={value} names several chips, but --pallas-tpu runs on the one TPU "
            "JAX sees; drop --pallas-chip on a TPU.")
    return tuple(chips)


def parse_compile_flag(value: str | None, *, chips: tuple[str, ...], tpu: bool,
                       libtpu: str | None) -> tuple[str, ...]:
    """The chips of ``--pallas-compile`` (none when off); the default when ``value`` is None:
    the run's chips the check compiles for (each test's kernels for the chip it runs as)."""
    if value is None:
        if tpu or libtpu is None:
            return ()
        return tuple(chip for chip in chips if chip in COMPILER_CHIPS)
    words = [w.strip() for w in value.split(",") if w.strip()]
    if words == ["none"]:
        return ()
    if tpu:
        raise pytest.UsageError(
            f"--pallas-compile={value} compiles for a TPU on a host without one; with "
            "--pallas-tpu every kernel is compiled for the real chip already: drop one of them."
        )
    if not words:
        raise pytest.UsageError(
            f"--pallas-compile={value!r} names no chip; give e.g. --pallas-compile=v5e, "
            "'all' or 'none'."
        )
    if libtpu is None:
        raise pytest.UsageError(
            f"--pallas-compile={value} needs the TPU compiler, libtpu, which is not installed: "
            "pip install 'pytest-pallas[tpu]' (or jax[tpu]), or drop the flag."
        )
    if words == ["all"]:
        return COMPILER_CHIPS
    chips = []
    for word in words:
        name = _chip_word(word)
        if name not in COMPILER_CHIPS:
            raise pytest.UsageError(
                f"--pallas-compile={value}: {word!r} is not a chip the compile check supports; use "
                f"{', '.join(COMPILER_CHIPS)}, 'all' or 'none'."
            )
        if name not in chips:
            chips.append(name)
    return tuple(chips)


def _chip_word(word: str) -> str:
    """A chip as a user may write it: ``tpu-v6e`` or ``TPU v6e`` for ``v6e``."""
    return word[3:].lstrip(" _-") if word.lower().startswith("tpu") else word
