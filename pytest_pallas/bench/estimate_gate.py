"""The regression gate's noise-free half: the TPU compiler's estimates, baseline against current.

``pallas_benchmark`` with libtpu records per chip ``extra_info["tpu_estimate"]``
(``bench.benchmark_estimate``). The estimate is deterministic: the same kernel,
arguments, chip, jax and libtpu give the same numbers, so any change is the
kernel's. Per benchmark, chip and kernel, these metrics of one call are judged:

``seconds``        the estimated time
``cycles``         critical path per step x grid steps
``hbm_bytes``      bytes the pipeline copies, per step x grid steps
``spills``         spill stores and fill loads per step x grid steps

A metric more than ``max_change`` times its baseline is a regression, named with
the kernel, the metric and the change. When the jax or libtpu version differs
between the runs, nothing is compared and one line says to save a new baseline:
a compiler upgrade moves the schedule, never the kernel's fault.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

DEFAULT_MAX_CHANGE = 1.05

METRICS = ("seconds", "cycles", "hbm_bytes", "spills")


@dataclasses.dataclass(frozen=True)
class EstimateVerdict:
    benchmark: str
    chip: str
    kernel: str
    metric: str
    baseline: float
    current: float

    @property
    def change(self) -> float:
        return self.current / self.baseline if self.baseline else float("inf")

    def line(self) -> str:
        return (f"ESTIMATE REGRESSED {self.benchmark} on {self.chip}: kernel {self.kernel!r} "
                f"{self.metric} {_number(self.baseline)} -> {_number(self.current)} "
                f"({self.change:.2f}x)")


def _number(value: float) -> str:
    return f"{value:.3g}"


def estimates_of(path: str) -> dict[str, tuple[str | None, dict[str, Any]]]:
    """Per benchmark of a pytest-benchmark JSON file: (jax version, tpu_estimate by chip)."""
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    found = {}
    for entry in document.get("benchmarks") or []:
        info = entry.get("extra_info") or {}
        if info.get("tpu_estimate"):
            found[entry.get("fullname") or entry.get("name")] = (info.get("jax"),
                                                                 info["tpu_estimate"])
    return found


def metrics_of(kernel: dict[str, Any]) -> dict[str, float]:
    """One kernel's judged metrics for one call (those it could read)."""
    steps = kernel.get("grid_steps") or 1
    per_call = {
        "seconds": kernel.get("seconds"),
        "cycles": kernel.get("critical_path_per_step"),
        "hbm_bytes": kernel.get("dma_bytes_per_step"),
        "spills": kernel.get("spills"),
    }
    return {name: float(value) * (1 if name == "seconds" else steps)
            for name, value in per_call.items() if value is not None}


def judge_estimates(baseline: dict[str, tuple[str | None, dict[str, Any]]],
                    current: dict[str, tuple[str | None, dict[str, Any]]],
                    max_change: float = DEFAULT_MAX_CHANGE
                    ) -> tuple[list[EstimateVerdict], int, list[str]]:
    """(regressions, metrics compared, one-line notes: re-baselines and what was skipped)."""
    regressions: list[EstimateVerdict] = []
    notes: list[str] = []
    compared = 0
    for name, (jax_now, chips_now) in current.items():
        if name not in baseline:
            continue
        jax_then, chips_then = baseline[name]
        for chip, now in chips_now.items():
            then = chips_then.get(chip)
            if not then or "kernels" not in then or "kernels" not in now:
                continue
            versions_then = (jax_then, then.get("libtpu"))
            versions_now = (jax_now, now.get("libtpu"))
            if versions_then != versions_now:
                notes.append(
                    f"estimates not compared: jax {versions_then[0]} / libtpu "
                    f"{versions_then[1]} in the baseline, jax {versions_now[0]} / libtpu "
                    f"{versions_now[1]} now; save a new baseline with these versions")
                continue
            if len(then["kernels"]) != len(now["kernels"]):
                notes.append(f"{name} on {chip}: {len(then['kernels'])} kernels in the baseline, "
                             f"{len(now['kernels'])} now; estimates not compared")
                continue
            for before, after in zip(then["kernels"], now["kernels"]):
                old, new = metrics_of(before), metrics_of(after)
                for metric in METRICS:
                    if metric not in old or metric not in new:
                        continue
                    compared += 1
                    verdict = EstimateVerdict(name, chip, str(after.get("name")), metric,
                                              old[metric], new[metric])
                    if new[metric] > old[metric] * max_change:
                        regressions.append(verdict)
    return regressions, compared, sorted(set(notes))


def report(regressions: list[EstimateVerdict], compared: int, notes: list[str],
           max_change: float) -> list[str]:
    """The lines the gate prints for the estimates (none when there were none to compare)."""
    if not compared and not notes:
        return []
    lines = [verdict.line() for verdict in regressions] + notes
    if compared:
        lines.append(f"estimate gate: {len(regressions)} regressed of {compared} metrics compared "
                     f"(a regression: more than {max_change:g}x the baseline's TPU estimate)")
    return lines
