"""One Prague worker's side of the Group Generator protocol: when to ask, reduce, step; no I/O.

Theory of operation. The worker loops: local step -> ask the Group Generator (GG) for a group
-> P-Reduce (average within the group) -> next step. The GG may also put this worker into
groups other workers asked for; they queue up and run in id order, the GG's one global order
(so no wait cycle can form across workers; see `group_generator`, which also says why the
channels must be FIFO: a group older than one already received raises). A group that arrives
during a step waits for the step's end: the P-Reduce is a collective the driver runs between
steps. The next step starts once the GG has answered this step's request and the queue is
empty, so every step is averaged at least once and no member of a queued group is kept waiting
for a step that need not have started. A `last` step is followed by `StopTraining` instead.

Events in: `StepFinished`, `GroupAssigned` (a message from the GG), `PReduceFinished`.
Decisions out, to execute in order: `RequestGroup` (send to the GG), `RunPReduce` (run it,
then feed `PReduceFinished`), `ReportFinished` (tell the GG `GroupFinished`), `StartStep`,
`StopTraining`. The core is born in COMPUTING: the driver starts step `first_iteration` by
itself.

Reporting a finished group with the next request (`report_with_request`, with the GG's
`ready` policy): that policy decides nothing from when a group finished (its groups form from
workers waiting for one, each of which has finished its groups by then), so a finished group
can ride in the worker's next request instead of a message of its own: two messages through
rank 0 per step instead of three. The GG sees it before the request, as it would have seen
the message. One group is held at a time (a second one finishing reports the first at once),
and none once the last request is sent, so every group is reported before the worker leaves.

Overlap (`overlap=True`, `--overlap`): the P-Reduces run beside the compute instead of
between steps, as D-PSGD overlaps its exchange. The driver averages a *communication copy* of
the model (`c`) and keeps the model it trains apart; `MergeModels` moves the averages into the
model and hands the model to the next P-Reduces: x <- c + (x - s), then c = s = x, where s is
what was handed over last (so the local updates made meanwhile, x - s, are kept and the sum
of the models is conserved with lr 0). A finished step is merged and its request sent at once,
and the next step starts without waiting for the answer; the step after it waits until the
answer's group is done (and no P-Reduce runs, so that `c` is not read half-averaged), then
merges. So each step's model is averaged exactly as without overlap, but the gradient of step
k+1 is taken at x_k before its average: the average lands one step late (x_{k+1} = avg(x_k) +
update(x_k)). Groups assigned by others run as soon as they come, in id order, whatever the
step does. A `last` step is merged, requested, and left once its answer's group and every
queued group are done, with a final merge. Groups assigned before the first merge wait for
it: the copy is made there, from the model the training loop has then (possibly loaded).

Group lag (`group_lag=L`, `--group-lag`, overlap only): a step that ends before the previous
answer's group is done (a slow member, a late answer) does not wait for it, up to L steps in a
row: the next step starts with no merge and no request, and that step's update reaches the
model's next average with the merge after it (x - s holds every update since the handover).
A slow member then holds back only its own groups, not its partners' compute; what they lose
is the averages they would have waited for, which a fast worker paired with no one (a group
of one while the slow one computes) does not have either. L = 0 is the wait above; a `last`
step always waits.

Errors: an event the driver should not feed now (a step never started, a P-Reduce never run)
raises `LocalProtocolError`; a GG message that breaks the protocol (a group without this rank,
out of the global order, an answer to no request) raises `RemoteProtocolError`. Afterwards
the core is in ERROR and every call raises.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol, TypeVar

from hetsync.cores.core import Core, unhandled
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.cores.events import FROZEN
from hetsync.protocols.prague.group_generator import Group

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = [
    "Decision", "GroupAssigned", "MergeModels", "PReduceFinished", "PragueWorkerCore",
    "PragueDecisionHandler", "ReportFinished", "RequestGroup", "RunPReduce", "StartStep",
    "StepFinished", "StopTraining", "WorkerState", "dispatch",
]


@dataclass(**FROZEN)
class StepFinished:
    """Local step `iteration` is done; `last`: the worker stops after averaging it."""

    iteration: int
    last: bool = False


@dataclass(**FROZEN)
class GroupAssigned:
    """The GG put this worker in `group`; `answers_request`: it answers this worker's request
    (possibly naming a group already assigned, which then needs no second P-Reduce)."""

    group: Group
    answers_request: bool = False


@dataclass(**FROZEN)
class PReduceFinished:
    """The driver completed the P-Reduce of group `group_id`."""

    group_id: int


@dataclass(**FROZEN)
class RequestGroup:
    """Send `GroupRequested(rank, iteration, last)` to the GG, after `GroupFinished` of group
    `finished` in the same message when one was held back (`report_with_request`)."""

    rank: int
    iteration: int
    last: bool
    finished: int | None = None


@dataclass(**FROZEN)
class ReportFinished:
    """Send `GroupFinished(group_id, rank)` to the GG."""

    group_id: int


@dataclass(**FROZEN)
class RunPReduce:
    """Average the model with `group`'s members (a group of one is a no-op)."""

    group: Group


@dataclass(**FROZEN)
class MergeModels:
    """Overlap only: x <- c + (x - s), then c = s = x (see the module doc). No P-Reduce runs
    until the next decision; the training loop is waiting."""


@dataclass(**FROZEN)
class StartStep:
    """Run local step `iteration`."""

    iteration: int


@dataclass(**FROZEN)
class StopTraining:
    """Every group of this worker is done; it may leave the run."""


Decision = RequestGroup | RunPReduce | ReportFinished | MergeModels | StartStep | StopTraining

R = TypeVar("R", covariant=True)


class PragueDecisionHandler(Protocol[R]):
    """What executes a Prague worker's decisions: the driver and the simulated worker each
    implement every method, so a decision added here fails type-checking (and
    tests/protocols/test_decision_handlers.py) in both until both carry it out."""

    def on_request_group(self, decision: RequestGroup, /) -> R: ...
    def on_run_preduce(self, decision: RunPReduce, /) -> R: ...
    def on_report_finished(self, decision: ReportFinished, /) -> R: ...
    def on_merge_models(self, decision: MergeModels, /) -> R: ...
    def on_start_step(self, decision: StartStep, /) -> R: ...
    def on_stop_training(self, decision: StopTraining, /) -> R: ...


def dispatch(decision: Decision, handler: PragueDecisionHandler[R]) -> R:
    """Carry out `decision` with `handler`'s method for its type."""
    match decision:
        case RequestGroup():
            return handler.on_request_group(decision)
        case RunPReduce():
            return handler.on_run_preduce(decision)
        case ReportFinished():
            return handler.on_report_finished(decision)
        case MergeModels():
            return handler.on_merge_models(decision)
        case StartStep():
            return handler.on_start_step(decision)
        case StopTraining():
            return handler.on_stop_training(decision)
        case _:
            unhandled(decision)


class WorkerState(Enum):
    COMPUTING = "computing"  # a local step runs; groups that arrive queue up (overlap: run)
    SYNCING = "syncing"  # step done; waiting for the GG's answer (overlap: for the previous
    # answer's group, or for the last one's and the queue)
    REDUCING = "reducing"  # a P-Reduce runs between steps (overlap: never; see `running`)
    DONE = "done"  # the last step is averaged and the queue empty: StopTraining was returned
    ERROR = "error"  # a misuse or a broken invariant; every call raises


class PragueWorkerCore(Core[object, Decision]):
    """The decisions of one Prague worker (see the module doc)."""

    @classmethod
    def of_run(cls, options: RunOptions, rank: int, world: int) -> PragueWorkerCore:
        """Rank `rank`'s core in a run with the Group Generator (`--overlap`: P-Reduces beside
        the compute; a static schedule has none; the `ready` policy: finished groups reported
        with the next request): the one recipe the driver and the simulation share."""
        overlap = options.overlap and options.schedule != "static"
        return cls(rank, world, overlap=overlap, report_with_request=options.gg_policy == "ready",
                   group_lag=options.group_lag if overlap else 0)

    def __init__(self, rank: int, world: int, first_iteration: int = 1,
                 overlap: bool = False, report_with_request: bool = False,
                 group_lag: int = 0) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"Arg `rank` must be in 0..{world - 1} (got {rank})")
        if group_lag < 0 or (group_lag and not overlap):
            raise ValueError(f"Arg `group_lag` must be >= 0, and 0 without overlap (got "
                             f"{group_lag}, overlap {overlap})")
        self.rank = rank
        self.state = WorkerState.COMPUTING
        self._iteration = first_iteration
        self._queue: deque[Group] = deque()
        self._running: Group | None = None
        self._awaiting_answer = False
        self._last = False
        self._newest_id = -1
        self._started_since_request: set[int] = set()
        self.overlap = overlap
        self._answer: int | None = None  # overlap: the id of the answer's group, until done
        self._requested_last = False
        self._handed_over = False  # overlap: no P-Reduce before the first merge (no copy yet)
        self.report_with_request = report_with_request
        self._held: int | None = None  # a finished group not reported yet (see the module doc)
        self.group_lag = group_lag
        self._lagging = 0  # overlap: steps started in a row past an unfinished answer's group

    @property
    def iteration(self) -> int:
        """The step running (COMPUTING) or last finished (otherwise)."""
        return self._iteration

    @property
    def queued(self) -> tuple[Group, ...]:
        """Groups assigned and not started, in the order they will run."""
        return tuple(self._queue)

    @property
    def running(self) -> Group | None:
        return self._running

    @property
    def awaiting_answer(self) -> bool:
        """The GG has not answered this step's request yet."""
        return self._awaiting_answer

    @property
    def who(self) -> str:
        return f"prague rank {self.rank}"

    def _handle(self, event: object) -> list[Decision]:
        if isinstance(event, StepFinished):
            return self._on_step_finished(event)
        if isinstance(event, GroupAssigned):
            return self._on_group_assigned(event)
        if isinstance(event, PReduceFinished):
            return self._on_preduce_finished(event)
        raise LocalProtocolError(f"rank {self.rank}: unknown event {event!r}")

    def _on_step_finished(self, event: StepFinished) -> list[Decision]:
        if self.state is not WorkerState.COMPUTING or event.iteration != self._iteration:
            raise self._local(event, f"expected StepFinished(iteration={self._iteration}) "
                              f"while COMPUTING")
        self._last = event.last
        self.state = WorkerState.SYNCING
        if self.overlap:
            return self._next_overlapped()
        self._awaiting_answer = True
        self._started_since_request.clear()
        request = RequestGroup(rank=self.rank, iteration=event.iteration, last=event.last,
                               finished=self._take_held())
        return [request, *self._next()]

    def _on_group_assigned(self, event: GroupAssigned) -> list[Decision]:
        group = event.group
        if self.state is WorkerState.DONE:
            raise self._remote(event, "this rank already left")
        if self.rank not in group:
            raise self._remote(event, "the group does not contain this rank")
        known = group.id in self._started_since_request or group in self._queue
        if event.answers_request and not self._awaiting_answer:
            raise self._remote(event, "it answers no request of this rank")
        if not known and group.id <= self._newest_id:
            raise self._remote(event, f"group {group.id} arrives after group {self._newest_id}: "
                               f"out of the global order, or assigned twice")
        if known and not event.answers_request:
            raise self._remote(event, f"group {group.id} is assigned twice")
        if not known:
            self._newest_id = group.id
            self._queue.append(group)
        if event.answers_request:
            self._awaiting_answer = False
            pending = group in self._queue or group == self._running
            self._answer = group.id if pending else None
        if self.overlap:
            return self._next_overlapped()
        return self._next() if self.state is WorkerState.SYNCING else []

    def _on_preduce_finished(self, event: PReduceFinished) -> list[Decision]:
        if self._running is None or event.group_id != self._running.id:
            running = f"group {self._running.id}" if self._running else "none"
            raise self._local(event, f"the P-Reduce running is {running}")
        self._running = None
        reports = self._report(event.group_id)
        if self.overlap:
            if event.group_id == self._answer:
                self._answer = None
            return reports + self._next_overlapped()
        self.state = WorkerState.SYNCING
        return reports + self._next()

    def _report(self, group_id: int) -> list[Decision]:
        """Report group `group_id` finished now, or hold it for the next request; a group held
        already goes now, and none is held once the last request is sent."""
        if not self.report_with_request or self._last:
            return [ReportFinished(group_id=held) for held in (self._take_held(), group_id)
                    if held is not None]
        earlier, self._held = self._held, group_id
        return [] if earlier is None else [ReportFinished(group_id=earlier)]

    def _take_held(self) -> int | None:
        held, self._held = self._held, None
        return held

    def _next(self) -> list[Decision]:
        """In SYNCING: run the next queued group, or step, or leave, or wait for the answer."""
        if self._queue:
            self._running = self._queue.popleft()
            self._started_since_request.add(self._running.id)
            self.state = WorkerState.REDUCING
            return [RunPReduce(group=self._running)]
        if self._awaiting_answer:
            return []
        if self._last:
            self.state = WorkerState.DONE
            return [StopTraining()]
        self._iteration += 1
        self.state = WorkerState.COMPUTING
        return [StartStep(iteration=self._iteration)]

    def _next_overlapped(self) -> list[Decision]:
        """With overlap: merge and request (then step, or leave at the end) once the previous
        answer's group is done and no P-Reduce runs, or step on without them while the group
        lag allows; then start the next queued group."""
        decisions: list[Decision] = []
        settled = (self._running is None and not self._awaiting_answer
                   and self._answer is None)
        if (self.state is WorkerState.SYNCING and not settled and not self._last
                and self._lagging < self.group_lag):
            self._lagging += 1
            self._iteration += 1
            self.state = WorkerState.COMPUTING
            decisions.append(StartStep(iteration=self._iteration))
        elif self.state is WorkerState.SYNCING and settled:
            self._lagging = 0
            if not self._requested_last:
                decisions.append(MergeModels())
                self._handed_over = True
                decisions.append(RequestGroup(rank=self.rank, iteration=self._iteration,
                                              last=self._last, finished=self._take_held()))
                self._awaiting_answer = True
                self._started_since_request.clear()
                self._requested_last = self._last
                if not self._last:
                    self._iteration += 1
                    self.state = WorkerState.COMPUTING
                    decisions.append(StartStep(iteration=self._iteration))
            elif not self._queue:
                self.state = WorkerState.DONE
                return [MergeModels(), StopTraining()]
        if self._running is None and self._queue and self._handed_over:
            self._running = self._queue.popleft()
            self._started_since_request.add(self._running.id)
            decisions.append(RunPReduce(group=self._running))
        return decisions

    def _local(self, event: object, problem: str) -> LocalProtocolError:
        return LocalProtocolError(f"rank {self.rank} in state {self.state.name}: cannot take "
                                  f"{event!r}: {problem}")

    def _remote(self, event: object, problem: str) -> RemoteProtocolError:
        return RemoteProtocolError(f"rank {self.rank} in state {self.state.name}: GG sent "
                                   f"{event!r}: {problem}")
