"""Draw a roofline plot from a saved pytest-benchmark JSON of ``pallas_benchmark`` results.

    python -m pytest_pallas.roofline_plot BENCH.json -o roofline.svg

Log-log axes: arithmetic intensity (FLOPs per HBM byte, from each op's cost
model) against achieved FLOP/s. The chip's roofline is drawn as
``min(peak FLOP/s, intensity x peak bytes/s)``; each kernel is a filled dot,
the XLA version timed in the same run an open circle at the same intensity,
joined to it by a thin line; where the run had libtpu, an open diamond places
the kernel by the TPU compiler's estimate for the chip (``tpu_estimate``),
joined by a dashed line. Kernels that do no arithmetic (copies,
collectives) have no place on these axes and are listed under the plot with
their fraction of the bandwidth roof. The format follows the output's suffix
(``.svg``, ``.png``, ``.pdf``).

Needs matplotlib (``pip install 'pytest-pallas[plot]'``); without it the
command prints one line saying so and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

MISSING_MATPLOTLIB = (
    "roofline_plot needs matplotlib: pip install 'pytest-pallas[plot]' (or pip install matplotlib)"
)


def load_points(path: str) -> list[dict[str, Any]]:
    """The benchmarks of ``path`` that carry ``pallas_benchmark``'s cost and roofline facts."""
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    points = []
    for entry in document.get("benchmarks", []):
        info = entry.get("extra_info") or {}
        if "peak_flops_per_second" not in info:
            continue
        points.append({"name": entry.get("name") or entry.get("fullname"),
                       "median": entry["stats"]["median"], **info})
    return points


def _percent(fraction: float | None) -> str:
    if fraction is None:
        return "-"
    return f"{fraction:.1%}" if fraction >= 0.001 else f"{fraction:.1e}"


def draw(points: list[dict[str, Any]], output: str, *, title: str | None = None) -> None:
    """Write the plot of ``points`` to ``output``; raises ImportError without matplotlib."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    from matplotlib.lines import Line2D

    figure = Figure(figsize=(11, 6), layout="constrained")
    axes = figure.add_subplot()
    axes.set_xscale("log")
    axes.set_yscale("log")
    plotted = [p for p in points if p.get("flops") and p.get("arithmetic_intensity")]
    no_flops = [p for p in points if not p.get("flops")]

    intensities = [p["arithmetic_intensity"] for p in plotted] or [1.0]
    low, high = min(intensities) / 4, max(intensities) * 4
    roofs = {(p["peak_flops_per_second"], p["peak_bytes_per_second"], p.get("chip"),
              p.get("devices") or 1) for p in plotted}
    for peak_flops, peak_bytes, chip, devices in sorted(roofs, key=str):
        ridge = peak_flops / peak_bytes
        left, right = min(low, ridge / 8), max(high, ridge * 8)
        where = f"TPU {chip}" + (f" x{devices} devices" if devices > 1 else "")
        axes.plot([left, ridge, right], [left * peak_bytes, peak_flops, peak_flops],
                  color="black", linewidth=1.5,
                  label=f"{where} roofline: {peak_flops / 1e12:.0f} TFLOP/s, "
                  f"{peak_bytes / 1e9:.0f} GB/s")

    colors = [f"C{i % 10}" for i in range(len(plotted))]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    for index, (point, color) in enumerate(zip(plotted, colors)):
        marker = markers[index // 10 % len(markers)]
        x = point["arithmetic_intensity"]
        y = point["achieved_flops_per_second"]
        label = f"{point['name']} ({_percent(point.get('fraction_of_roofline'))} of roofline)"
        axes.scatter([x], [y], color=color, marker=marker, s=45, zorder=3, label=label)
        if point.get("xla_median"):
            y_xla = point["flops"] / point["xla_median"]
            axes.scatter([x], [y_xla], facecolors="none", edgecolors=color, marker=marker,
                         s=45, zorder=3)
            axes.plot([x, x], [y, y_xla], color=color, linewidth=0.8, alpha=0.6)
        estimated = _estimated_seconds(point)
        if estimated:
            # Where the TPU compiler's schedule puts the kernel on the chip this roof is for.
            y_est = point["flops"] / estimated
            axes.scatter([x], [y_est], facecolors="none", edgecolors=color, marker="d",
                         s=60, zorder=3)
            axes.plot([x, x], [y, y_est], color=color, linewidth=0.8, alpha=0.6,
                      linestyle="dashed")

    axes.set_xlabel("arithmetic intensity (FLOPs per HBM byte, from the cost model)")
    axes.set_ylabel("achieved FLOP/s (median time)")
    interpreted = any(not p.get("roofline_meaningful") for p in points)
    axes.set_title(title or (
        "Pallas kernels (filled) and the XLA version timed in the same run (open)"
        + ("\ninterpreted on the CPU: far below the roof of the TPU it stands in for"
           if interpreted else "")))
    axes.grid(True, which="major", alpha=0.3)
    handles, labels = axes.get_legend_handles_labels()
    handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none",
                          markeredgecolor="gray"))
    labels.append("open: the XLA version")
    if any(_estimated_seconds(p) for p in plotted):
        handles.append(Line2D([], [], linestyle="none", marker="d", markerfacecolor="none",
                              markeredgecolor="gray"))
        labels.append("open diamond: the TPU compiler's estimate for the chip")
    axes.legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    if no_flops:
        lines = ["no arithmetic (bandwidth only):"] + [
            f"  {p['name']}: {p.get('achieved_bytes_per_second', 0) / 1e9:.3g} GB/s, "
            f"{_percent(p.get('fraction_of_roofline'))} of the bandwidth roof" for p in no_flops]
        figure.text(0.01, 0.01, "\n".join(lines), fontsize="small", family="monospace",
                    va="bottom")
        bottom = 0.03 + 0.03 * len(lines)
        figure.get_layout_engine().set(rect=(0, bottom, 1, 1 - bottom))
    figure.savefig(output)


def _estimated_seconds(point: dict[str, Any]) -> float | None:
    """The kernel's estimated time on the chip its roof is drawn for (``tpu_estimate``)."""
    entry = (point.get("tpu_estimate") or {}).get(point.get("chip")) or {}
    return entry.get("seconds")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_pallas.roofline_plot",
        description="Roofline plot of pallas_benchmark results from a pytest-benchmark JSON file.",
    )
    parser.add_argument("json", metavar="BENCH.json",
                        help="pytest-benchmark JSON (--benchmark-json, or .benchmarks/.../*.json)")
    parser.add_argument("-o", "--output", default="roofline.svg",
                        help="image to write; .svg, .png or .pdf (default roofline.svg)")
    parser.add_argument("--title", default=None, help="title of the plot")
    options = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(MISSING_MATPLOTLIB, file=sys.stderr)
        return 1
    try:
        points = load_points(options.json)
    except (OSError, json.JSONDecodeError) as error:
        print(f"roofline_plot: cannot read {options.json}: {error}", file=sys.stderr)
        return 2
    if not points:
        print(f"roofline_plot: {options.json} has no pallas_benchmark results (no roofline facts "
              "in extra_info)", file=sys.stderr)
        return 2
    draw(points, options.output, title=options.title)
    print(f"roofline plot of {len(points)} benchmarks written to {options.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
