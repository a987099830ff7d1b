"""One D-PSGD worker's decisions (Lian et al., NeurIPS 2017): exchange, average, stop; no I/O.

Theory of operation. Iteration k of worker i: when it starts, i sends x_k to its out-neighbours
of iteration k, tagged with its current `stop_at` (`Exchange`); it computes its gradient on
x_k meanwhile; once the gradient is computed (`ComputeFinished`) and every in-neighbour's x_k
has arrived (`ModelReceived`, in any order), it averages with the topology's weights of
iteration k and applies the gradient (`Average`). Nothing is optional: a neighbour that never
sends x_k blocks i forever, which is what makes D-PSGD synchronous.

Stopping together: `hetsync.cores.stop_agreement.StopAgreement`. A worker whose own stop
conditions hold during k votes when its compute finishes; the `stop_at` each message carries
is merged when its iteration completes (as the real driver reads its buffers then, whatever the
arrival order), and `Average.stop` says whether k is the agreed last iteration.

The neighbourhood of iteration k is `phases[k % len(phases)]` (one phase for a static graph),
precomputed once by `Neighbourhood.of_topology`, so each event costs O(1) and each iteration
O(degree). A message for an iteration already completed, from a rank that is not an
in-neighbour of that iteration, or twice, raises `RemoteProtocolError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, TypeVar

import networkx as nx

from hetsync.cores.core import Core, unhandled
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.cores.events import FROZEN, ComputeFinished, IterationStarted
from hetsync.cores.stop_agreement import StopAgreement

__all__ = [
    "Average", "ComputeFinished", "DPSGDCore", "DPSGDDecisionHandler", "DPSGDState", "Decision",
    "Exchange", "IterationStarted", "ModelReceived", "Neighbourhood", "dispatch", "flood_hops",
]


class _Topology(Protocol):
    """What `Neighbourhood.of_topology` and `flood_hops` read (hetsync.topology.Topology)."""

    world: int
    dynamic: bool
    graph: nx.DiGraph

    @property
    def period(self) -> int: ...
    def in_peers(self, rank: int, iteration: int = 0) -> list[int]: ...
    def out_peers(self, rank: int, iteration: int = 0) -> list[int]: ...
    def recv_weights(self, rank: int, iteration: int = 0) -> tuple[float, dict[int, float]]: ...


@dataclass(**FROZEN)
class Neighbourhood:
    """One rank's peers and mixing weights in one phase of the topology."""

    in_peers: tuple[int, ...]
    out_peers: tuple[int, ...]
    self_weight: float
    weights: Mapping[int, float]

    @staticmethod
    def of_topology(topology: _Topology, rank: int) -> tuple[Neighbourhood, ...]:
        """`rank`'s neighbourhood in each phase: iteration k uses entry k % period."""
        phases = []
        for phase in range(topology.period):
            self_weight, weights = topology.recv_weights(rank, phase)
            phases.append(Neighbourhood(in_peers=tuple(topology.in_peers(rank, phase)),
                                        out_peers=tuple(topology.out_peers(rank, phase)),
                                        self_weight=self_weight, weights=weights))
        return tuple(phases)


# --- events in ---------------------------------------------------------------------------------
# (IterationStarted and ComputeFinished: hetsync.cores.events, shared with other cores)
@dataclass(**FROZEN)
class ModelReceived:
    """x_k of in-neighbour `src` for `iteration` k arrived, tagged with the sender's `stop_at`
    (math.inf: none known)."""

    src: int
    iteration: int
    stop_at: float


# --- decisions out -----------------------------------------------------------------------------
@dataclass(**FROZEN)
class Exchange:
    """Send x_k tagged `stop_at` (math.inf: none) to `send_to`; x_k will come from
    `receive_from`."""

    iteration: int
    send_to: tuple[int, ...]
    receive_from: tuple[int, ...]
    stop_at: float


@dataclass(**FROZEN)
class Average:
    """x <- self_weight * x_k + sum_j weights[j] * x_k(j), then the gradient; `iteration` is
    done, and is the run's last if `stop`."""

    iteration: int
    self_weight: float
    weights: Mapping[int, float]
    stop: bool


Decision = Exchange | Average

R = TypeVar("R", covariant=True)


class DPSGDDecisionHandler(Protocol[R]):
    """What executes D-PSGD's decisions: the driver and the simulated worker each implement
    every method, so a decision added here fails type-checking (and
    tests/protocols/test_decision_handlers.py) in both until both carry it out."""

    def on_exchange(self, decision: Exchange, /) -> R: ...
    def on_average(self, decision: Average, /) -> R: ...


def dispatch(decision: Decision, handler: DPSGDDecisionHandler[R]) -> R:
    """Carry out `decision` with `handler`'s method for its type."""
    match decision:
        case Exchange():
            return handler.on_exchange(decision)
        case Average():
            return handler.on_average(decision)
        case _:
            unhandled(decision)


class DPSGDState(Enum):
    IDLE = "idle"  # between iterations
    COMPUTING = "computing"  # x_k sent; the gradient is being computed
    COLLECTING = "collecting"  # gradient computed; waiting for in-neighbours' x_k
    DONE = "done"  # the agreed last iteration completed; every call raises
    ERROR = "error"  # a misuse or a broken invariant; every call raises


class DPSGDCore(Core[IterationStarted | ComputeFinished | ModelReceived, Decision]):
    """One D-PSGD worker's state machine (see the module doc)."""
    REFUSING = frozenset({"ERROR", "DONE"})  # a finished run takes no more events

    @classmethod
    def of_run(cls, topology: _Topology, rank: int, max_iterations: int | None) -> DPSGDCore:
        """Rank `rank`'s core in a run: the one recipe the driver and the simulation share."""
        return cls(rank, Neighbourhood.of_topology(topology, rank), flood_hops(topology),
                   max_iterations)

    def __init__(self, rank: int, phases: Sequence[Neighbourhood], hops: int,
                 max_iterations: int | None = None) -> None:
        if not phases:
            raise ValueError("Arg `phases` must name at least one neighbourhood")
        for phase in phases:
            if set(phase.weights) != set(phase.in_peers):
                raise ValueError(f"rank {rank}: weights {sorted(phase.weights)} must name the "
                                 f"in-neighbours {phase.in_peers}")
        self.rank = rank
        self.phases = tuple(phases)
        self.agreement = StopAgreement(hops, max_iterations)
        self.state = DPSGDState.IDLE
        self.iteration = 0
        """The iteration running, or the last completed (IDLE)."""
        self._arrived: dict[int, set[int]] = {}  # iteration -> senders of x_k so far
        self._stop_at: dict[int, float] = {}  # iteration -> least stop_at received with it

    def neighbourhood(self, iteration: int) -> Neighbourhood:
        return self.phases[iteration % len(self.phases)]

    @property
    def waiting_for(self) -> tuple[int, ...]:
        """In-neighbours whose x_k the running iteration still lacks."""
        if self.state not in (DPSGDState.COMPUTING, DPSGDState.COLLECTING):
            return ()
        arrived = self._arrived.get(self.iteration, ())
        return tuple(j for j in self.neighbourhood(self.iteration).in_peers if j not in arrived)

    @property
    def who(self) -> str:
        return f"dpsgd rank {self.rank}"

    def _handle(self, event: IterationStarted | ComputeFinished | ModelReceived
                ) -> list[Exchange | Average]:
        if isinstance(event, ModelReceived):
            self._receive(event)
            return self._try_finish() if self.state is DPSGDState.COLLECTING else []
        if isinstance(event, IterationStarted):
            if self.state is not DPSGDState.IDLE or event.iteration <= self.iteration:
                raise self._local(event)
            k = self.iteration = event.iteration
            self.state = DPSGDState.COMPUTING
            peers = self.neighbourhood(k)
            return [Exchange(iteration=k, send_to=peers.out_peers, receive_from=peers.in_peers,
                             stop_at=self.agreement.stop_at)]
        if isinstance(event, ComputeFinished):
            if self.state is not DPSGDState.COMPUTING or event.iteration != self.iteration:
                raise self._local(event)
            if event.wants_stop:
                self.agreement.vote(event.iteration)
            self.state = DPSGDState.COLLECTING
            return self._try_finish()
        raise LocalProtocolError(f"dpsgd rank {self.rank}: unknown event {event!r}")

    def _receive(self, event: ModelReceived) -> None:
        k, src = event.iteration, event.src
        running = self.iteration if self.state is not DPSGDState.IDLE else self.iteration + 1
        if k < running or src not in self.neighbourhood(k).weights:
            raise RemoteProtocolError(
                f"dpsgd rank {self.rank}: {event!r}: "
                + ("that iteration is over" if k < running else "not an in-neighbour then"))
        arrived = self._arrived.get(k)
        if arrived is None:
            arrived = self._arrived[k] = set()
        elif src in arrived:
            raise RemoteProtocolError(f"dpsgd rank {self.rank}: {event!r} arrived twice")
        arrived.add(src)
        if event.stop_at < self._stop_at.get(k, math.inf):
            self._stop_at[k] = event.stop_at

    def _try_finish(self) -> list[Average]:
        k = self.iteration
        peers = self.neighbourhood(k)
        if len(self._arrived.get(k, ())) < len(peers.in_peers):
            return []
        self._arrived.pop(k, None)
        if k in self._stop_at:
            self.agreement.merge(self._stop_at.pop(k))
        stop = self.agreement.should_stop(k)
        self.state = DPSGDState.DONE if stop else DPSGDState.IDLE
        return [Average(iteration=k, self_weight=peers.self_weight, weights=peers.weights,
                        stop=stop)]

    def _local(self, event: object) -> LocalProtocolError:
        return LocalProtocolError(f"dpsgd rank {self.rank}: cannot take {event!r} in state "
                                  f"{self.state.name} (iteration {self.iteration})")


def flood_hops(topology: _Topology) -> int:
    """Iterations a message needs to reach every worker: the diameter, or a bound over time."""
    if topology.world <= 1:
        return 0
    if topology.dynamic:
        return topology.period * (topology.world - 1)
    return int(nx.diameter(topology.graph))
