"""The hosts of a multi-host TPU slice, read from the TPU environment without JAX.

The facts are the ones JAX's own cluster detection reads (``jax/_src/clusters/
cloud_tpu_cluster.py``): ``TPU_PROCESS_ADDRESSES`` or ``TPU_WORKER_HOSTNAMES`` (the hosts of
one slice, in process order), ``TPU_WORKER_ID`` (this host among them), and for several
slices ``MEGASCALE_NUM_SLICES`` / ``MEGASCALE_SLICE_ID``. JAX also reads a Cloud TPU VM's
metadata server, which this module does not: on such a VM without those variables the
slice is not detected, and ``jax.distributed.initialize()`` is not called by the plugin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class SliceHosts:
    """This host's place among the hosts of a slice (or of several slices)."""

    process: int  # this host's jax.distributed process id
    processes: int  # hosts in all
    hosts: tuple[str, ...]  # the hosts of this host's slice, process 0's first

    @property
    def describe(self) -> str:
        return f"host {self.process} of {self.processes} of a multi-host TPU slice"


def slice_hosts(environ: Mapping[str, str]) -> SliceHosts | None:
    """The slice this host is part of; None on a single host or without the facts."""
    listed = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES")
    if not listed:
        return None
    hosts = tuple(host.strip() for host in listed.split(",") if host.strip())
    try:
        worker = int(environ.get("TPU_WORKER_ID", ""))
        slices = int(environ.get("MEGASCALE_NUM_SLICES") or 1)
        slice_id = int(environ.get("MEGASCALE_SLICE_ID") or 0)
    except ValueError:
        return None
    processes = len(hosts) * slices
    if processes < 2 or not 0 <= worker < len(hosts):
        return None
    return SliceHosts(process=worker + slice_id * len(hosts), processes=processes, hosts=hosts)
