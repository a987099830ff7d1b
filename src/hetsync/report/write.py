"""Assemble the report: summary table and plots in one markdown file."""

from __future__ import annotations

from pathlib import Path

from hetsync.report.plots import write_plots
from hetsync.report.runs import load_run
from hetsync.report.table import summary_table
from hetsync.user_files import out_folder


def write_report(run_dirs: list[Path], out: Path) -> Path:
    """Compare the runs in `run_dirs` in `out/report.md` (plus PNGs beside it); return its path.

    The first run is the baseline that speedups are measured against. Every run is read (and
    checked) before anything is written.
    """
    if not run_dirs:
        raise ValueError("no run directories given")
    runs = [load_run(path) for path in run_dirs]
    out = Path(out)
    with out_folder(out):
        images = write_plots(runs, out)
        sections = [
            "# hetsync report\n",
            "Runs: " + ", ".join(f"`{run.label}` ({run.path})" for run in runs) + "\n",
            "## Summary\n",
            summary_table(runs),
        ]
        if images:
            sections.append("## Plots\n")
            sections += [f"![{image.stem}]({image.name})\n" for image in images]
        report = out / "report.md"
        report.write_text("\n".join(sections), encoding="utf-8")
    return report
