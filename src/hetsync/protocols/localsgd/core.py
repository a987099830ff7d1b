"""One local-SGD worker's decisions: when to average, when to stop; and DiLoCo's outer step.

Theory of operation. A worker takes ordinary optimizer steps on its own shard and tells the
core after each (`StepDone`). Every `local_steps` (H) iterations, and at `--max-iterations`,
the core says to average (`Average`): every worker contributes its model and its stop vote to
one sum-all-reduce, the round `round` (rounds count 1, 2, ... on every worker alike, since all
run the same iterations between them). Between rounds nothing is sent (`Finish` with
`stop=False`), so a slow worker holds the others back once per round instead of every step.

Stopping together. Rounds are collectives, so the stop must be agreed at one: a worker whose
own stop conditions held at any iteration since the last round votes in the next, and the run
stops after the first round in which any worker voted (`Averaged.votes > 0`), as All-Reduce's
vote does. A time or target stop therefore lands up to H - 1 iterations late; a
`--max-iterations` stop lands exactly, as that iteration always ends with a round. A script
whose loop ends by itself (`iterate(loader, epochs=N)` running out) ends with `LoopEnded`: it
contributes to one last round, voting to stop, so the workers end on a common model. A worker
whose loop has not ended (a longer shard) reaches that round at its next boundary and stops
there: every worker has completed the same rounds (each needs all), so all take part in the
next one, and uneven shards end cleanly. Each contribution also says whether the worker
`moved` (took steps since the last round); a round in which none did (every loop ended right
after a round) leaves the models as they are: DiLoCo's outer step would only replay its
momentum (`Finish.outer_step`).

Left out: averaging over whoever has finished H steps (the heterogeneity-aware variant). An
all-reduce over the direct link needs every worker; averaging a subset needs someone to agree
on its members for each round (a coordinator, or Prague's Group Generator and P-Reduce), which
is a different protocol, not a different decision of this core.

DiLoCo (Douillard et al., 2023): the average is not taken as the new model but as the end of
a pseudo-step: Delta = anchor - mean(x after the local steps), where the anchor is the model
the round began from, and every worker applies the same outer SGD step with Nesterov momentum
to its anchor (`outer_nesterov`); all start from rank 0's model, so all hold the same anchor
and outer state. Each event costs O(1).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol, TypeVar

import torch

from hetsync.cores.core import Core, unhandled
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.cores.events import FROZEN

__all__ = [
    "Average", "Averaged", "Decision", "Finish", "LocalSGDDecisionHandler", "LocalSGDState",
    "LocalSGDWorker", "LoopEnded", "StepDone", "dispatch", "outer_nesterov",
]


# --- events in ---------------------------------------------------------------------------------
@dataclass(**FROZEN)
class StepDone:
    """The optimizer step of `iteration` is taken; `wants_stop`: this worker's stop conditions."""

    iteration: int
    wants_stop: bool


@dataclass(**FROZEN)
class Averaged:
    """The all-reduce of `round` completed; `votes` workers voted to stop."""

    round: int
    votes: int
    moved: int
    """How many workers took steps since the previous round."""


@dataclass(**FROZEN)
class LoopEnded:
    """The script's loop ended after `iteration` (the last completed) before the run stopped."""

    iteration: int


# --- decisions out -----------------------------------------------------------------------------
@dataclass(**FROZEN)
class Average:
    """Contribute the model, `vote` (1 or 0) and `moved` (1: steps were taken since the last
    round) to the all-reduce of `round`, which ends iteration `iteration`."""

    iteration: int
    round: int
    vote: int
    moved: int


@dataclass(**FROZEN)
class Finish:
    """`iteration` is done; the run stops after it if `stop`. After a round: with
    `outer_step`, DiLoCo takes its outer step from the mean (else the mean is the model)."""

    iteration: int
    stop: bool
    outer_step: bool = False


Decision = Average | Finish

R = TypeVar("R", covariant=True)


class LocalSGDDecisionHandler(Protocol[R]):
    """What executes Local SGD's decisions: the driver and the simulated worker each
    implement every method, so a decision added here fails type-checking (and
    tests/protocols/test_decision_handlers.py) in both until both carry it out."""

    def on_average(self, decision: Average, /) -> R: ...
    def on_finish(self, decision: Finish, /) -> R: ...


def dispatch(decision: Decision, handler: LocalSGDDecisionHandler[R]) -> R:
    """Carry out `decision` with `handler`'s method for its type."""
    match decision:
        case Average():
            return handler.on_average(decision)
        case Finish():
            return handler.on_finish(decision)
        case _:
            unhandled(decision)


class LocalSGDState(Enum):
    LOCAL = "local"  # taking local steps
    AVERAGING = "averaging"  # contributed to a round; waiting for it to complete
    DONE = "done"  # the agreed stop passed; every call raises
    ERROR = "error"  # a misuse or a broken invariant; every call raises


class LocalSGDWorker(Core[StepDone | Averaged | LoopEnded, Decision]):
    """One worker's local-SGD decisions (see the module doc)."""
    REFUSING = frozenset({"ERROR", "DONE"})  # a finished run takes no more events

    def __init__(self, rank: int, world: int, local_steps: int,
                 max_iterations: int | None = None) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"Arg `rank` must be in 0..{world - 1} (got {rank})")
        if local_steps < 1:
            raise ValueError(f"Arg `local_steps` must be >= 1 (got {local_steps})")
        self.rank, self.world, self.local_steps = rank, world, local_steps
        self.max_iterations = max_iterations
        self.state = LocalSGDState.LOCAL
        self.iteration = 0
        """The last iteration whose step was taken."""
        self.round = 0
        """The last round contributed to."""
        self.since_round = 0
        """Local steps taken since the last round."""
        self._vote = False  # this worker's stop conditions held since the last round

    @property
    def who(self) -> str:
        return f"localsgd rank {self.rank}"

    def _handle(self, event: StepDone | Averaged | LoopEnded) -> list[Average | Finish]:
        if isinstance(event, StepDone):
            if self.state is not LocalSGDState.LOCAL or event.iteration != self.iteration + 1:
                raise self._local(event)
            self.iteration = event.iteration
            self.since_round += 1
            self._vote |= event.wants_stop
            last = self.max_iterations is not None and event.iteration >= self.max_iterations
            if self.since_round < self.local_steps and not last:
                return [Finish(iteration=event.iteration, stop=False)]
            return [self._average()]
        if isinstance(event, LoopEnded):
            if self.state is not LocalSGDState.LOCAL or event.iteration != self.iteration:
                raise self._local(event)
            self._vote = True
            return [self._average()]
        if isinstance(event, Averaged):
            if self.state is not LocalSGDState.AVERAGING or event.round != self.round:
                raise self._local(event)
            if not (0 <= event.votes <= self.world and 0 <= event.moved <= self.world):
                raise RemoteProtocolError(f"localsgd rank {self.rank}: {event!r}: votes and "
                                          f"moved must be in 0..{self.world}")
            stop = event.votes > 0
            self.state = LocalSGDState.DONE if stop else LocalSGDState.LOCAL
            return [Finish(iteration=self.iteration, stop=stop, outer_step=event.moved > 0)]
        raise LocalProtocolError(f"localsgd rank {self.rank}: unknown event {event!r}")

    def _average(self) -> Average:
        moved = int(self.since_round > 0)
        self.round += 1
        self.since_round = 0
        self.state = LocalSGDState.AVERAGING
        vote, self._vote = self._vote, False
        return Average(iteration=self.iteration, round=self.round, vote=int(vote), moved=moved)

    def _local(self, event: object) -> LocalProtocolError:
        return LocalProtocolError(f"localsgd rank {self.rank}: cannot take {event!r} in state "
                                  f"{self.state.name} (iteration {self.iteration})")


def outer_nesterov(anchor: torch.Tensor, mean: torch.Tensor, buffer: torch.Tensor, lr: float,
                   momentum: float) -> torch.Tensor:
    """DiLoCo's outer step, as `torch.optim.SGD(lr, momentum, nesterov=True)` on the
    pseudo-gradient Delta = anchor - mean: buffer <- momentum * buffer + Delta (in place; a
    zero buffer makes the first step torch's), returns anchor - lr * (Delta + momentum *
    buffer). Broadcasts, so rows of many workers' anchors may share one mean."""
    delta = anchor - mean
    buffer.mul_(momentum).add_(delta)
    return anchor - lr * (delta + momentum * buffer)
