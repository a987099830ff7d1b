"""Which run of a suite is going, and when the suite will end.

The ETA comes from the runs already timed in this invocation: a run costs about what the runs
with the same number of workers cost (start-up grows with the worker count); before any run
of that size has finished, the measured ones are scaled by worker count, and before any at
all, the run's time cap plus an assumed start-up.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from statistics import mean
from typing import TextIO

__all__ = ["EtaEstimator", "SuiteProgress", "clock"]

STARTUP_S_PER_WORKER = 2.5
"""Assumed start-up and teardown per worker before any run was timed (2 cores, cnn)."""


def clock(seconds: float) -> str:
    """12 s, 3m05s, 1h02m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class EtaEstimator:
    """Predicts a run's duration from the runs measured so far."""

    def __init__(self) -> None:
        self._seconds: dict[int, list[float]] = defaultdict(list)

    @property
    def timed(self) -> bool:
        return any(self._seconds.values())

    def record(self, workers: int, seconds: float) -> None:
        self._seconds[workers].append(seconds)

    def predict(self, workers: int, max_time: float) -> float:
        if self._seconds[workers]:
            return mean(self._seconds[workers])
        measured = [(w, s) for w, times in self._seconds.items() for s in times]
        if measured:
            return mean(s / w for w, s in measured) * workers
        return max_time + STARTUP_S_PER_WORKER * workers

    def remaining(self, runs: list[tuple[int, float]]) -> float:
        """Predicted seconds for runs given as (workers, max_time)."""
        return sum(self.predict(workers, max_time) for workers, max_time in runs)


class SuiteProgress:
    """Prints a line as each run starts (position, name, elapsed, ETA) and ends."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.stream = total, stream or sys.stdout
        self.eta = EtaEstimator()
        self._t0 = time.monotonic()
        self._run_t0 = self._t0

    def skipped(self, count: int) -> None:
        if count:
            self._print(f"resuming: {count} of {self.total} runs already done")

    def started(self, position: int, name: str, remaining: list[tuple[int, float]]) -> None:
        """`remaining`: (workers, max_time) of this run and every one after it."""
        self._run_t0 = time.monotonic()
        elapsed = self._run_t0 - self._t0
        width = len(str(self.total))
        # Before any run was timed the estimate is every run's cap: an upper bound.
        eta = f"~{clock(self.eta.remaining(remaining))}" if self.eta.timed else (
            f"at most {clock(self.eta.remaining(remaining))}")
        self._print(f"[{position:{width}d}/{self.total}] {name} | elapsed {clock(elapsed)}, "
                    f"ETA {eta}")

    def finished(self, workers: int, outcome: str) -> None:
        seconds = time.monotonic() - self._run_t0
        self.eta.record(workers, seconds)
        self._print(f"    {outcome} ({clock(seconds)})")

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
