"""libtpu's start-up environment on a host without a TPU: quiet, and shared by processes.

Its own small module because the plugin sets it in every run, before anything
starts JAX, and loading the compile check for that would import JAX's
compatibility layer into test suites that never use Pallas.
"""

from __future__ import annotations

import os
from typing import Any

from ..hosts import host_has_tpu

# libtpu, loaded on a host without a TPU, prints warnings about the TPU hosts
# and workers it cannot find (its metadata lookups); these answers silence them
# and change nothing of what it compiles. ALLOW_MULTIPLE_LIBTPU_LOAD: every
# pytest process (xdist workers, inner runs) loads libtpu, which otherwise takes
# a machine-wide lock; here it only compiles.
QUIET_LIBTPU = {
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_HOST_BOUNDS": "1,1,1",
}


def quiet_libtpu_environment_for(libtpu: str | None, environ: Any = os.environ) -> None:
    """Set ``QUIET_LIBTPU`` where the user has not, when ``libtpu`` (its version, None when
    not installed) is installed and no TPU is present (the runtime then needs its own view
    of the host)."""
    if libtpu is None or host_has_tpu():
        return
    for name, value in QUIET_LIBTPU.items():
        environ.setdefault(name, value)
