"""`hetsync demo`: the embedded default run that `make demo` ends with.

The default benchmark suite (homogeneous, and one worker 5x slow; All-Reduce, DDP, the
parameter server, AD-PSGD, Hop and Prague) at a small size, into a fresh folder, ending with
its tables and the path of its report.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hetsync.bench.command import bench
from hetsync.bench.runner import SUITE_FILE, BenchOptions

__all__ = ["run_demo"]


DEMO_TARGET = {"cnn": 0.6}
"""Looser than the headline suite's, so that 4 workers reach it within 30 s."""


def run_demo(out: Path, workers: int = 4, max_time: float = 30.0, workload: str = "cnn") -> Path:
    """Run the default suite small into `out` (replacing an earlier demo there); return the
    path of results.md."""
    if (out / SUITE_FILE).is_file():
        shutil.rmtree(out)
    options = BenchOptions(workload=workload, workers=workers, max_time=max_time,
                           target_loss=DEMO_TARGET.get(workload))
    return bench(options, out)
