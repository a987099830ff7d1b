"""`--keep-awake`: pinned workers' cores kept busy while their workers wait.

A worker that waits for a message leaves its core idle, and the next step computes slower:
the idle core halts (in a VM the host takes the physical core back; on bare metal it enters
a sleep state that may flush its caches); docs/design.md ("Real stragglers and pinned
workers") has what it costs.

The remedy is the one HPC runtimes use (busy polling), without touching the protocols: on
each pinned worker's core a busy loop runs under SCHED_IDLE, the kernel's lowest class, so it
runs only when nothing else on that core can: the worker, its threads and the launcher (at
nice 19 when it shares a core) preempt it at once. It costs power, not throughput. It would
slow a computing thread on the other hyperthread of the same physical core, which is why it
is an option and not the default of `--pin`.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Iterable
from types import TracebackType

__all__ = ["AwakeCores"]

#: The busy loop: pinned to its core, in the lowest scheduling class, then spinning in
#: bytecode (no system call, so nothing to wake up from).
_SPIN = ("import os, sys\n"
         "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
         "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
         "while True:\n"
         "    pass\n")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: a killed launcher takes its busy loops with it."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class AwakeCores:
    """One busy loop per core of `cores` while the context is open; gone however it ends."""

    def __init__(self, cores: Iterable[int]) -> None:
        self.cores = sorted(set(cores))
        self._loops: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> AwakeCores:
        try:
            for core in self.cores:
                self._loops.append(subprocess.Popen(
                    [sys.executable, "-c", _SPIN, str(core)], stdin=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent))  # noqa: PLW1509 - prctl only, no threads
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pids(self) -> list[int]:
        return [loop.pid for loop in self._loops]

    def stop(self) -> None:
        for loop in self._loops:
            loop.kill()
        for loop in self._loops:
            loop.wait()
        self._loops.clear()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
