"""The parameter server's decisions, sync (with backup workers) and async, and its workers'; no I/O.

Theory of operation. Every worker pushes a gradient computed on the model version it last
pulled, with its stop vote, and waits for the reply: the server's model at some version. So
each worker has at most one push outstanding, and every push is answered exactly once.

- `mode="sync"`: rounds, as `hetsync.protocols.ps.rounds.SyncRounds` keeps them. A round adds the
  pushes computed on its version (`Accumulate`) and closes at min(n - backup, live) of them:
  the server applies their mean (`Apply`, divisor = their count) and answers them. A push whose
  round already closed (a backup worker's) is dropped: answered at once with the current model,
  its staleness > 0. Stop votes are OR-ed; every reply from the first round closed after a vote
  says stop.
- `mode="async"`: each push is applied as it arrives, with 1/n of the learning rate and 1/n of
  its buffer change (n pushes then move the model as far as one sync round), and only its
  sender is answered. staleness = the server's version before applying it - the version the
  gradient was computed on. Replies never say stop: workers stop on their own.

A worker that leaves (`Bye`, after its last reply) is no longer waited for by sync rounds; its
leaving may close the open round. A worker lost from the run (`WorkerLost`, `--on-failure
continue`) leaves as if it said goodbye, except that a push of its waiting in the open sync
round still counts: it leaves when that round closes (its reply goes nowhere), so the round
still waits for every survivor; anything else it sent arrives too late and is dropped (the
core does this, not each engine). Server events come from workers, so a push that breaks these
rules (a second push before its reply, a version the server never had, anything after a `Bye`)
raises `RemoteProtocolError`.

`PSWorkerCore` is one worker's side: it tags each push with the version of its last reply and
decides its stop (the reply's in sync mode, its own vote in async mode) and whether its
gradient was dropped (sync with backups). Both cores do O(1) work per event, plus O(round) when
a round closes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol, TypeVar

from hetsync.cores.core import Core, unhandled
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.cores.events import FROZEN
from hetsync.protocols.ps.rounds import Reply, SyncRounds

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = [
    "Accumulate", "Answer", "Apply", "Bye", "GradientReady", "Leave", "LoadModel", "PSServerCore",
    "PSState", "PSWorkerCore", "Push", "ReplyReceived", "SendBye", "SendPush", "ServerDecision",
    "ServerDecisionHandler", "WorkerDecision", "WorkerDecisionHandler", "WorkerLost",
    "dispatch_server", "dispatch_worker",
]

MODES = ("sync", "async")


# --- the server's events and decisions ---------------------------------------------------------
@dataclass(**FROZEN)
class Push:
    """`rank` pushed a gradient computed on model `version`, with its stop `vote`."""

    rank: int
    version: int
    vote: bool


@dataclass(**FROZEN)
class Bye:
    """`rank` left the run (after its last reply)."""

    rank: int


@dataclass(**FROZEN)
class WorkerLost:
    """`rank` was lost from the run (`--on-failure continue`), maybe with its push unanswered."""

    rank: int


@dataclass(**FROZEN)
class Accumulate:
    """Add `rank`'s push (gradient and buffer change) to the sums of the next `Apply`."""

    rank: int


@dataclass(**FROZEN)
class Apply:
    """Step the server's model to `version`: gradient = sums / `divisor`, at the learning rate x
    `lr_scale`; buffers += buffer change sums / `buffer_divisor`; then zero the sums."""

    version: int
    divisor: int
    buffer_divisor: int
    lr_scale: float


@dataclass(**FROZEN)
class Answer:
    """Send `ranks` the model at `version` (now the server's), with `staleness` and `stop`."""

    ranks: tuple[int, ...]
    version: int
    staleness: int
    stop: bool


ServerDecision = Accumulate | Apply | Answer

R = TypeVar("R", covariant=True)


class ServerDecisionHandler(Protocol[R]):
    """What executes the server's decisions: the driver's server thread and the simulated
    one each implement every method, so a decision added here fails type-checking (and
    tests/protocols/test_decision_handlers.py) in both until both carry it out."""

    def on_accumulate(self, decision: Accumulate, /) -> R: ...
    def on_apply(self, decision: Apply, /) -> R: ...
    def on_answer(self, decision: Answer, /) -> R: ...


def dispatch_server(decision: ServerDecision, handler: ServerDecisionHandler[R]) -> R:
    """Carry out `decision` with `handler`'s method for its type."""
    match decision:
        case Accumulate():
            return handler.on_accumulate(decision)
        case Apply():
            return handler.on_apply(decision)
        case Answer():
            return handler.on_answer(decision)
        case _:
            unhandled(decision)


# --- the worker's events and decisions ---------------------------------------------------------
@dataclass(**FROZEN)
class GradientReady:
    """The gradient of `iteration` is computed; `wants_stop`: this worker's stop conditions."""

    iteration: int
    wants_stop: bool


@dataclass(**FROZEN)
class ReplyReceived:
    """The server's reply: its model at `version`, `staleness`, `stop`."""

    version: int
    staleness: int
    stop: bool


@dataclass(**FROZEN)
class Leave:
    """The worker leaves the run."""


@dataclass(**FROZEN)
class SendPush:
    """Push the gradient (and buffer change) computed on `version`, with `vote`."""

    iteration: int
    version: int
    vote: bool


@dataclass(**FROZEN)
class LoadModel:
    """Load the reply's model; `iteration` is done. `dropped`: its gradient was dropped (None
    without backups); the run stops after it for this worker if `stop`."""

    iteration: int
    version: int
    staleness: int
    dropped: bool | None
    stop: bool


@dataclass(**FROZEN)
class SendBye:
    """Tell the server this worker left."""


WorkerDecision = SendPush | LoadModel | SendBye


class WorkerDecisionHandler(Protocol[R]):
    """What executes a worker's decisions: the driver and the simulated worker each
    implement every method, so a decision added here fails type-checking (and
    tests/protocols/test_decision_handlers.py) in both until both carry it out."""

    def on_send_push(self, decision: SendPush, /) -> R: ...
    def on_load_model(self, decision: LoadModel, /) -> R: ...
    def on_send_bye(self, decision: SendBye, /) -> R: ...


def dispatch_worker(decision: WorkerDecision, handler: WorkerDecisionHandler[R]) -> R:
    """Carry out `decision` with `handler`'s method for its type."""
    match decision:
        case SendPush():
            return handler.on_send_push(decision)
        case LoadModel():
            return handler.on_load_model(decision)
        case SendBye():
            return handler.on_send_bye(decision)
        case _:
            unhandled(decision)


class PSState(Enum):
    SERVING = "serving"  # server: taking pushes
    IDLE = "idle"  # worker: between iterations
    PUSHED = "pushed"  # worker: waiting for its reply
    STOPPED = "stopped"  # worker: the run stopped for it; only `Leave` remains
    DONE = "done"  # worker: left; every call raises
    ERROR = "error"  # a misuse or a broken invariant; every call raises


class PSServerCore(Core[Push | Bye | WorkerLost, ServerDecision]):
    """The parameter server's decisions (see the module doc)."""

    @classmethod
    def of_run(cls, options: RunOptions, world: int) -> PSServerCore:
        """The server's core in a run of `world` workers: the one recipe the driver and the
        simulation share."""
        return cls(world, options.ps_mode, options.ps_backup)

    def __init__(self, world: int, mode: str = "sync", backup: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"Arg `mode` must be one of {MODES} (got {mode!r})")
        if backup and mode != "sync":
            raise ValueError("Arg `backup` applies to mode 'sync' (async waits for no one)")
        self.world, self.sync = world, mode == "sync"
        self.rounds = SyncRounds(world, backup)  # raises ValueError for a bad backup
        self.version = 0
        """The server's model version (async; sync's is `rounds.version`)."""
        self.state = PSState.SERVING
        self._awaiting = bytearray(world)  # 1: the rank's push is unanswered
        self._left = bytearray(world)
        self._lost_in_round: set[int] = set()  # lost with a push in the open round
        self._lost: set[int] = set()  # declared lost: what they sent before no longer counts

    @property
    def dropped(self) -> int:
        """Gradients dropped so far (sync with backups)."""
        return self.rounds.dropped

    @property
    def who(self) -> str:
        return "ps server"

    def _handle(self, event: Push | Bye | WorkerLost) -> list[ServerDecision]:
        if isinstance(event, WorkerLost):
            return self._lose(event)
        if not isinstance(event, Push | Bye):
            raise LocalProtocolError(f"ps server: unknown event {event!r}")
        rank = event.rank
        if rank in self._lost:
            return []  # sent before its sender was lost: it no longer counts
        if not 0 <= rank < self.world or self._left[rank]:
            raise RemoteProtocolError(f"ps server: {event!r}: "
                                      + ("that rank left" if 0 <= rank < self.world
                                         else "no such rank"))
        if self._awaiting[rank]:
            raise RemoteProtocolError(f"ps server: {event!r}: its last push is unanswered")
        if isinstance(event, Bye):
            self._left[rank] = 1
            return self._answer(self.rounds.leave()) if self.sync else []
        self._awaiting[rank] = 1
        if self.sync:
            decision = self.rounds.push(rank, event.version, event.vote)
            accept = [Accumulate(rank=rank)] if decision.accept else []
            return accept + self._answer(decision.reply)
        if event.version > self.version:
            raise RemoteProtocolError(f"ps server: {event!r}: the server is at version "
                                      f"{self.version}")
        staleness = self.version - event.version
        self.version += 1
        self._awaiting[rank] = 0
        return [Accumulate(rank=rank),
                Apply(version=self.version, divisor=1, buffer_divisor=self.world,
                      lr_scale=1.0 / self.world),
                Answer(ranks=(rank,), version=self.version, staleness=staleness, stop=False)]

    def _lose(self, event: WorkerLost) -> list[ServerDecision]:
        rank = event.rank
        if not 0 <= rank < self.world:
            raise RemoteProtocolError(f"ps server: {event!r}: no such rank")
        if self._left[rank]:
            return []  # it had said goodbye
        self._left[rank] = 1
        self._lost.add(rank)
        if self._awaiting[rank]:  # sync: its push waits in the open round (async answers at once)
            self._lost_in_round.add(rank)
            return []
        return self._answer(self.rounds.leave()) if self.sync else []

    def _answer(self, reply: Reply | None) -> list[ServerDecision]:
        if reply is None:
            return []
        for rank in reply.ranks:
            self._awaiting[rank] = 0
            if rank in self._lost_in_round:  # its round closed: now it leaves
                self._lost_in_round.discard(rank)
                empty = self.rounds.leave()
                assert empty is None  # the round just closed has no members yet
        answer = Answer(ranks=reply.ranks, version=reply.version, staleness=reply.staleness,
                        stop=reply.stop)
        if not reply.applied:
            return [answer]
        return [Apply(version=reply.version, divisor=reply.applied,
                      buffer_divisor=reply.applied, lr_scale=1.0), answer]


class PSWorkerCore(Core[GradientReady | ReplyReceived | Leave, WorkerDecision]):
    """One parameter-server worker's decisions (see the module doc)."""
    REFUSING = frozenset({"ERROR", "DONE"})  # a finished run takes no more events

    @classmethod
    def of_run(cls, options: RunOptions, rank: int) -> PSWorkerCore:
        """Rank `rank`'s core in a run: the one recipe the driver and the simulation share."""
        return cls(rank, options.ps_mode, options.ps_backup)

    def __init__(self, rank: int, mode: str = "sync", backup: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"Arg `mode` must be one of {MODES} (got {mode!r})")
        self.rank, self.sync, self.backup = rank, mode == "sync", backup
        self.version = 0
        """The version of the model last loaded (every worker starts from the server's 0)."""
        self.iteration = 0
        self.state = PSState.IDLE
        self._wants_stop = False

    @property
    def who(self) -> str:
        return f"ps rank {self.rank}"

    def _handle(self, event: GradientReady | ReplyReceived | Leave) -> list[WorkerDecision]:
        if isinstance(event, GradientReady):
            if self.state is not PSState.IDLE or event.iteration <= self.iteration:
                raise self._local(event)
            self.iteration, self._wants_stop = event.iteration, event.wants_stop
            self.state = PSState.PUSHED
            return [SendPush(iteration=event.iteration, version=self.version,
                             vote=event.wants_stop)]
        if isinstance(event, ReplyReceived):
            if self.state is not PSState.PUSHED:
                raise RemoteProtocolError(f"ps rank {self.rank}: {event!r} answers no push")
            if event.version <= self.version:  # applied or dropped, the server moved past
                raise RemoteProtocolError(f"ps rank {self.rank}: {event!r} answers a push "
                                          f"computed on version {self.version}")
            stop = event.stop if self.sync else self._wants_stop
            self.version = event.version
            self.state = PSState.STOPPED if stop else PSState.IDLE
            return [LoadModel(iteration=self.iteration, version=event.version,
                              staleness=event.staleness,
                              dropped=event.staleness > 0 if self.backup else None, stop=stop)]
        if isinstance(event, Leave):
            if self.state not in (PSState.IDLE, PSState.STOPPED):
                raise self._local(event)
            self.state = PSState.DONE
            return [SendBye()]
        raise LocalProtocolError(f"ps rank {self.rank}: unknown event {event!r}")

    def _local(self, event: object) -> LocalProtocolError:
        return LocalProtocolError(f"ps rank {self.rank}: cannot take {event!r} in state "
                                  f"{self.state.name} (iteration {self.iteration})")
