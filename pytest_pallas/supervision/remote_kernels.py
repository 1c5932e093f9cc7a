"""Kernels that JAX's interpreters cannot run across processes: under ``--pallas-processes``,
a kernel that copies to or signals a device of another process skips its test with one line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .._compat.interpreter_processes import remote_device_operations
from .._compat.pallas_call_hooks import observe_pallas_calls
from .._compat.pytest_internals import skip_at_test


def _skip_remote_kernel(params: dict[str, Any]) -> None:
    found = remote_device_operations(params.get("jaxpr"))
    if found:
        skip_at_test(
            f"a kernel copies to or signals another device ({', '.join(sorted(set(found)))}), "
            "which JAX's interpreters run only within one process: run it with "
            "--pallas-processes=1")


@contextlib.contextmanager
def remote_kernels_skipped() -> Iterator[None]:
    """Inside the block, a traced kernel with a remote DMA or semaphore signal skips the test."""
    with observe_pallas_calls(_skip_remote_kernel):
        yield
