"""The plugin's state for one pytest run: options, the lazily chosen backend, per-test activation.

The backend is created on first use so that a run with no Pallas test never
imports JAX. A test *uses Pallas* when it carries one of the plugin's
markers, requests one of its fixtures, belongs to the conformance suite, or
when the session opted in (any backend flag on the command line, or the ini
option ``pallas_scope = all``).
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from typing import TYPE_CHECKING, Any

import pytest

from .. import hosts
from ..settings import PallasOptions
from ..suite.membership import conformance_op_name, is_conformance_item
from .chips import chip_of
from .run_state import RunState

if TYPE_CHECKING:  # imported where used: a run without Pallas tests loads none of them
    from ..backend import Backend
    from ..supervision.kernel_run import KernelRun

MARKERS = {
    "pallas": "the test runs Pallas kernels: interpret them on the CPU, "
              "compile them on --pallas-tpu.",
    "tpu_only": "run only with --pallas-tpu on a real TPU (skipped in interpret mode).",
    "interpret_only": "run only in interpret mode on the CPU (skipped on a real TPU).",
    "tpu_generation(*chips)": "the test is for these TPU generations: on a TPU, skipped on "
    "others; on the CPU, run standing in for the first one unless --pallas-chip is one of them.",
    "devices(n)": "the test needs n devices: skipped, with the reason, when fewer are available.",
}
MARKER_NAMES = tuple(spec.split("(")[0] for spec in MARKERS)
FIXTURE_NAMES = ("pallas_backend", "pallas_key", "device_mesh", "pallas_benchmark")



@dataclasses.dataclass
class PallasSession:
    options: PallasOptions
    scope_all: bool = False
    invocation: tuple[str, ...] = ()
    devices_note: str | None = None
    devices_requested_count: int | None = None  # what ensure_devices got JAX to simulate
    implementations: dict = dataclasses.field(default_factory=dict)
    conformance_ops: tuple[str, ...] = ()
    _recorder: Any = None  # the conformance recorder, once made (``recorder``)
    # Why the conformance report is incomplete: a crashed worker, an interruption, ...
    incomplete_reasons: list[str] = dataclasses.field(default_factory=list)
    # The Hypothesis profile that was active before the plugin loaded its own.
    hypothesis_profile_before: str | None = None
    # Where this run's JAX runs (hosts.PlatformDecision), once keep_jax_on_cpu decided.
    platform_decision: Any = None
    # The platform JAX had started on before the plugin could keep it on the CPU, if not it.
    jax_started_on: str | None = None
    # A pytest-xdist worker of an accelerator run, which sees one device of the host's.
    one_device_worker: bool = False
    # What the run has done so far that later hooks read (plugin.run_state).
    run: RunState = dataclasses.field(default_factory=RunState)
    _backend: Backend | None = None
    # The test files whose tests ran GPU kernels so far (KernelRun: their next tests start
    # with the GPU's numbers).
    _gpu_kernel_files: set = dataclasses.field(default_factory=set)

    # --- the conformance report ----------------------------------------------

    @property
    def recorder(self) -> Any:
        """What the conformance tests of this process recorded, made on first use: a run
        with a Pallas flag makes it at configure, a run without one when a conformance test
        (a user's ``conformance_tests`` class) first needs it, and a run with neither never
        imports its modules."""
        if self._recorder is None:
            from ..suite.report import ConformanceRecorder

            self._recorder = ConformanceRecorder()
        return self._recorder

    @property
    def recording(self) -> bool:
        """Whether this process made its conformance recorder (see ``recorder``)."""
        return self._recorder is not None

    # --- which tests are ours -------------------------------------------------

    def uses_pallas(self, item: pytest.Item) -> bool:
        if self.scope_all or self.options.session_opted_in or is_conformance_item(item):
            return True
        if any(item.get_closest_marker(name) for name in MARKER_NAMES):
            return True
        return any(name in getattr(item, "fixturenames", ()) for name in FIXTURE_NAMES)

    # --- the backend ------------------------------------------------------------

    def keep_jax_on_cpu(self) -> None:
        """Before JAX starts, in a run that interprets its kernels: JAX on the CPU only, on
        every host (see ``hosts``); the user's JAX_PLATFORMS wins."""
        if self.platform_decision is not None or self.options.compiled:
            return

        self.platform_decision = hosts.keep_jax_on_cpu(os.environ, hosts.host_accelerators())
        if not self.platform_decision.by_user:
            from .._compat import jax_internals

            self.jax_started_on = jax_internals.restrict_imported_jax_to_cpu()

    @property
    def header_shown(self) -> bool:
        """Whether pytest's header has the plugin's lines: a Pallas flag, ``pallas_scope =
        all`` or ``--pallas-compile`` (else the run says where JAX runs after collection)."""
        options = self.options
        return options.session_opted_in or self.scope_all or options.compile_given

    def platform_lines(self) -> list[str]:
        """What the header says of where JAX runs (nothing on a CPU-only host)."""
        lines = []
        decision = self.platform_decision
        if decision is not None and decision.note:
            lines.append(f"pallas: {decision.note}")
        if self.jax_started_on is not None:
            lines.append(
                f"pallas: JAX had started on the {self.jax_started_on.upper()} before "
                "pytest-pallas could keep it on the CPU (a conftest or plugin made arrays "
                "when it was imported): Pallas tests run with CPU arrays, but the "
                f"{self.jax_started_on.upper()} is in use; set JAX_PLATFORMS=cpu before "
                "pytest to interpret on the CPU alone")
        return lines

    def undo_keep_jax_on_cpu(self) -> None:
        if self.platform_decision is not None:
            hosts.undo_keep_jax_on_cpu(os.environ, self.platform_decision)

    def ensure_devices(self) -> None:
        """Before JAX starts: the modules it reads from (``hosts``, ``libtpu_environment``)
        import no JAX."""
        from ..checks.libtpu_environment import quiet_libtpu_environment_for

        if self.devices_note is None:
            self.keep_jax_on_cpu()
            # Before JAX starts: libtpu, when installed, loads with JAX's backends.
            quiet_libtpu_environment_for(hosts.installed_libtpu(), os.environ)
            self.devices_requested_count, self.devices_note = hosts.request_cpu_devices(
                self.options.devices, os.environ)

    def simulated_devices(self) -> int | None:
        """How many CPU devices the run's tests saw; None on a TPU, or when no Pallas test
        ran here. pytest-xdist's controller, which runs no test, answers with the count it
        asked its workers' JAX for (they inherit its environment) instead of starting JAX."""
        if self._backend is not None:
            return None if self._backend.is_tpu else self._backend.device_count
        return None if self.options.compiled else self.devices_requested_count

    @property
    def backend_if_made(self) -> Backend | None:
        """The backend, if a test of this process needed it (never starts JAX)."""
        return self._backend

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            from ..backend import select_backend

            if not self.options.compiled:
                self.ensure_devices()
            self._backend = select_backend(self.options)
        return self._backend

    def backend_for(self, item: pytest.Item) -> Backend:
        """The session's backend, standing in for the test's own chip (a run of several
        chips), or for the chip a ``tpu_generation`` marker asks for."""
        backend = self.backend
        if backend.numerics == "chip" and is_conformance_item(item):
            # The suite judges with its own error model, fitted to float32 products on the
            # CPU: rounding there would hide the seeded bugs it catches (docs/tpu-fidelity.md).
            backend = dataclasses.replace(backend, numerics="exact")
        if backend.is_tpu:
            return backend
        chip = chip_of(item) or backend.chip
        marker = item.get_closest_marker("tpu_generation")
        if marker is not None and marker.args:
            chips = [str(name) for name in marker.args]
            if chip not in chips and not (self.options.several_chips
                                          and set(chips) & set(self.options.chips)):
                chip = chips[0]
        return self._standing_in_for(backend, chip)

    def _standing_in_for(self, backend: Backend, chip: str) -> Backend:
        if chip == backend.chip:
            return backend
        from ..backend import chip_info, make_interpret_params

        info = chip_info(chip)
        return dataclasses.replace(backend, chip=chip, tpu_info=info,
                                   interpret_params=make_interpret_params(self.options, info))

    # --- per test ---------------------------------------------------------------

    def declares_chip_under_test(self, item: pytest.Item, backend: Backend) -> str | None:
        """Which of ``item``'s own device questions get the stand-in chip's answers, in an
        opted-in run interpreting for a TPU: ``"device"``, all of them; ``"generation"``,
        only which TPU generation, for a test written to run interpreted on the CPU (JAX's
        ``INTERPRET = True`` classes, which skip themselves off the CPU and gate operations
        on the generation they interpret for); None outside such a run."""
        if backend.is_compiled or not (self.options.session_opted_in or self.scope_all):
            return None
        return "generation" if written_for_the_interpreter(item) else "device"

    def open_kernel_run(self, item: pytest.Item) -> KernelRun:
        """At a Pallas test's setup: its ``KernelRun`` (``supervision.kernel_run``), opened."""
        # The backend first: JAX's devices are fixed before the run's modules import it.
        run = self._new_kernel_run(item, self.backend_for(item))
        item.stash[KERNEL_RUN_KEY] = run
        if run.compile_chips() and self.run.compiles_before is None:
            self._remember_compiles_before()
        run.open()
        return run

    def _remember_compiles_before(self) -> None:
        """At the run's first test the TPU compiler check compiles for: the check's totals so
        far (an in-process run shares its counters with the run around it)."""
        from ..checks.compile_check import STATS

        self.run.compiles_before = (STATS.compiles, STATS.cached, STATS.seconds)

    def _new_kernel_run(self, item: pytest.Item, backend: Backend) -> KernelRun:
        from ..supervision.kernel_run import KernelRun

        conformance = is_conformance_item(item)
        op_name = conformance_op_name(item) if conformance else None
        if op_name is not None and self.options.several_chips:
            op_name = f"{op_name} [{backend.chip}]"  # the report's row of this chip's copy
        # A conformance test's report records whether its op's kernels compiled.
        return KernelRun(item, backend, self.options, conformance=conformance,
                         chip_under_test=self.declares_chip_under_test(item, backend),
                         # Never compiled for a chip (they skip off the CPU): no compile check.
                         compile_check=not written_for_the_interpreter(item),
                         gpu_kernel_files=self._gpu_kernel_files,
                         on_compile_verdict=None if op_name is None else (
                             lambda verdict: self.recorder.compiled(op_name, verdict)))

    def close_kernel_run(self, item: pytest.Item) -> None:
        """At a Pallas test's teardown: its ``KernelRun`` closed (kept for the report)."""
        run = item.stash.get(KERNEL_RUN_KEY, None)
        if run is not None:
            run.close()

    def kernel_run(self, item: pytest.Item) -> KernelRun:
        """``item``'s ``KernelRun``; one that entered nothing if its setup did not open one."""
        run = item.stash.get(KERNEL_RUN_KEY, None)
        if run is None:
            run = item.stash[KERNEL_RUN_KEY] = self._new_kernel_run(item, self.backend_for(item))
        return run

    def item_backend(self, item: pytest.Item) -> Backend:
        """The backend of ``item``'s kernels (``backend_for`` before its run opened)."""
        run = item.stash.get(KERNEL_RUN_KEY, None)
        return run.backend if run is not None else self.backend_for(item)

    def key_seed(self, nodeid: str) -> int:
        """A per-test seed: stable across processes and workers for the same --pallas-seed."""
        return (self.options.seed * 1_000_003 + zlib.crc32(nodeid.encode())) % 2**31


def written_for_the_interpreter(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to a test class written to run interpreted on the CPU only
    (JAX's ``INTERPRET = True`` classes, which skip themselves anywhere else)."""
    return getattr(getattr(item, "cls", None), "INTERPRET", None) is True


# The run's PallasSession, in pytest's config.
SESSION_KEY = pytest.StashKey[PallasSession]()
# A Pallas test's KernelRun, from its setup on.
KERNEL_RUN_KEY = pytest.StashKey["KernelRun"]()


def session_of(config: pytest.Config) -> PallasSession:
    """The run's ``PallasSession`` (set by the plugin's ``pytest_configure``)."""
    return config.stash[SESSION_KEY]
