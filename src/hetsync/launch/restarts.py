"""`--on-failure rejoin`: the launcher restarts a lost worker, which rejoins the running run.

The monitor declares a worker lost as under `--on-failure continue` (dead, stopped, hung: it
kills the process if it still runs). `Restarts.after_loss` then decides the run's next
generation (hetsync.transport.membership): with the worker restarted under the same rank (the
first `--max-restarts` times), or without it, the run going on smaller. It publishes the
generation, spawns the new process into it, and keeps the record summary.json shows: who
left and came back when, and the time lost.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from tqdm import tqdm

from hetsync.errors import WorkerFailed
from hetsync.transport.membership import ENV_GENERATION, Generation, publish
from hetsync.transport.runtime import JOINED_KEY, JOINING_KEY

__all__ = ["Restarts"]

#: What a worker leaves in the control store about itself, cleared before its restart: the
#: new process's start-up is watched afresh.
_OWN_KEYS = ("hb/{rank}", JOINING_KEY, JOINED_KEY, "stopped/{rank}", "left/{rank}")


@dataclass
class Restarts:
    store: dist.Store
    world: int
    max_restarts: int
    spawn: Callable[[int, dict[str, str]], subprocess.Popen[bytes]]
    """Spawn worker `rank` with extra environment variables."""
    clock: Callable[[], float | None]
    """The run's time (None before it started)."""
    generation: Generation = field(init=False)
    counts: dict[int, int] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    """One per restart: rank, restart, lost_at_s, restarted_at_s, back_at_s, downtime_s."""
    _pending: dict[int, tuple[dict[str, Any], float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.generation = Generation(0, tuple(range(self.world)))

    def after_loss(self, rank: int, failure: WorkerFailed,
                   restarted: Callable[[int, subprocess.Popen[bytes]], None]) -> None:
        """`rank` was lost: publish the next generation, with it restarted (`restarted(rank,
        proc)` told) or, its restarts spent, without it."""
        others = tuple(r for r in self.generation.members if r != rank)
        count = self.counts.get(rank, 0)
        self._pending.pop(rank, None)  # lost again before it was back
        if count >= self.max_restarts:
            self._next(others, ())
            kept = ", ".join(map(str, others))
            tqdm.write(f"hetsync: worker rank {rank} {failure.reason}; not restarted again: it "
                       f"failed {count + 1} time(s) (--max-restarts {self.max_restarts}); going "
                       f"on with ranks {kept} (details in logs/rank{rank}.*)", file=sys.stderr)
            return
        self.counts[rank] = count + 1
        generation = self._next(tuple(sorted((*others, rank))), (rank,))
        for key in _OWN_KEYS:
            self.store.delete_key(key.format(rank=rank))
        lost_at = self.clock()
        proc = self.spawn(rank, {ENV_GENERATION: str(generation.number)})
        restarted(rank, proc)
        record = {"rank": rank, "restart": count + 1, "reason": failure.reason,
                  "lost_at_s": _rounded(lost_at), "restarted_at_s": _rounded(self.clock()),
                  "back_at_s": None, "downtime_s": None, "start_up_s": None}
        self.records.append(record)
        self._pending[rank] = (record, time.monotonic())
        tqdm.write(f"hetsync: worker rank {rank} {failure.reason}; restarting it (restart "
                   f"{count + 1} of {self.max_restarts}; details in logs/rank{rank}.*)",
                   file=sys.stderr)

    def back(self, rank: int) -> None:
        """A restarted worker's first heartbeat: it trains again."""
        if rank not in self._pending:
            return
        record, spawned = self._pending.pop(rank)
        now = self.clock()
        record["back_at_s"] = _rounded(now)
        record["start_up_s"] = round(time.monotonic() - spawned, 3)
        if now is not None and record["lost_at_s"] is not None:
            record["downtime_s"] = round(now - record["lost_at_s"], 3)
        tqdm.write(f"hetsync: worker rank {rank} is back, {record['start_up_s']:.1f} s after "
                   f"its restart (generation {self.generation.number})", file=sys.stderr)

    def _next(self, members: tuple[int, ...], newcomers: tuple[int, ...]) -> Generation:
        self.generation = Generation(self.generation.number + 1, members, newcomers)
        publish(self.store, self.generation)
        return self.generation


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
