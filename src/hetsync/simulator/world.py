"""What every simulated protocol shares: the clock, the costs, the stop rules and the records.

A protocol's simulation (`hetsync.protocols.<name>.simulation`) builds one `SimWorker` per
rank around the protocol's cores and turns their decisions into timed callbacks and channel
operations (`simulator.channel`, which books every message); this module keeps each worker's
per-iteration row in the format real workers log (docs/run-directory.md), so that `hetsync
report` reads simulated and real runs alike.

Lost workers (`--fault kill:rank=R,at=T --on-failure continue`). At T the worker stops at
once: its pending callbacks (compute, its own timers, messages it was yet to receive) do
nothing, while what it had already sent still arrives. `DETECTION_S` later the run declares
it lost, as the launcher does, and tells every subscriber, as `LostWorkers.subscribe` tells a
real driver's; each protocol's simulation subscribes what its real driver subscribes (the
core event it feeds is the protocol's, not this module's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hetsync.config import RunConfig
from hetsync.errors import Deadlock
from hetsync.simulator.clock import Clock
from hetsync.simulator.costs import SERVICE_S, Costs
from hetsync.transport.lost_workers import POLL_S

if TYPE_CHECKING:
    from hetsync.simulator.jitter import Jitter
    from hetsync.simulator.math import MathModel

__all__ = ["DETECTION_S", "SimWorker", "Simulation"]

#: Seconds from a worker's death to the survivors hearing of it: the launcher's check period
#: (0.2 s) finds the exit, it pauses 0.5 s for the failure's echo to reach the peers' exit
#: codes before naming the failed worker, publishes it in the store, and each worker's watcher
#: polls the store every `POLL_S`. Real runs of docs/failures.md recorded a kill 0.8 s after it.
DETECTION_S = 0.2 + 0.5 + POLL_S


@dataclass
class Simulation:
    """One simulated run: its options, clock, costs and (with `--math`) the workers' models."""

    config: RunConfig
    costs: Costs
    clock: Clock = field(default_factory=Clock)
    math: MathModel | None = None
    workers: list[SimWorker] = field(default_factory=list)
    target_reached: bool = False
    """Set when the consensus model reaches the target (`--math` with `--stop-at-target`)."""
    service_s: dict[str, float] = field(default_factory=lambda: dict(SERVICE_S))
    """Seconds per request of each central service (`costs.SERVICE_S`, or `simulate`'s)."""
    jitter: Jitter | None = None
    """Random extra delays (fuzzing); None: the costs as modelled."""
    services: dict[str, Any] = field(default_factory=dict)
    """Central services (name -> `Server`), for their load figures in simulation.json."""
    detection_s: float = DETECTION_S
    """Seconds from a worker's loss to its declaration (fuzzing varies it)."""
    dead: set[int] = field(default_factory=set)
    """Ranks lost: nothing of theirs runs any more."""
    declared: set[int] = field(default_factory=set)
    """Ranks declared lost (after `detection_s`): the survivors know."""
    lost: list[dict[str, Any]] = field(default_factory=list)
    """The summary's `lost_workers`: rank, reason, run time of the declaration."""
    mortal: bool = False
    """A loss is planned (`kill`): callbacks check that their worker still lives."""
    _listeners: list[tuple[int | None, Callable[[int], None]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.max_iterations = self.config.max_iterations
        self.max_time = self.config.max_time

    @property
    def world(self) -> int:
        return self.config.workers

    def deliver(self, src: int, dst: int, at: float, action: Any, *args: Any) -> None:
        """A message from `src` to `dst` that the costs say arrives at `at`: run `action(*args)`
        when it does (later, under `jitter`; never, if `dst` is lost by then). The channel's
        (`simulator.channel`); a simulation sends through that."""
        if self.jitter is not None:
            at = self.jitter.arrive(src, dst, at)
        self.at(dst, at, action, *args)

    def at(self, rank: int, when: float, action: Any, *args: Any) -> None:
        """Run `action(*args)`, something of worker `rank`'s, at `when` unless `rank` is
        lost by then."""
        if self.mortal:
            self.clock.at(when, self._unless_dead, rank, action, args)
        else:
            self.clock.at(when, action, *args)

    def _unless_dead(self, rank: int, action: Any, args: tuple[Any, ...]) -> None:
        if rank not in self.dead:
            action(*args)

    # --- lost workers ----------------------------------------------------------------------
    def kill(self, rank: int, at: float) -> None:
        """Lose `rank` at simulated time `at` (`--fault kill`); call before the run starts."""
        self.mortal = True
        self.clock.at(at, self._die, rank)

    def subscribe(self, callback: Callable[[int], None], rank: int | None = None) -> None:
        """Call `callback(lost_rank)` when a worker is declared lost, unless the subscriber's
        own `rank` (None: a part of the run that cannot be lost) is lost itself."""
        self._listeners.append((rank, callback))

    def _die(self, rank: int) -> None:
        worker = self.workers[rank]
        if worker.done or rank in self.dead:
            return  # its process had exited: there is nothing to kill
        self.dead.add(rank)
        reason = f"was killed by signal SIGKILL at iteration {worker.iteration + 1} (simulated)"
        self.clock.after(self.detection_s, self._declare, rank, reason)

    def _declare(self, rank: int, reason: str) -> None:
        self.declared.add(rank)
        self.lost.append({"rank": rank, "reason": reason, "at_s": round(self.clock.now, 3)})
        for owner, callback in self._listeners:
            if owner not in self.dead:
                callback(rank)

    @property
    def survivors(self) -> list[SimWorker]:
        return [w for w in self.workers if w.rank not in self.dead]

    def wants_stop(self, iteration: int) -> bool:
        """A worker's own stop conditions, after computing `iteration` (as `Step.wants_stop`)."""
        return ((self.max_iterations is not None and iteration >= self.max_iterations)
                or (self.max_time is not None and self.clock.now >= self.max_time)
                or self.target_reached)

    def stuck(self) -> str:
        """The unfinished workers and what each waits for (the first 8), for a report."""
        stuck = [w for w in self.survivors if not w.done]
        shown = "; ".join(f"rank {w.rank} at iteration {w.iteration + 1} waits for "
                          f"{w.waiting_for or 'nothing (it is computing)'}" for w in stuck[:8])
        return shown + (f" (and {len(stuck) - 8} more)" if len(stuck) > 8 else "")

    def check_finished(self) -> None:
        """After the event queue ran dry: raise `Deadlock` naming who waits for what."""
        if any(not w.done for w in self.survivors):
            raise Deadlock(f"deadlock at simulated {self.clock.now:.3f} s: {self.stuck()}")


class SimWorker:
    """One simulated worker's bookkeeping; a protocol's simulation subclasses it."""

    def __init__(self, sim: Simulation, rank: int) -> None:
        self.sim = sim
        self.rank = rank
        self.iteration = 0
        """Iterations completed."""
        self.done = False
        self._waiting_for: str | Callable[[], str] = ""
        self.rows: list[dict[str, Any]] = []
        self._blocked_at: float | None = None
        self._compute_s = self._injected_s = self._wait_s = self._network_s = 0.0
        self._bytes = 0.0

    def compute(self, iteration: int, then: Any, *args: Any) -> None:
        """Run the compute of `iteration`, then call `then(*args)`."""
        seconds, injected = self.sim.costs.compute(self.rank, iteration)
        if self.sim.jitter is not None:
            seconds *= self.sim.jitter.compute_factor()
        self._compute_s += seconds - injected
        self._injected_s += injected
        self.sim.at(self.rank, self.sim.clock.now + seconds, then, *args)

    @property
    def waiting_for(self) -> str:
        """What the worker is blocked on, for a deadlock report ("" while it runs)."""
        what = self._waiting_for
        return what if isinstance(what, str) else what()

    def block(self, waiting_for: str | Callable[[], str]) -> None:
        """The worker stops making progress until `unblock()`: synchronisation time. What it
        waits for may be given as a function, called only for a report (formatting a text
        for every wait would cost more than the rest of the wait's bookkeeping)."""
        if self._blocked_at is None:
            self._blocked_at = self.sim.clock.now
        self._waiting_for = waiting_for

    def unblock(self) -> None:
        if self._blocked_at is not None:
            self._wait_s += self.sim.clock.now - self._blocked_at
            self._blocked_at = None
        self._waiting_for = ""

    def charge(self, network_s: float = 0.0, nbytes: float = 0.0) -> None:
        """Count modelled transfer time and bytes sent towards this iteration's row (the
        channel's operations do: `simulator.channel`)."""
        self._network_s += network_s
        self._bytes += nbytes

    def end_iteration(self, **extra: Any) -> None:
        """Iteration `self.iteration + 1` is complete: log its row."""
        self.iteration += 1
        row = {"t": self.sim.clock.now, "iteration": self.iteration,
               "compute_s": self._compute_s, "injected_delay_s": self._injected_s,
               "sync_wait_s": self._wait_s, "network_s": self._network_s,
               "bytes_sent": int(self._bytes)}
        math = self.sim.math
        if math is not None:
            row["loss"] = math.last_loss[self.rank]
        if extra:
            row.update(extra)
        self.rows.append(row)
        self._compute_s = self._injected_s = self._wait_s = self._network_s = 0.0
        self._bytes = 0.0

    def end_iteration_then(self, iteration: int, stop: bool,
                           computed: Callable[[int], None]) -> None:
        """Iteration `iteration` is complete: log its row, then leave the run if `stop`, else
        compute the next iteration and call `computed` with it."""
        self.end_iteration()
        if stop:
            self.finish()
        else:
            self.compute(iteration + 1, computed, iteration + 1)

    def finish(self) -> None:
        """The worker left the run."""
        self.done = True
        self._waiting_for = ""
