"""The TPU compiler's estimate beside a benchmark's CPU time: ``extra_info["tpu_estimate"]``.

On a CPU, ``pallas_benchmark`` times the interpreter, which says nothing of the
chip. Where libtpu is installed, the chips of the compile check (the run's chip
by default, every chip with ``--pallas-compile=all``, none with
``--pallas-compile=none``) each get ``pytest_pallas.estimate`` of the kernel:
per chip ``{"seconds", "chip", "libtpu", "kernels": [...]}`` (the fields of
``KernelEstimate``), or ``{"error": "..."}`` in one line when it could not be
estimated. The benchmark table shows the seconds as "<chip> est.".

No JAX at import time: the plugin's table code imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .estimate import EstimateUnavailable, estimate


def tpu_estimates(fn: Callable[..., Any], args: Sequence[Any],
                  chips: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``extra_info["tpu_estimate"]``: per chip, the estimate of ``fn(*args)`` or its error."""
    found: dict[str, dict[str, Any]] = {}
    for chip in chips:
        try:
            est = estimate(fn, *args, chip=chip)
        except EstimateUnavailable as error:
            found[chip] = {"error": str(error)}
            continue
        found[chip] = {"seconds": est.seconds, "chip": est.chip, "libtpu": est.libtpu,
                       "kernels": [kernel.as_dict() for kernel in est.kernels]}
    return found


def estimate_columns(records: list[dict[str, Any]]) -> list[str]:
    """The chips any record has an estimate for, in the order first seen."""
    chips: list[str] = []
    for record in records:
        for chip in record.get("tpu_estimate") or {}:
            if chip not in chips:
                chips.append(chip)
    return chips


def estimate_cell(record: dict[str, Any], chip: str, format_seconds: Callable[[float], str]) -> str:
    """One record's "<chip> est." cell: the seconds, or "-" when there is none."""
    entry = (record.get("tpu_estimate") or {}).get(chip) or {}
    seconds = entry.get("seconds")
    return "-" if seconds is None else format_seconds(seconds)
