"""Where a worker's CPU goes, thread by thread: the training thread, each protocol thread,
and the rest (gloo's and torch's own threads).

Why: a sleeping worker (`--step-time`) hides what the protocols' threads cost, since they work
during the sleep; with real compute they compete with the training thread for the worker's
cores. The kernel counts each thread's CPU time (`/proc/self/task/<tid>/stat`, user + system,
in clock ticks of 10 ms); Python names its own threads (`threading.enumerate()`, matched by
`native_id`), and every thread Python did not start (gloo's, torch's intra-op pool, OpenMP)
counts as `other`. A thread per peer (`<kind>-from-<peer>`: hetsync.transport.peer_streams)
counts under its kind, so that a role reads the same at 2 workers as at 1000. Sampled at most
every `every` seconds, not each iteration: about 20 file reads a sample, negligible at that
rate; a row carries the CPU seconds since the previous sample, so that the rows sum to the
run's totals (up to the threads that ended in between).
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

__all__ = ["TRAINING", "OTHER", "ThreadCpu"]

TRAINING = "training"
"""The main thread's role: the forward and backward passes, and what protocols do on it."""
OTHER = "other"
"""Threads Python did not start: gloo's, torch's intra-op pool, OpenMP."""
_TASKS = Path("/proc/self/task")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_PER_PEER = re.compile(r"-from-\d+$")


class ThreadCpu:
    """CPU seconds per thread role since the previous sample."""

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self._last = time.monotonic()
        self._seen = _ticks()

    def sample(self, force: bool = False) -> dict[str, float] | None:
        """CPU seconds by role since the last sample, or None if `every` has not yet passed
        (or the kernel does not expose the threads: not Linux)."""
        now = time.monotonic()
        if not self._seen or (not force and now - self._last < self.every):
            return None
        ticks = _ticks()
        roles = _roles()
        spent: dict[str, float] = {}
        for tid, total in ticks.items():
            delta = total - self._seen.get(tid, 0)
            if delta > 0:
                role = roles.get(tid, OTHER)
                spent[role] = spent.get(role, 0.0) + delta * _TICK_S
        self._seen, self._last = ticks, now
        return {role: round(s, 3) for role, s in sorted(spent.items())}


def _roles() -> dict[int, str]:
    main = threading.main_thread()
    return {t.native_id: TRAINING if t is main else _PER_PEER.sub("", t.name)
            for t in threading.enumerate() if t.native_id is not None}


def _ticks() -> dict[int, int]:
    """User + system clock ticks of every thread of this process, by thread id."""
    ticks = {}
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return {}
    for tid in tids:
        try:
            stat = (_TASKS / tid / "stat").read_text()
        except OSError:
            continue  # it ended since the listing
        fields = stat.rsplit(")", 1)[-1].split()  # after the name, which may hold spaces
        ticks[int(tid)] = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return ticks
