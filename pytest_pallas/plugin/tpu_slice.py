"""``pytest --pallas-tpu`` started on every host of a multi-host TPU slice.

Each host's pytest joins the others with ``jax.distributed.initialize()`` (JAX's own
detection of the slice) before JAX's backend starts, then takes process 0's seed and
process 0's tests in process 0's order, broadcast with ``jax.experimental.multihost_utils``
(collectives over the slice). A host that lacks one of process 0's tests stops every host
with one line before any test runs. Process 0 writes ``--pallas-report``; the others send
nothing and write none (their terminals show their own verdicts, as jobs on a slice log).
"""

from __future__ import annotations

import json
import os
import random

import pytest

from ..slice_hosts import SliceHosts, slice_hosts
from .options import WORKER_SEED_KEY
from .processes import join_processes


def configure(config: pytest.Config) -> SliceHosts | None:
    """From ``pytest_cmdline_main``: join the slice's hosts, if this is one of several."""
    hosts = slice_hosts(os.environ)
    if hosts is None:
        return None
    if getattr(config.option, "numprocesses", None) not in (None, 0, "0"):
        raise pytest.UsageError(
            f"on a multi-host TPU slice ({hosts.describe}) every host runs each test once, "
            "in one process; drop pytest-xdist's -n.")

    # JAX's own default (jax/_src/clusters/cloud_tpu_cluster.py): process 0's host, port
    # 8482; JAX_COORDINATOR_ADDRESS, when set, wins in jax.distributed as it does in JAX.
    coordinator = os.environ.get("JAX_COORDINATOR_ADDRESS") or f"{hosts.hosts[0]}:8482"
    join_processes(coordinator, hosts.processes, hosts.process, on_this_host=False)
    seed = agreed_seed(config.getoption("--pallas-seed"))
    config.option.pallas_seed = str(seed)
    if hosts.process != 0:
        # Like a pytest-xdist worker: process 0 alone writes the report.
        config.workerinput = {WORKER_SEED_KEY: seed, "workerid": f"host{hosts.process}"}
    config.pluginmanager.register(SliceOrder(hosts), "pallas-tpu-slice")
    return hosts


def agreed_seed(given: str | None) -> int:
    """Process 0's seed (its --pallas-seed, or its draw), on every host."""
    import numpy as np
    from jax.experimental import multihost_utils

    mine = int(given) if given is not None else random.SystemRandom().randrange(2**31)
    return int(multihost_utils.broadcast_one_to_all(np.int64(mine)))


def agreed_order(nodeids: list[str]) -> tuple[list[str], list[int]]:
    """Process 0's test ids, and how many of them each host lacks."""
    import numpy as np
    from jax.experimental import multihost_utils

    encoded = np.frombuffer(json.dumps(nodeids).encode(), dtype=np.uint8)
    length = int(multihost_utils.broadcast_one_to_all(np.int64(len(encoded))))
    padded = np.zeros(length, dtype=np.uint8)
    padded[:min(length, len(encoded))] = encoded[:length]
    order = json.loads(bytes(multihost_utils.broadcast_one_to_all(padded)).decode())
    lacking = len(set(order) - set(nodeids))
    counts = multihost_utils.process_allgather(np.int64(lacking))
    return order, [int(count) for count in np.ravel(counts)]


class SliceOrder:
    """Every host runs process 0's tests in process 0's order."""

    def __init__(self, hosts: SliceHosts) -> None:
        self.hosts = hosts

    def pytest_report_header(self) -> str:
        return (f"pallas: {self.hosts.describe}, joined by jax.distributed; process 0's seed "
                "and tests")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        order, lacking = agreed_order([item.nodeid for item in items])
        short = [f"host {host} lacks {count}" for host, count in enumerate(lacking) if count]
        if short:
            raise pytest.UsageError(
                f"the hosts of the slice collected different tests ({', '.join(short)} of "
                "process 0's); start the same pytest command in the same checkout on every host.")
        by_id = {item.nodeid: item for item in items}
        items[:] = [by_id[nodeid] for nodeid in order]
