"""PNG plots comparing runs; each function returns the paths it wrote (none if no data)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: reports are rendered on servers without a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from hetsync.report.colours import Style, protocol_colour, protocol_styles, rank_shades  # noqa: E402
from hetsync.report.runs import Run  # noqa: E402

DPI = 120
TIME_LABEL = "wall-clock time (s)"
GRID_POINTS = 500


def slug(label: str) -> str:
    """Make a label safe to use in a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "run"


def unique_slugs(runs: list[Run]) -> list[str]:
    """One distinct file-name stem per run, even when labels collide."""
    seen: dict[str, int] = {}
    stems = []
    for run in runs:
        stem = slug(run.label)
        seen[stem] = seen.get(stem, 0) + 1
        stems.append(stem if seen[stem] == 1 else f"{stem}_{seen[stem]}")
    return stems


def run_styles(runs: list[Run]) -> dict[str, Style]:
    """Each run's style, by its family: the same colour in every figure of the report."""
    return protocol_styles((run.label for run in runs),
                           {run.label: run.summary["protocol"] for run in runs})


def consensus_rows(run: Run) -> list[dict]:
    """The consensus-model evaluations (the final one included), in time order."""
    rows = [row for row in run.eval_rows
            if row.get("model") in ("consensus", "final") and row.get("loss") is not None]
    return sorted(rows, key=lambda row: row["t"])


@contextmanager
def _figure(path: Path, title: str, ylabel: str) -> Iterator[Axes]:
    """Yield fresh axes, then style and save them to `path`."""
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        yield ax
        ax.set_title(title)
        ax.set_xlabel(TIME_LABEL)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlim(left=0)
        ax.legend(fontsize="small", ncol=1 + len(ax.get_legend_handles_labels()[1]) // 10)
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)


def plot_loss(runs: list[Run], out: Path) -> list[Path]:
    """Consensus test loss vs time, with each run's target loss as a dashed line."""
    styles = run_styles(runs)
    curves = [(run, rows) for run in runs if (rows := consensus_rows(run))]
    if not curves:
        return []
    path = out / "loss_vs_time.png"
    targets = sorted({run.summary["target_loss"] for run in runs
                      if run.summary.get("target_loss") is not None})
    with _figure(path, "Consensus test loss vs wall-clock time", "test loss") as ax:
        losses = []
        for run, rows in curves:
            loss = [row["loss"] for row in rows]
            losses += loss
            _line(ax, styles[run.label], [row["t"] for row in rows], loss, run.label)
        for target in targets:
            ax.axhline(target, linestyle="--", color="0.4", linewidth=1,
                       label=f"target loss {target:g}")
        values = [v for v in losses + targets if v > 0]
        if values and max(values) > 10 * min(values):
            _log_y(ax, max(values) / min(values))
    return [path]


def _line(ax: Axes, style: Style, x: list[float], y: list[float], label: str) -> None:
    """One run's curve of evaluations, in its family's colour and its variant's line."""
    ax.plot(x, y, color=style.colour, linestyle=style.linestyle, marker=style.marker,
            markersize=3, label=label)


def _log_y(ax: Axes, span: float) -> None:
    """Log-scale y with plain tick labels ("0.3", not "3e-01"), labelling 2/3/5 if few decades."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    if span <= 1000:
        ax.yaxis.set_minor_locator(LogLocator(subs=(2, 3, 5)))
        ax.yaxis.set_minor_formatter(plain)
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())


def _plot_consensus_metric(
    runs: list[Run], out: Path, key: str, name: str, title: str, ylabel: str,
    scale: float = 1.0, log: bool = False,
) -> list[Path]:
    """One line per run of a consensus-row metric vs time; nothing if no run has it."""
    styles = run_styles(runs)
    curves = [(run, rows) for run in runs
              if (rows := [r for r in consensus_rows(run) if r.get(key) is not None])]
    if not curves:
        return []
    path = out / name
    with _figure(path, title, ylabel) as ax:
        for run, rows in curves:
            _line(ax, styles[run.label], [row["t"] for row in rows],
                  [scale * row[key] for row in rows], run.label)
        if log:
            ax.set_yscale("symlog", linthresh=1e-6)
    return [path]


def plot_accuracy(runs: list[Run], out: Path) -> list[Path]:
    """Consensus test accuracy vs time."""
    return _plot_consensus_metric(runs, out, "accuracy", "accuracy_vs_time.png",
                                  "Consensus test accuracy vs wall-clock time",
                                  "test accuracy (%)", scale=100.0)


def plot_consensus_distance(runs: list[Run], out: Path) -> list[Path]:
    """How far the workers' models are from their average, vs time (decentralized runs)."""
    return _plot_consensus_metric(
        runs, out, "consensus_distance", "consensus_distance_vs_time.png",
        "Consensus distance vs wall-clock time", "mean squared distance to the average model",
        log=True,
    )


def iteration_grid(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Resample each worker's iteration count onto a common time grid.

    Returns (grid, counts) with counts shaped (workers, len(grid)). The count is a step
    function: a worker has done 0 iterations before its first row and keeps its last count
    after it stops, so workers that finish early do not drag the mean down.
    """
    workers = [rows for rows in run.worker_rows.values() if rows]
    end = max(row["t"] for rows in workers for row in rows)
    grid = np.linspace(0.0, end, GRID_POINTS)
    counts = []
    for rows in workers:
        rows = sorted(rows, key=lambda row: row["t"])
        t = np.array([row["t"] for row in rows], dtype=float)
        done = np.array([0] + [row["iteration"] for row in rows], dtype=float)
        counts.append(done[np.searchsorted(t, grid, side="right")])
    return grid, np.array(counts)


def _has_workers(run: Run) -> bool:
    return any(run.worker_rows.values())


def plot_iterations(runs: list[Run], out: Path) -> list[Path]:
    """Mean iterations per worker vs time, shaded from the slowest to the fastest worker."""
    if not any(_has_workers(run) for run in runs):
        return []
    path = out / "iterations_vs_time.png"
    with _figure(path, "Iterations per worker vs wall-clock time\n"
                 "(line: mean over workers, band: slowest to fastest worker)",
                 "iterations completed") as ax:
        styles = run_styles(runs)
        for run in runs:
            if not _has_workers(run):
                continue
            style = styles[run.label]
            grid, counts = iteration_grid(run)
            ax.fill_between(grid, counts.min(axis=0), counts.max(axis=0),
                            color=style.fill, alpha=0.2, linewidth=0)
            ax.plot(grid, counts.mean(axis=0), color=style.colour, linestyle=style.linestyle,
                    label=run.label)
        ax.set_ylim(bottom=0)
    return [path]


def plot_iterations_per_worker(runs: list[Run], out: Path) -> list[Path]:
    """One plot per run with a line per worker, so a straggler stands out; the workers are
    shades of the run's protocol colour, dark to light by rank."""
    paths = []
    for run, stem in zip(runs, unique_slugs(runs), strict=True):
        if not _has_workers(run):
            continue
        path = out / f"iterations_per_worker_{stem}.png"
        shades = rank_shades(protocol_colour(run.label, run.summary["protocol"]),
                             len(run.worker_rows))
        with _figure(path, f"Iterations per worker vs wall-clock time: {run.label}",
                     "iterations completed") as ax:
            for (rank, rows), colour in zip(run.worker_rows.items(), shades, strict=True):
                rows = sorted(rows, key=lambda row: row["t"])
                ax.plot([0.0] + [row["t"] for row in rows],
                        [0] + [row["iteration"] for row in rows],
                        drawstyle="steps-post", color=colour, label=f"rank {rank}")
            ax.set_ylim(bottom=0)
        paths.append(path)
    return paths


def write_plots(runs: list[Run], out: Path) -> list[Path]:
    """Write every plot that has data into `out`."""
    return [
        *plot_loss(runs, out),
        *plot_accuracy(runs, out),
        *plot_consensus_distance(runs, out),
        *plot_iterations(runs, out),
        *plot_iterations_per_worker(runs, out),
    ]
