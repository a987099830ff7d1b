"""Turn hetsync run directories into plots and a markdown comparison report."""

from __future__ import annotations

from hetsync.report.runs import Run, load_run
from hetsync.report.write import write_report

__all__ = ["Run", "load_run", "write_report"]
