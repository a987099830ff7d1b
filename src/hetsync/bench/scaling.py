"""The scaling study of a simulated suite (`scaling-sim`): per heterogeneity and network, each
protocol's fraction of the ideal throughput and its time to iteration K against the number of
workers, as a table and a figure, so that where a protocol stops scaling shows at a glance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetsync.report.colours import protocol_styles
from hetsync.report.plots import plt

__all__ = ["scaling_lines"]


def _panels(results: dict[str, Any]) -> dict[tuple[str, str], dict[str, dict[int, Any]]]:
    """(heterogeneity, network) -> variant -> workers -> its result row."""
    panels: dict[tuple[str, str], dict[str, dict[int, Any]]] = {}
    for setting in results["settings"]:
        regime = setting.get("regime") or ()
        het, network = (regime[2], regime[1]) if len(regime) == 4 else (
            setting["slowdown"], setting["network"])
        for row in setting["results"]:
            if row["repeats_done"]:
                panel = panels.setdefault((het, network), {})
                panel.setdefault(row["label"], {})[setting["workers"]] = row
    return panels


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    fraction = row["ideal_fraction"]
    text = f"{100 * fraction:.0f}%" if fraction is not None else "?"
    tk = row.get("time_to_iteration_s")
    return text + (f" ({tk:.1f} s)" if tk is not None else " (not reached)")


def _plot(panels: dict[tuple[str, str], dict[str, dict[int, Any]]], out: Path) -> Path:
    fig, axes = plt.subplots(len(panels), 1, squeeze=False, figsize=(8, 3.2 * len(panels)))
    labels = sorted({label for panel in panels.values() for label in panel})
    styles = protocol_styles(labels)
    try:
        for ax, ((het, network), panel) in zip(axes[:, 0], panels.items(), strict=True):
            for label, by_workers in panel.items():
                sizes = sorted(by_workers)
                ax.plot(sizes, [100 * (by_workers[n]["ideal_fraction"] or 0) for n in sizes],
                        color=styles[label].colour, linestyle=styles[label].linestyle,
                        marker=styles[label].marker, label=label)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 105)
            ax.set_ylabel("% of ideal throughput")
            ax.set_title(f"{het}, {network}", fontsize="medium")
            ax.grid(True, alpha=0.3)
        axes[0, 0].legend(fontsize="small", ncol=3)
        axes[-1, 0].set_xlabel("workers (simulated)")
        fig.tight_layout()
        path = out / "scaling.png"
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def scaling_lines(results: dict[str, Any], out: Path, k: int) -> list[str]:
    """The scaling section of results.md for a suite whose settings differ in worker count."""
    panels = _panels(results)
    if not panels or len({s["workers"] for s in results["settings"]}) < 2:
        return []
    path = _plot(panels, out / "plots")
    lines = ["## Scaling\n", "Per cell: the fraction of the ideal throughput (the sum of the "
             f"workers' own speeds) and, in brackets, when the median worker completed "
             f"iteration {k} (simulated seconds).\n", f"![scaling](plots/{path.name})\n"]
    for (het, network), panel in panels.items():
        sizes = sorted({n for by_workers in panel.values() for n in by_workers})
        rows = ["| protocol | " + " | ".join(f"{n} workers" for n in sizes) + " |",
                "| --- |" + " --- |" * len(sizes)]
        rows += [f"| {label} | " + " | ".join(_cell(by_workers.get(n)) for n in sizes) + " |"
                 for label, by_workers in panel.items()]
        lines += [f"**{het}, {network}**\n", "\n".join(rows) + "\n"]
    return lines
