"""All-Reduce's and DDP's decisions: one sum-all-reduce per iteration, the stop vote in it; no I/O.

Theory of operation. Each iteration every worker contributes its gradients divided by the
world size (`divisor`), plus its stop vote (1 or 0), to one sum-all-reduce. The collective
completes once every worker has contributed to it; each worker then holds the mean gradient and
the number of workers that voted. The run stops after the first iteration in which any worker
voted, so all stop after the same iteration and no extra message is needed. No worker leaves an
all-reduce run before that agreed stop, so the live workers are always all `world` of them.

Two classes. `AllReduceWorker` is one worker's side: `GradientsReady` -> `Reduce` (what to
contribute), `Reduced` (the collective's vote count) -> `Finish` (whether to stop).
`AllReduceRound` is the collective's completion rule, the part gloo or NCCL play in real runs:
`Contributed` from each worker -> `Completed` once all have. The real drivers use the worker
side only; a simulator drives both, feeding each worker `Reduced(votes=Completed.votes)`.
Both cost O(1) per event.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol, TypeVar

from hetsync.cores.core import Core, unhandled
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.cores.events import FROZEN

__all__ = [
    "AllReduceDecisionHandler", "AllReduceRound", "AllReduceState", "AllReduceWorker",
    "Completed", "Contributed", "Decision", "Finish", "GradientsReady", "Reduce", "Reduced",
    "Regrouped", "dispatch",
]


# --- the worker's events and decisions ---------------------------------------------------------
@dataclass(**FROZEN)
class GradientsReady:
    """The gradients of `iteration` are computed; `wants_stop`: this worker's stop conditions."""

    iteration: int
    wants_stop: bool


@dataclass(**FROZEN)
class Reduced:
    """The collective of `iteration` completed; `votes` workers voted to stop."""

    iteration: int
    votes: int


@dataclass(**FROZEN)
class Regrouped:
    """The run's membership changed to `world` workers (a new generation, `--on-failure
    rejoin`), the collective of `iteration` given up if one was under way: a worker restarted
    and back, or one that will not come back left out."""

    iteration: int
    world: int


@dataclass(**FROZEN)
class Reduce:
    """Contribute the gradients divided by `divisor`, and `vote` (1 or 0), to the collective."""

    iteration: int
    divisor: int
    vote: int


@dataclass(**FROZEN)
class Finish:
    """`iteration` is done; the run stops after it if `stop`."""

    iteration: int
    stop: bool


Decision = Reduce | Finish
"""A worker's decisions (the collective's, `Completed`, have one engine: the simulator)."""

R = TypeVar("R", covariant=True)


class AllReduceDecisionHandler(Protocol[R]):
    """What executes a worker's decisions: the driver and the simulated worker each
    implement every method, so a decision added here fails type-checking (and
    tests/protocols/test_decision_handlers.py) in both until both carry it out."""

    def on_reduce(self, decision: Reduce, /) -> R: ...
    def on_finish(self, decision: Finish, /) -> R: ...


def dispatch(decision: Decision, handler: AllReduceDecisionHandler[R]) -> R:
    """Carry out `decision` with `handler`'s method for its type."""
    match decision:
        case Reduce():
            return handler.on_reduce(decision)
        case Finish():
            return handler.on_finish(decision)
        case _:
            unhandled(decision)


# --- the collective's events and decisions -----------------------------------------------------
@dataclass(**FROZEN)
class Contributed:
    """`rank` contributed to the collective of `iteration` with `vote` (a `Reduce`'s)."""

    rank: int
    iteration: int
    vote: int


@dataclass(**FROZEN)
class Completed:
    """Every worker contributed to `iteration`: the sum exists; `votes` voted to stop."""

    iteration: int
    votes: int
    stop: bool


class AllReduceState(Enum):
    IDLE = "idle"  # between iterations (worker), or waiting for contributions (round)
    REDUCING = "reducing"  # the worker contributed; waiting for the collective
    DONE = "done"  # the agreed stop passed; every call raises
    ERROR = "error"  # a misuse or a broken invariant; every call raises


class AllReduceWorker(Core[GradientsReady | Reduced | Regrouped, Decision]):
    """One worker's all-reduce decisions (see the module doc)."""
    REFUSING = frozenset({"ERROR", "DONE"})  # a finished run takes no more events

    def __init__(self, rank: int, world: int) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"Arg `rank` must be in 0..{world - 1} (got {rank})")
        self.rank, self.world = rank, world
        self.state = AllReduceState.IDLE
        self.iteration = 0
        """The iteration reducing, or the last finished."""
        self._vote = 0  # this worker's vote in the iteration reducing

    @property
    def divisor(self) -> int:
        """What each worker divides its gradients by: the sum is then their mean."""
        return self.world

    @property
    def who(self) -> str:
        return f"allreduce rank {self.rank}"

    def _handle(self, event: GradientsReady | Reduced | Regrouped) -> list[Reduce | Finish]:
        if isinstance(event, GradientsReady):
            if self.state is not AllReduceState.IDLE or event.iteration <= self.iteration:
                raise self._local(event)
            self.iteration = event.iteration
            self.state = AllReduceState.REDUCING
            self._vote = 1 if event.wants_stop else 0
            return [Reduce(iteration=event.iteration, divisor=self.world, vote=self._vote)]
        if isinstance(event, Regrouped):
            if event.world < 1 or event.iteration != self.iteration:
                raise self._local(event)
            self.world = event.world
            if self.state is not AllReduceState.REDUCING:
                return []
            return [Reduce(iteration=event.iteration, divisor=self.world, vote=self._vote)]
        if isinstance(event, Reduced):
            if self.state is not AllReduceState.REDUCING or event.iteration != self.iteration:
                raise self._local(event)
            if not 0 <= event.votes <= self.world:
                raise RemoteProtocolError(f"allreduce rank {self.rank}: {event!r}: votes must "
                                          f"be in 0..{self.world}")
            stop = event.votes > 0
            self.state = AllReduceState.DONE if stop else AllReduceState.IDLE
            return [Finish(iteration=event.iteration, stop=stop)]
        raise LocalProtocolError(f"allreduce rank {self.rank}: unknown event {event!r}")

    def _local(self, event: object) -> LocalProtocolError:
        return LocalProtocolError(f"allreduce rank {self.rank}: cannot take {event!r} in state "
                                  f"{self.state.name} (iteration {self.iteration})")


class AllReduceRound(Core[Contributed, Completed]):
    """When each iteration's collective completes, across all workers (see the module doc)."""
    REFUSING = frozenset({"ERROR", "DONE"})  # a finished run takes no more events

    def __init__(self, world: int) -> None:
        if world < 1:
            raise ValueError(f"Arg `world` must be >= 1 (got {world})")
        self.world = world
        self.state = AllReduceState.IDLE
        self.iteration: int | None = None
        """The iteration collecting contributions (None before the first)."""
        self.count = self.votes = 0
        self._last = [0] * world  # the iteration each rank last contributed to

    @property
    def who(self) -> str:
        return "allreduce round"

    def _handle(self, event: Contributed) -> list[Completed]:
        if not isinstance(event, Contributed):
            raise LocalProtocolError(f"allreduce round: unknown event {event!r}")
        rank, k = event.rank, event.iteration
        if not 0 <= rank < self.world:
            raise RemoteProtocolError(f"allreduce round: {event!r}: no such rank")
        if self.iteration is None:
            self.iteration = k
        if k != self.iteration or self._last[rank] == k:
            raise RemoteProtocolError(
                f"allreduce round: {event!r}: the collective is at iteration {self.iteration}"
                + (" and this rank already contributed" if self._last[rank] == k else ""))
        self._last[rank] = k
        self.count += 1
        self.votes += event.vote
        if self.count < self.world:
            return []
        done = Completed(iteration=k, votes=self.votes, stop=self.votes > 0)
        self.count = self.votes = 0
        self.iteration = k + 1
        if done.stop:
            self.state = AllReduceState.DONE
        return [done]
