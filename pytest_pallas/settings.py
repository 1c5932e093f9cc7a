"""The run's settings, below the wings: what the user asked for, validated, and the constants
it is checked against.

``plugin.options`` fills a :class:`PallasOptions` from pytest's command line and ini file;
the wings (the backend, the checks, the suite, the benchmarks) read it from here. Imports
neither pytest nor JAX.
"""

from __future__ import annotations

import dataclasses
import os
import re

INTERPRETERS = ("tpu", "plain")
DEFAULT_INTERPRETER = "tpu"
# --pallas-interpret's values: the interpreters, and the TPU one for every kernel (none of
# them in the plain path, see checks.plain_equivalence).
TPU_ALWAYS = "tpu-always"
INTERPRETER_CHOICES = ("tpu", TPU_ALWAYS, "plain")
DEFAULT_CHIP = "v5e"
DEFAULT_DEVICES = 8
DEFAULT_TIMEOUT_SECONDS = 300.0
PROFILES = ("ci", "dev", "thorough")
CI_SEED = 0  # the seed of a run under the ci profile that gives no --pallas-seed

# The chip names pltpu.ChipVersion knows across the supported JAX range. Kept
# as strings so that the option can be validated without importing JAX;
# tests/test_jax_compat.py checks this tuple against the installed JAX's enum
# (versions.CHIPS_SINCE_JAX lists the chips an older JAX lacks).
KNOWN_CHIPS = ("v2", "v3", "v4i", "v4", "v5e", "v5p", "v6e", "7", "7x", "8i", "8t")

# The chips the TPU compile check compiles for (the plugin's names; "tpu7x" is
# accepted for "7x"). libtpu also describes v2 and v3, but aborts the whole
# process compiling some Pallas kernels for them (a failed check in its DMA
# descriptors, libtpu 0.0.42.1), so they are left out. compile_check.COMPILER_CHIPS
# maps these to libtpu's names; tests/test_compile_check.py checks the two agree.
COMPILER_CHIPS = ("v4", "v5e", "v5p", "v6e", "7x")

_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


@dataclasses.dataclass(frozen=True)
class PallasOptions:
    """What the user asked for, validated. The single source of truth for the plugin."""

    tpu: bool = False
    gpu: bool = False  # --pallas-gpu: compiled for the GPU JAX sees
    interpreter: str = DEFAULT_INTERPRETER
    # --pallas-interpret=tpu-always: the TPU interpreter runs every kernel, also those the
    # plain path would run no differently (checks.plain_equivalence).
    tpu_interpreter_always: bool = False
    chip: str = DEFAULT_CHIP  # the run's first chip (its only one, but for --pallas-chip=A,B)
    # --pallas-chip: every chip the run stands in for; each test runs once per chip.
    chips: tuple[str, ...] = (DEFAULT_CHIP,)
    chip_given: bool = False
    interpreter_given: bool = False
    interpreter_in_ini: bool = False  # pallas_interpret set in the ini file
    detect_races: bool = False
    devices: int = DEFAULT_DEVICES
    devices_requested: bool = False
    seed: int = 0
    seed_given: bool = False
    examples: int | None = None
    profile: str = "dev"
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    conformance: bool = False
    implementations: tuple[tuple[str, str], ...] = ()
    ops: tuple[str, ...] = ()
    report_path: str | None = None
    # --pallas-sweep-first: the value property's sweep case (1-based) to run before the others.
    sweep_first: int | None = None
    # --pallas-compile: the chips every traced pallas_call is compiled for (empty: off).
    compile_chips: tuple[str, ...] = ()
    compile_given: bool = False
    libtpu: str | None = None  # the installed libtpu's version, None when it cannot be imported
    # --pallas-judge: a finding of the judge's checks fails the implementation's tests.
    judge: bool = False
    # --pallas-numerics: "chip" (matmuls as the stand-in chip computes them) or "exact".
    numerics: str = "chip"

    @property
    def session_opted_in(self) -> bool:
        """Whether a command-line flag asked for Pallas behaviour for every test of the session.

        Ini options only set defaults; ``--pallas-devices`` only sizes the CPU platform.
        """
        return (
            self.tpu
            or self.gpu
            or self.chip_given
            or self.interpreter_given
            or self.detect_races
            or self.conformance
        )

    @property
    def several_chips(self) -> bool:
        """Whether each test runs once per chip (``--pallas-chip=v5e,v6e``)."""
        return len(self.chips) > 1

    @property
    def compiled(self) -> bool:
        """Whether the kernels run compiled on an accelerator (``--pallas-tpu`` or
        ``--pallas-gpu``), not interpreted on the CPU."""
        return self.tpu or self.gpu

    @property
    def interpreter_chosen(self) -> bool:
        """Whether the user chose the interpreter (a flag or the ini file): the suite then
        runs every example in it, instead of its breadth examples in the plain one."""
        return self.interpreter_given or self.interpreter_in_ini or self.detect_races


def device_count_from_xla_flags(environ=os.environ) -> int | None:
    """The simulated CPU device count the user's XLA_FLAGS already set, if any."""
    match = _DEVICE_COUNT_FLAG.search(environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else None
