"""CPU affinity of a whole process: every thread, not only the caller.

`os.sched_setaffinity(0, ...)` moves the calling thread alone; the threads a process already
runs (gloo's, a TCPStore's, a protocol's receivers) keep where they were. A bottom module (no
hetsync import): the launcher moves itself off the workers' cores with it, and a `cpu:`
straggler pins itself back after joining its quota cgroup.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["pin_process"]


def pin_process(cores: Iterable[int]) -> None:
    """Every thread of this process on `cores` (threads that end meanwhile are skipped)."""
    allowed = set(cores)
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), allowed)
        except (ProcessLookupError, ValueError):
            continue
