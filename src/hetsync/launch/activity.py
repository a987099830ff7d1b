"""Whether a worker whose heartbeat has gone quiet is busy in its script's own code or hung,
by what the kernel counts for it.

A worker beats once an iteration, but between two steps its script may evaluate, checkpoint
or load data for as long as it likes: quiet is not hung. The kernel tells the two apart:

- **busy**: its training (main) thread was on a core, or runnable and waiting for one (a
  starved worker on an oversubscribed machine is still busy), for at least `BUSY_SHARE` of
  the last window (`/proc/PID/task/PID/schedstat`: time on a CPU and time on a run queue, in
  ns), or the worker's child processes (a DataLoader's workers, a command its script runs)
  used that much CPU between them (`/proc/C/stat`, utime + stime);
- **not busy**: stopped (SIGSTOP, a debugger: state T, no time at all), asleep or blocked in
  a wait (a deadlock, a lock, gloo, `time.sleep`, I/O): it neither runs nor waits to run.

Only the training thread counts, not the worker's other threads: the protocols' receive
threads (Hop's, the parameter server's, AD-PSGD's passive side) and the control thread burn a
little CPU whatever the training thread does, and a deadlocked training thread beside a live
receive thread is still hung. A training thread that polls in a loop (a DataLoader's
`queue.get(timeout=...)`) uses well under 1 % of a core: below `BUSY_SHARE`.
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path

__all__ = ["BUSY_SHARE", "Activity"]

#: The share of one core the training thread (or the worker's children) must take, over the
#: window, for a quiet worker to count as busy: a polling loop takes far less, a computing
#: thread far more, even at a quarter core's quota or sharing a core with three others.
BUSY_SHARE = 0.05
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


class Activity:
    """The CPU a worker (process `pid`) takes, sampled while its heartbeat is quiet.

    `sample(now)` reads the kernel's counts; `busy(now)` says whether, over the last
    `window` seconds (at least half of it sampled), the training thread ran or waited to run,
    or the worker's children ran, for `BUSY_SHARE` of the time."""

    def __init__(self, pid: int, window: float) -> None:
        self.pid = pid
        self.window = window
        self._seen: dict[int, float] | None = None  # seconds counted per process, last sample
        self._counted = 0.0  # seconds of activity since the first sample
        self._samples: deque[tuple[float, float]] = deque()  # (time, `_counted` then)

    def sample(self, now: float) -> None:
        seen = _readings(self.pid)
        if seen is None:  # gone: its exit code tells the rest
            return
        if self._seen is not None:  # a child new since the last sample ran all its time since
            self._counted += sum(max(0.0, s - self._seen.get(p, 0.0)) for p, s in seen.items())
        self._seen = seen
        self._samples.append((now, self._counted))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window:
            self._samples.popleft()  # keep one sample at or before the window's start

    def busy(self, now: float) -> bool:
        if not self._samples:
            return False
        since, counted = self._samples[0]
        span = now - since
        if span < self.window / 2:
            return False  # too short to tell: a quiet worker is not taken for busy
        return (self._counted - counted) / span >= BUSY_SHARE


def _readings(pid: int) -> dict[int, float] | None:
    """Seconds counted for `pid`'s training thread (on a CPU or waiting for one) and for each
    of its descendant processes (CPU), by pid; None once `pid` is gone."""
    try:
        on_cpu, waiting = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[:2]
    except (OSError, ValueError):  # gone, or a kernel without schedstat: its CPU only
        main = _cpu_seconds(pid)
        if main is None:
            return None
        seen = {pid: main}
    else:
        seen = {pid: (int(on_cpu) + int(waiting)) / 1e9}
    for child in _descendants(pid):
        cpu = _cpu_seconds(child)
        if cpu is not None:
            seen[child] = cpu
    return seen


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of process `pid` (all its threads), or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # fields 14 and 15 of stat(5)


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (the children of each of its threads, theirs in turn)."""
    found, todo = [], [pid]
    while todo and len(found) < 256:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            found.extend(int(c) for c in children)
            todo.extend(int(c) for c in children)
    return found
