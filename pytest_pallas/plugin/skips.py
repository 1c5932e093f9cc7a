"""Which Pallas tests skip before they run, and why, in one line each: the plugin's markers
(``tpu_only``, ``interpret_only``, ``tpu_generation``, ``devices``) against the backend the
test would run on."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from .chips import chip_of

if TYPE_CHECKING:
    from ..backend import Backend
    from .session import PallasSession


def skip_reason(session: PallasSession, item: pytest.Item) -> str | None:
    """Why ``item`` skips before it runs, or None."""
    backend = session.backend
    if item.get_closest_marker("tpu_only") and not backend.is_tpu:
        return "tpu_only: needs a real TPU (run with --pallas-tpu on a TPU VM)"
    if item.get_closest_marker("interpret_only") and backend.is_compiled:
        return "interpret_only: runs only in interpret mode on the CPU"
    marker = item.get_closest_marker("tpu_generation")
    if marker is not None and marker.args:
        chips = [str(name) for name in marker.args]
        if backend.is_tpu and backend.chip not in chips:
            return f"tpu_generation: for {', '.join(chips)}, this TPU is {backend.chip}"
        chip = chip_of(item)
        if chip is not None and chip not in chips and set(chips) & set(session.options.chips):
            return f"tpu_generation: for {', '.join(chips)}; this copy stands in for {chip}"
    marker = item.get_closest_marker("devices")
    if marker is not None:
        needed = int(marker.args[0]) if marker.args else int(marker.kwargs.get("n", 1))
        if needed > backend.device_count:
            return device_shortfall(needed, backend, one_device_worker=session.one_device_worker)
    return None


def device_shortfall(needed: int, backend: Backend, *, one_device_worker: bool = False) -> str:
    """Why a test that needs ``needed`` devices skips on ``backend``, and what gives them."""
    if backend.is_compiled:
        kind, flag = ("TPU", "--pallas-tpu") if backend.is_tpu else ("GPU", "--pallas-gpu")
        if one_device_worker:
            return (f"needs {needed} {kind} devices, this pytest-xdist worker holds "
                    f"{backend.device_count} (one {kind} per worker); run it with -n 0 "
                    f"{flag}, which gives one process every device")
        return f"needs {needed} {kind} devices, this host has {backend.device_count}"
    return (
        f"needs {needed} devices, JAX sees {backend.device_count} CPU devices; run with "
        f"--pallas-devices={needed} (JAX must not be initialised before pytest starts)"
    )
