"""The record of one iteration of one worker, as its protocol fills it in.

A bottom module (no torch, no hetsync import): the drivers, the training loop
(`hetsync.SyncOptimizer`) and the network emulator all read or write it, so it sits below
them all (see the layers in DEVELOPERS.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Step"]


@dataclass
class Step:
    """One iteration of one worker, as seen by its protocol."""

    iteration: int
    """The iteration being run, counting from 1; in a resumed run from 1 again (the protocol
    starts afresh), while the rows and stop conditions count on from the checkpoint."""
    start: float = field(default_factory=time.perf_counter)
    wants_stop: bool = False
    """This worker's own stop conditions hold; known after `begin_sync()`."""
    stop: bool = False
    """The run stops after this iteration; protocols that must agree set it together."""
    compute_s: float = 0.0
    injected_delay_s: float = 0.0
    sync_wait_s: float = 0.0
    network_s: float = 0.0
    """Time the emulated network added or charged (see hetsync.network.emulator)."""
    begin_s: float = 0.0
    """The protocol's own work as the iteration began (`begin_iteration`: Hop's sends and
    skips, D-PSGD's and AD-PSGD's posted exchanges), waits excluded: the training thread's
    time, but not the user's compute, which starts after it."""
    bytes_sent: int = 0
    skip_optimizer_step: bool = False
    """Set by protocols whose update is applied elsewhere (the parameter server's)."""
    extra: dict[str, float | list[list[int]]] = field(default_factory=dict)
    """Protocol-specific figures logged with the row (e.g. a parameter server's staleness,
    the groups a Prague worker averaged with)."""
    on_begin_sync: Callable[[Step], None] | None = None
    on_phase: Callable[[str], None] | None = None
    on_wait: Callable[[float], float] | None = None
    """Given an emulated wait about to start on the training thread, the seconds to wait (the
    run's own limits may cut it; a long one is announced to the launcher)."""
    _synced: bool = False

    @property
    def synced(self) -> bool:
        """Whether `begin_sync()` ran: the compute counted (`compute_s`) ends there."""
        return self._synced

    def count_seconds(self, key: str, seconds: float) -> None:
        """Add `seconds` to the row's figure `key` in `extra` (an iteration may wait, or
        work, several times for one cause)."""
        self.extra[key] = float(self.extra.get(key, 0.0)) + seconds  # type: ignore[arg-type]

    def begin_sync(self) -> None:
        """Finish the emulated compute of this iteration (idempotent); see the module doc."""
        if not self._synced:
            self._synced = True
            if self.on_begin_sync is not None:
                self.on_begin_sync(self)

    @contextmanager
    def blocking(self) -> Iterator[None]:
        """Count the time spent inside as time blocked in synchronisation."""
        if self.on_phase is not None:
            self.on_phase("sync")
        began = time.perf_counter()
        try:
            yield
        finally:
            self.sync_wait_s += time.perf_counter() - began
            if self.on_phase is not None:
                self.on_phase("compute")
