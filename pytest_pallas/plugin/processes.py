"""``--pallas-processes=N``: every test runs in N JAX processes joined by ``jax.distributed``.

The pytest the user started is the controller, as pytest-xdist's is: it collects, prints
the one header and the one summary, writes the one ``--pallas-report``, and runs no test.
It starts N worker pytests with the same arguments (the controller's seed, its share of the
simulated devices each), each ``jax.distributed`` process ``i`` of N on 127.0.0.1 with CPU
(gloo) collectives. The workers run the controller's tests in the controller's order, each
test in every process at once; before each test body they compare what they are about to run
(test id and seed), and a disagreement fails that test with one line. Each worker writes its
reports to a file of its own in an exchange directory; the controller reads them, and gives
each test one verdict: failed when any process failed, each failure under ``process K:``.

A process that dies, or a test that runs past ``--pallas-timeout`` in any process (a
collective some process never reaches waits forever), fails that test naming the processes
that did not finish; the controller then kills every worker (their process groups) and starts
them again from the next test. Workers never outlive the controller.

This module holds the flag, the usage errors and the joining of JAX's processes;
``process_controller`` the controller, ``process_worker`` a worker, ``process_verdicts`` the
merging of reports. The exchange is plain files: each worker appends one JSON line per event to
``results-K.jsonl``; ``order.json`` holds the controller's test ids; ``agree-I-K`` what
process K is about to run as test I.
"""

from __future__ import annotations

import os

import pytest

from ..settings import DEFAULT_DEVICES
from .options import WORKER_SEED_KEY
from .process_controller import (
    COORDINATOR_ENV,
    EXCHANGE_ENV,
    FIRST_TEST_ENV,
    PROCESS_ENV,
    SEED_ENV,
    ProcessController,
)


def requested_processes(config: pytest.Config) -> int:
    """``--pallas-processes``, validated: 1 when not given."""
    value = config.getoption("--pallas-processes", default=None)
    if value is None:
        return 1
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise pytest.UsageError(
            f"--pallas-processes={value!r} must be a whole number of processes, 1 or more; "
            "give e.g. --pallas-processes=2.")
    return count


def worker_process() -> tuple[int, int] | None:
    """``(process, processes)`` in a worker of a ``--pallas-processes`` run, else None."""
    value = os.environ.get(PROCESS_ENV)
    if not value:
        return None
    index, _, count = value.partition("/")
    return int(index), int(count)


def configure(config: pytest.Config) -> None:
    """From ``pytest_cmdline_main``, before pytest_configure: make this process the
    controller or a worker of a ``--pallas-processes`` run (nothing for one process)."""
    worker = worker_process()
    if worker is not None:
        _configure_worker(config, *worker)
        return
    count = requested_processes(config)
    if count == 1:
        return
    _check_combination(config, count)
    config.pluginmanager.register(ProcessController(config, count, _devices(config)),
                                  "pallas-processes")


def _check_combination(config: pytest.Config, count: int) -> None:
    option = config.option
    workers = getattr(option, "numprocesses", None)
    if workers not in (None, 0, "0") or getattr(option, "dist", "no") != "no":
        raise pytest.UsageError(
            f"--pallas-processes={count} runs each test in {count} JAX processes and does not "
            "combine with pytest-xdist's -n/--dist; drop -n and --dist.")
    if option.pallas_tpu or option.pallas_gpu:
        raise pytest.UsageError(
            f"--pallas-processes={count} simulates the hosts of a slice on this CPU; on a "
            "multi-host TPU slice start `pytest --pallas-tpu` on every host instead.")
    devices = _devices(config)
    if devices % count:
        raise pytest.UsageError(
            f"--pallas-devices={devices} cannot be split among --pallas-processes={count}; "
            f"give a multiple of {count} "
            f"(e.g. --pallas-devices={count * max(1, devices // count)}).")


def _devices(config: pytest.Config) -> int:
    value = config.getoption("--pallas-devices", default=None) or config.getini("pallas_devices")
    try:
        return int(value) if value else DEFAULT_DEVICES
    except ValueError:
        return DEFAULT_DEVICES  # the plugin's own option check says what is wrong


def _configure_worker(config: pytest.Config, index: int, count: int) -> None:
    # Like a pytest-xdist worker: the controller's seed; records travel with the reports to
    # the controller, which alone writes the report.
    config.workerinput = {WORKER_SEED_KEY: int(os.environ[SEED_ENV]),
                          "workerid": f"process{index}"}
    join_processes(os.environ[COORDINATOR_ENV], count, index)
    from .process_worker import ProcessWorker

    config.pluginmanager.register(
        ProcessWorker(config, index, count, os.environ[EXCHANGE_ENV],
                      int(os.environ.get(FIRST_TEST_ENV, "0"))), "pallas-process-worker")


def join_processes(coordinator: str, count: int, index: int, *,
                   on_this_host: bool = True) -> None:
    """``jax.distributed.initialize`` before JAX's backends start, and JAX's TPU interpreter
    made to run across the processes. ``on_this_host``: N processes of this CPU, with gloo
    collectives on the loopback interface; else the hosts of a TPU slice."""
    if on_this_host:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from .._compat.interpreter_processes import install_process_local_barriers

    if on_this_host:
        from .._compat.cpu_collectives import gloo_on_loopback

        gloo_on_loopback()
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, count, index)
    # Every process starts its backend now, together: starting one exchanges the devices of
    # all, and a process that ran no test would leave the others waiting in their first.
    jax.devices()
    install_process_local_barriers()
