"""The suite's own figure: speed-up bars, one panel per setting (the per-run figures come from
hetsync.report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetsync.report.colours import protocol_styles
from hetsync.report.plots import plt

__all__ = ["plot_speedups"]


def plot_speedups(results: dict[str, Any], out: Path, baseline: str = "allreduce") -> Path | None:
    """Horizontal bars of each variant's speed-up in time to target over `baseline`; hatched
    bars are bounds (one side never reached the target); dots show the throughput
    ratio. None if no setting has the baseline."""
    settings = [s for s in results["settings"]
                if any(r["label"] == baseline for r in s["results"])]
    if not settings:
        return None
    labels = list(dict.fromkeys(r["label"] for s in settings for r in s["results"]))
    styles = protocol_styles(labels)  # a family's colour, its variants a shade of it
    heights = [len(s["results"]) for s in settings]
    fig, axes = plt.subplots(len(settings), 1, squeeze=False,
                             figsize=(8, 1.2 + 0.32 * sum(heights) + 0.6 * len(settings)),
                             gridspec_kw={"height_ratios": heights})
    try:
        for ax, setting in zip(axes[:, 0], settings, strict=True):
            rows = setting["results"][::-1]  # first variant on top
            y = range(len(rows))
            for i, row in enumerate(rows):
                ratio = row[f"speedup_vs_{baseline}"]
                value = ratio["value"] if ratio else 0.0
                bound = bool(ratio) and ratio["kind"] != "exact"
                ax.barh(i, value, color=styles[row["label"]].fill, alpha=0.8,
                        hatch="//" if bound else None, edgecolor="0.2" if bound else None)
                text = "not reached" if not ratio else (
                    {"exact": "", "at least": "≥ ", "at most": "≤ "}[ratio["kind"]]
                    + f"{value:.2f}x")
                throughput = row[f"throughput_vs_{baseline}"]
                if throughput is not None:
                    ax.plot(throughput, i, "k.", markersize=8)
                ax.text(max(value, throughput or 0.0), i, f"  {text}", va="center",
                        fontsize="small")
            ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1)
            ax.set_yticks(list(y), [row["label"] for row in rows])
            ax.set_title(f"{setting['name']} ({setting['workers']} workers)", fontsize="medium")
            ax.grid(True, axis="x", alpha=0.3)
            ax.set_xlim(left=0, right=max(1.5, ax.get_xlim()[1] * 1.15))
        axes[-1, 0].set_xlabel(f"speed-up over {baseline} in time to target (bars; hatched: a "
                               "bound, one side never reached it)\nand in throughput (dots)")
        fig.tight_layout()
        path = out / f"speedup_vs_{baseline}.png"
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return path
