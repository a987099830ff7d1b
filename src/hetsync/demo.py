"""`hetsync demo`: the embedded default run that `make demo` ends with.

The default benchmark suite (homogeneous, and one worker 5x slow; All-Reduce, DDP, the
parameter server, AD-PSGD, Hop and Prague) at a small size, into a fresh folder, ending with
its tables and the path of its report.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hetsync.bench.command import bench
from hetsync.bench.runner import SUITE_FILE, BenchOptions, plan
from hetsync.errors import ConfigError
from hetsync.user_files import out_folder

__all__ = ["run_demo"]


DEMO_TARGET = {"cnn": 0.6}
"""Looser than the headline suite's, so that 4 workers reach it within 30 s."""

DEMO_MARK = ".hetsync-demo"
"""Written into a demo's folder before anything else: a later demo replaces the files of a
folder that has it, and refuses any other folder that holds files."""

DEMO_FILES = (SUITE_FILE, "results.json", "results.md", "plots", "runs", DEMO_MARK)
"""What a demo writes into its folder (hetsync bench's files and the mark): all that a later
demo removes there. Anything else (a user's notes) stays."""


def run_demo(out: Path, workers: int = 4, max_time: float = 30.0, workload: str = "cnn") -> Path:
    """Run the default suite small into `out` (replacing an earlier demo there); return the
    path of results.md. Every option is checked before `out` is touched."""
    options = BenchOptions(workload=workload, workers=workers, max_time=max_time,
                           target_loss=DEMO_TARGET.get(workload)).check()
    plan(options.chosen_suite(), options, out)  # refuses options no run can start with
    _make_room(out)
    return bench(options, out)


def _make_room(out: Path) -> None:
    """Remove an earlier demo's files from `out` and mark it as a demo's. A non-empty `out`
    without the mark (a bench suite, a run, a user's folder) is refused: its files are not
    the demo's to remove."""
    with out_folder(out):
        if not _earlier_demo(out) and any(out.iterdir()):
            raise ConfigError(f"--out {out} holds files that no hetsync demo wrote: pass "
                              "another --out, or remove it")
        for name in DEMO_FILES:
            path = out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        (out / DEMO_MARK).write_text("written by `hetsync demo`: a later demo into this "
                                     "folder replaces its demo files\n")


def _earlier_demo(out: Path) -> bool:
    """Whether `out` holds a demo: marked, or, written before the mark existed, a suite and
    nothing but a demo's files (so that `make demo` goes on replacing its own)."""
    if (out / DEMO_MARK).is_file():
        return True
    names = {path.name for path in out.iterdir()}
    return SUITE_FILE in names and names <= set(DEMO_FILES)
