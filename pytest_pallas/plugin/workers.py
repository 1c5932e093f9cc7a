"""Every core for the conformance suite: pytest-xdist's workers, by default, where installed.

A conformance run is dozens of independent tests, each spending seconds of one core
compiling and interpreting kernels; on a machine with more than one, pytest-xdist's
workers (``-n N``) share them out. When a run asks for the suite of several ops, xdist is
installed and the user chose nothing about it, the plugin sets xdist's ``-n`` before
xdist reads it. The user's choice always wins: ``-n 0`` (or ``-p no:xdist``) runs in one
process, ``-n N`` on N workers, and so does ``PYTEST_XDIST_AUTO_NUM_WORKERS=N``.

Nothing here imports JAX or xdist: it reads options only.
"""

from __future__ import annotations

import os

import pytest

from .. import hosts
from .run_state import run_state

# How many workers the work pays for. Each worker is a process of its own, with its own JAX
# import (2 to 3 s), 8 simulated devices and kernel compilations (about 1 GB at its peak in
# the main job). The main job (18 ops, 46 tests) on a 16-core host: 19.8 s on 4 workers,
# 16.1 s on 8, 17.5 s on 16 (docs/hardware.md): past one worker per two ops, the longest
# tests set the floor and more workers only add start-up and memory.
OPS_PER_WORKER = 2
WORKER_PEAK_BYTES = 2**30
# A run of fewer ops (the fast loop on one kernel) is over before a worker has imported JAX.
MIN_OPS_FOR_WORKERS = 4

def set_default_workers(config: pytest.Config) -> int | None:
    """Give xdist ``-n N`` for a conformance run that did not choose; N, or None if untouched.

    Called from ``pytest_cmdline_main``, before pytest-xdist's own, which turns ``-n`` into
    its workers.
    """
    if not _wanted(config):
        return None
    # xdist's count for -n auto: the cores, or PYTEST_XDIST_AUTO_NUM_WORKERS (then uncapped).
    count = config.hook.pytest_xdist_auto_num_workers(config=config)
    if not os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        count = workers_for_the_work(count, _ops_checked(config),
                                     hosts.free_memory_bytes())
    if count < 2:
        return None  # one worker is one process more for nothing
    config.option.numprocesses = count
    run_state(config).workers_chosen = count
    return count


def workers_for_the_work(cores: int, ops: int, memory_bytes: int | None) -> int:
    """Workers for a suite of ``ops`` ops: one per core, one per two ops, and no more than
    the memory holds (at about 1 GB each)."""
    count = min(cores, -(-ops // OPS_PER_WORKER))
    if memory_bytes is not None:
        count = min(count, max(1, memory_bytes // WORKER_PEAK_BYTES))
    return count


def header_note(config: pytest.Config) -> str | None:
    """The header's line saying the plugin started workers, and how to run in one process."""
    count = run_state(config).workers_chosen
    if count is None:
        return None
    return (f"pallas: the conformance suite runs on {count} pytest-xdist workers (one per core, at "
            "most one per two ops); -n 0 runs it in one process")


def hands_tests_to_workers(config: pytest.Config) -> bool:
    """Whether this process is pytest-xdist's controller of workers, which run every test
    (read after xdist's own ``pytest_cmdline_main`` turned ``-n`` into ``--dist``/``--tx``)."""
    option = config.option
    return (not hasattr(config, "workerinput") and getattr(option, "dist", "no") != "no"
            and bool(getattr(option, "tx", None)))


def import_hypothesis_while_workers_start() -> None:
    """On the controller, once its workers are launched: import Hypothesis now.

    The controller runs no test and leaves Hypothesis unimported, but Hypothesis's own
    pytest plugin imports it in its terminal summary, after the last test: 0.7 s on the
    run's critical path, where the workers have finished and nothing else runs. Right after
    pytest-xdist's ``pytest_sessionstart`` the workers are still importing JAX (seconds)
    and send nothing the controller must answer, so the import costs the run nothing here.
    It runs on the main thread: an import on a thread of its own raced the main thread's
    imports (a module another thread is still initialising is handed over half made).
    """
    import hypothesis  # noqa: F401


def _wanted(config: pytest.Config) -> bool:
    option = config.option
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return False
    if getattr(option, "numprocesses", None) is not None:
        return False  # -n given, 0 included
    if getattr(option, "dist", "no") != "no" or getattr(option, "tx", None):
        return False  # --dist or --tx: the user is setting xdist up
    if (option.collectonly or getattr(option, "usepdb", False)
            or getattr(option, "trace", False)):
        return False
    if accelerator_platform(config) is not None or getattr(option, "benchmark_only", False):
        # On the accelerator, workers follow the devices (one_device_per_worker);
        # benchmarks want the machine to themselves.
        return False
    return _ops_checked(config) >= MIN_OPS_FOR_WORKERS


def _ops_checked(config: pytest.Config) -> int:
    """How many ops the run's suite checks, counted from its flags (validated later, by the
    controller's ``pytest_configure``, before any worker starts)."""
    ops = {name.strip() for name in (config.getoption("--pallas-ops") or "").split(",")
           if name.strip()}
    impls = {value.partition("=")[0].strip() for value in config.getoption("--pallas-impl")}
    if impls:
        return len(impls & ops if ops else impls)
    if ops:
        return len(ops)
    if not config.getoption("--pallas-conformance"):
        return 0
    from ..ops.registry import OP_NAMES  # no JAX; the run's configure imports it anyway

    return len(OP_NAMES)


# --- one device per worker, on an accelerator ------------------------------------------

def accelerator_platform(config: pytest.Config) -> str | None:
    """``"tpu"`` or ``"gpu"`` for a run on the accelerator, None for an interpreted run."""
    if config.option.pallas_tpu:
        return "tpu"
    if config.option.pallas_gpu:
        return "gpu"
    return None


def one_device_per_worker(config: pytest.Config, host=None) -> int | None:
    """On the controller of an accelerator run with ``-n N``: never more workers than the
    host's devices. Returns the worker count it set, or None when it changed nothing.

    Called from ``pytest_cmdline_main``, before pytest-xdist's own reads ``-n``.
    """
    platform = accelerator_platform(config)
    option = config.option
    requested = getattr(option, "numprocesses", None)
    if platform is None or hasattr(config, "workerinput") or not requested:
        return None
    host = host if host is not None else hosts.host_accelerators()
    if host.platform != platform:
        return None  # the backend's own check says JAX sees none, before collection
    if requested in ("auto", "logical"):
        requested = host.count
    count, note = hosts.workers_for_devices(int(requested), host)
    option.numprocesses = count
    run_state(config).device_split = note or (
        f"{count} pytest-xdist workers, one {platform.upper()} each ({host.variable})")
    return count


def take_this_workers_device(config: pytest.Config, host=None, environ=os.environ) -> None:
    """On a pytest-xdist worker of an accelerator run, before JAX starts: see only the
    worker's own device (its number among the host's devices)."""
    index = hosts.worker_index(environ)
    if accelerator_platform(config) is None or index is None:
        return
    host = host if host is not None else hosts.host_accelerators(environ)
    environ.update(hosts.worker_device_environment(host, index))


def device_split_note(config: pytest.Config) -> str | None:
    """The header's line saying how the workers split the devices."""
    note = run_state(config).device_split
    return f"pallas: {note}" if note else None
