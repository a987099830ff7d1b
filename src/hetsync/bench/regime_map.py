"""The regime map: per heterogeneity and worker count, a grid of payload x network whose cells
name the winner and its speed-up over All-Reduce, so that a user reads off which protocol
suits a cluster like theirs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hetsync.bench.results import headline
from hetsync.report.plots import plt

__all__ = ["plot_regime_map", "regime_cells"]


def _over_allreduce(winner: dict[str, Any]) -> tuple[float | None, str]:
    """The winner's speed-up over All-Reduce: in time to target where both reached it (or a
    bound), else in throughput; and which of the two it is."""
    ratio = winner["speedup_vs_allreduce"]
    if winner["by"] == "time to target" and ratio is not None:
        prefix = {"exact": "", "at least": "≥", "at most": "≤"}[ratio["kind"]]
        return ratio["value"], f"{prefix}{ratio['value']:.2f}x"
    value = winner["throughput_vs_allreduce"]
    return value, ("-" if value is None else f"{value:.2f}x thr.")


def regime_cells(results: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The settings of a regime suite grouped by (heterogeneity, workers), each with its
    payload, network, winner and speed-up."""
    panels: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for setting in results["settings"]:
        if len(setting.get("regime", ())) != 4:
            continue
        payload, network, het, workers = setting["regime"]
        best = headline(setting)
        value, text = _over_allreduce(best) if best else (None, "-")
        panels.setdefault((het, workers), []).append({
            "payload": payload, "network": network, "winner": best["winner"] if best else "-",
            "value": value, "text": text})
    return panels


def plot_regime_map(results: dict[str, Any], out: Path) -> Path | None:
    """One heat map per (heterogeneity, workers): colour is the winner's speed-up over
    All-Reduce (log scale), text the winner and the ratio. None if the suite has no regimes."""
    panels = regime_cells(results)
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), squeeze=False,
                             figsize=(4.2 * len(panels), 3.2))
    try:
        for ax, ((het, workers), cells) in zip(axes[0], panels.items(), strict=True):
            payloads = list(dict.fromkeys(c["payload"] for c in cells))
            networks = list(dict.fromkeys(c["network"] for c in cells))
            grid = [[math.nan] * len(payloads) for _ in networks]
            for c in cells:
                y, x = networks.index(c["network"]), payloads.index(c["payload"])
                grid[y][x] = math.log2(c["value"]) if c["value"] else math.nan
                ax.text(x, y, f"{c['winner']}\n{c['text']}", ha="center", va="center",
                        fontsize="small")
            ax.imshow(grid, cmap="RdYlGn", vmin=-3, vmax=3, aspect="auto")
            ax.set_xticks(range(len(payloads)), payloads)
            ax.set_yticks(range(len(networks)), [n.replace(", ", ",\n") for n in networks])
            ax.set_xlabel("payload (declared model size)")
            ax.set_title(f"{het}, {workers}", fontsize="medium")
        fig.suptitle("winner and its speed-up over allreduce (green: faster; colour log2)",
                     fontsize="medium")
        fig.tight_layout()
        path = out / "regime_map.png"
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return path
