"""`hetsync demo`: the embedded default run that `make demo` ends with.

Eight workers with 50 ms emulated steps train the CNN side by side: All-Reduce without
slowdown for reference, then All-Reduce and PyTorch DDP with rank 3 slowed 4x; then the report.
Falls back to the digits workload where Fashion-MNIST is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.launch.launcher import run
from hetsync.report import write_report
from hetsync.report.runs import load_run
from hetsync.report.table import summary_table
from hetsync.workloads import get_workload

__all__ = ["run_demo"]

SLOW = "deterministic:ranks=3,factor=4"


def _workload() -> str:
    try:
        get_workload("cnn").load(None)
    except ConfigError as error:
        print(f"note: {error}; the demo uses --workload digits instead", file=sys.stderr)
        return "digits"
    return "cnn"


def run_demo(out: Path, workers: int = 8, max_time: float = 40.0, quiet: bool = False) -> Path:
    """Run the side-by-side demo into `out` and return the path of its report."""
    workload = _workload()
    settings = [
        ("allreduce", "none", "allreduce-homogeneous"),
        ("allreduce", SLOW, "allreduce-1-slow"),
        ("ddp", SLOW, "ddp-1-slow"),
    ]
    run_dirs = []
    for protocol, slowdown, label in settings:
        config = RunConfig(
            protocol=protocol, workload=workload, workers=workers, step_time=50.0,
            slowdown=slowdown, max_time=max_time, stop_at_target=False, out=out / label,
            label=label, quiet=quiet,
        )
        result = run(config)
        run_dirs.append(result.run_dir)
    report = write_report(run_dirs, out / "plots")
    print(summary_table([load_run(d) for d in run_dirs]))
    print(f"\nreport: {report}\nplots:  {out / 'plots'}/*.png")
    return report
