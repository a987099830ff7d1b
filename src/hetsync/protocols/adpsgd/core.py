"""One AD-PSGD worker's decisions (Lian et al., ICML 2018): roles, partners, its model lock; no I/O.

Theory of operation. Roles: on a bipartite graph odd ranks are *active* and even ranks
*passive*; in `naive` mode every worker is both. Each iteration an active worker picks a
partner uniformly among its passive neighbours, from the injected `random.Random` (one
`choice` per iteration, as the real driver has always drawn), sends it its model
(`SendRequest`) and computes its gradient meanwhile; once both the gradient and the partner's
reply are in, it loads the average the reply carries (`LoadAverage`), then applies its gradient
(`StepGranted`). A passive worker serves its clients' (active neighbours') requests one at a time in
arrival order (`Serve`: x <- (x + x_client) / 2, reply with it; then `Served`).

Every passive worker has one *model lock*. Serving a request holds it, and so does a passive
worker's own optimizer step, so the two never interleave. An active-only worker never takes a
lock, and a passive server never waits for anyone while it serves, so the wait-for graph only
has edges from active to passive workers: no cycle, no deadlock. In `naive` mode an active
worker must also hold its own lock from sending its request until it has loaded the reply (or
its averaging would not be atomic); while it holds it, it cannot serve. Two workers that pick
each other (or any cycle) then wait forever: `awaiting_reply_from`, `holder` and `queued`
expose exactly that, so a simulator sees the cycle instead of spinning. When the lock frees,
the trainer's own step or deferred request goes first, then the oldest queued request.

Bounded lead (`max_gap`, `--adpsgd-max-gap`; 0, the paper's, is unbounded). A passive worker
never waits, so where serving costs its clients more than its own compute costs it (a large
model, one core a worker: 8 workers with a 45 MB model ran passive ranks 97-103 iterations
and active ones 57-60, waiting for replies), it runs ahead and its clients are starved. With a
bound, its step waits until every live client's latest request comes from an iteration at
most `max_gap` behind its own; meanwhile it serves, so the wait gives its core to its
clients' replies. Only passive workers wait, and only for active ones, which never wait for a
passive worker's trainer (only for its serving, which goes on): still no cycle. A client that
left or was lost no longer counts. Not with `naive`, whose workers are active as well.

Leaving: `Leave` (after the last step, or with an iteration begun and never finished, whose
request is then completed first) -> `SendBye` to every partner. A neighbour lost from the run
(`PeerLost`) is no longer chosen and, as a client, counts as gone; a request to a partner
lost before it replied ends without an average (`ReplyLost`). A request or goodbye that a lost
client sent before it was declared lost, arriving after `PeerLost`, is dropped (no decision):
the core, not its driver, knows under its lock who is lost. A passive worker's serving ends
(`ServerDone`) once every client has said goodbye. Decisions are returned to whoever fed the
event; some are for the other side of the same worker (a `Served` may grant the trainer's
`StepGranted`, a `StepFinished` the next `Serve`). Each event costs O(1), O(clients) with a
bounded lead.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, TypeVar

from hetsync.cores.core import Core, unhandled
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.cores.events import FROZEN, ComputeFinished, IterationStarted
from hetsync.topology import Topology

__all__ = [
    "ADPSGDCore", "ADPSGDDecisionHandler", "ADPSGDState", "ByeReceived", "ComputeFinished",
    "Finish", "Holder", "IterationStarted", "Leave", "LoadAverage", "PeerLost", "ReplyLost",
    "ReplyReceived", "RequestReceived", "SendBye", "SendRequest", "Serve", "Served",
    "ServerDone", "StepFinished", "StepGranted", "dispatch", "roles",
]


def roles(rank: int, neighbours: Sequence[int], naive: bool
          ) -> tuple[bool, bool, tuple[int, ...], tuple[int, ...]]:
    """(active, passive, partners, clients) of `rank`: odd ranks are active and send to their
    even neighbours, even ranks passive and serve their odd ones; naive: all of both."""
    ranks = sorted(set(neighbours))
    return (naive or rank % 2 == 1, naive or rank % 2 == 0,
            tuple(j for j in ranks if naive or j % 2 == 0),
            tuple(j for j in ranks if naive or j % 2 == 1))


# --- events in: the trainer's ------------------------------------------------------------------
# (IterationStarted and ComputeFinished: hetsync.cores.events, shared with other cores)
@dataclass(**FROZEN)
class ReplyReceived:
    """The partner `src` answered this worker's request with the average."""

    src: int


@dataclass(**FROZEN)
class StepFinished:
    """The optimizer step of `iteration` is done; `wants_stop`: this worker's stop conditions."""

    iteration: int
    wants_stop: bool


@dataclass(**FROZEN)
class Leave:
    """The worker leaves the run."""


@dataclass(**FROZEN)
class ReplyLost:
    """The partner `src` was lost before its reply came: no average to load this time."""

    src: int


@dataclass(**FROZEN)
class PeerLost:
    """Neighbour `rank` was lost (`--on-failure continue`): it is no longer chosen as a
    partner, and as a client it counts as gone (a request it queued is still served: the
    model came whole; only the reply will find no one)."""

    rank: int


# --- events in: the server's -------------------------------------------------------------------
@dataclass(**FROZEN)
class RequestReceived:
    """Client `src` asks to average with this worker, from its iteration `iteration`."""

    src: int
    iteration: int = 0


@dataclass(**FROZEN)
class Served:
    """The average with `src` is loaded (its reply may now be sent); the lock is free again."""

    src: int


@dataclass(**FROZEN)
class ByeReceived:
    """Client `src` left: it sends no more requests."""

    src: int


# --- decisions out -----------------------------------------------------------------------------
@dataclass(**FROZEN)
class SendRequest:
    """Send the model to `partner` and wait for its reply (naive: holding the own lock)."""

    partner: int
    iteration: int


@dataclass(**FROZEN)
class LoadAverage:
    """Load the average `partner`'s reply carries."""

    partner: int


@dataclass(**FROZEN)
class StepGranted:
    """Run the optimizer step of `iteration` (a passive worker holds its lock for it)."""

    iteration: int


@dataclass(**FROZEN)
class Finish:
    """`iteration` is done; this worker stops after it if `stop`."""

    iteration: int
    stop: bool


@dataclass(**FROZEN)
class Serve:
    """Average with `client`'s model under the lock, load it, feed `Served`, then reply."""

    client: int


@dataclass(**FROZEN)
class SendBye:
    """Tell `to` (every partner) this worker left."""

    to: tuple[int, ...]


@dataclass(**FROZEN)
class ServerDone:
    """Every client said goodbye: nothing more will be served."""


Event = (IterationStarted | ComputeFinished | ReplyReceived | StepFinished | Leave
         | RequestReceived | Served | ByeReceived | ReplyLost | PeerLost)
Decision = SendRequest | LoadAverage | StepGranted | Finish | Serve | SendBye | ServerDone

R = TypeVar("R", covariant=True)


class ADPSGDDecisionHandler(Protocol[R]):
    """What executes AD-PSGD's decisions: the driver and the simulated worker each
    implement every method, so a decision added here fails type-checking (and
    tests/protocols/test_decision_handlers.py) in both until both carry it out."""

    def on_send_request(self, decision: SendRequest, /) -> R: ...
    def on_load_average(self, decision: LoadAverage, /) -> R: ...
    def on_step_granted(self, decision: StepGranted, /) -> R: ...
    def on_finish(self, decision: Finish, /) -> R: ...
    def on_serve(self, decision: Serve, /) -> R: ...
    def on_send_bye(self, decision: SendBye, /) -> R: ...
    def on_server_done(self, decision: ServerDone, /) -> R: ...


def dispatch(decision: Decision, handler: ADPSGDDecisionHandler[R]) -> R:
    """Carry out `decision` with `handler`'s method for its type."""
    match decision:
        case SendRequest():
            return handler.on_send_request(decision)
        case LoadAverage():
            return handler.on_load_average(decision)
        case StepGranted():
            return handler.on_step_granted(decision)
        case Finish():
            return handler.on_finish(decision)
        case Serve():
            return handler.on_serve(decision)
        case SendBye():
            return handler.on_send_bye(decision)
        case ServerDone():
            return handler.on_server_done(decision)
        case _:
            unhandled(decision)


class ADPSGDState(Enum):
    """The trainer's state (serving goes on in every state but ERROR)."""

    IDLE = "idle"  # between iterations
    COMPUTING = "computing"  # iteration started; its request (if any) sent or deferred
    FINISHING = "finishing"  # gradient computed; waiting for the reply or the lock
    STEPPING = "stepping"  # the optimizer step runs
    STOPPED = "stopped"  # its stop conditions held; only Leave remains
    LEAVING = "leaving"  # left with a request in flight; waiting for its reply
    DONE = "done"  # left
    ERROR = "error"  # a misuse or a broken invariant; every call raises


class Holder(Enum):
    """Who holds this worker's model lock."""

    FREE = "free"
    REQUEST = "request"  # naive: its own request, until the reply is loaded
    SERVE = "serve"  # serving a client
    STEP = "step"  # its own optimizer step


class ADPSGDCore(Core[Event, Decision]):
    """One AD-PSGD worker's state machine (see the module doc)."""

    def __init__(self, rank: int, neighbours: Sequence[int], naive: bool,
                 rng: random.Random, max_gap: int = 0) -> None:
        if naive and max_gap:
            raise ValueError("a bounded lead (max_gap) needs the bipartite mode")
        self.rank, self.naive, self.rng = rank, naive, rng
        self.max_gap = max_gap
        self.active, self.passive, self.partners, self.clients = roles(rank, neighbours, naive)
        self._client_set = frozenset(self.clients)
        self.state = ADPSGDState.IDLE
        self.iteration = 0
        self.holder = Holder.FREE
        self.serving: int | None = None
        self.awaiting_reply_from: int | None = None
        """The partner whose reply this worker waits for (its request was sent)."""
        self.deferred: int | None = None
        """Naive: the partner chosen, the request waiting for the lock."""
        self._reply_in = False
        self._queue: deque[int] = deque()
        self._pending: set[int] = set()  # clients queued or being served
        self._gone: set[int] = set()  # clients that said goodbye or were lost
        self._lost: set[int] = set()  # clients declared lost (PeerLost)
        self.remaining_clients = len(self.clients)
        self.client_iteration = dict.fromkeys(self.clients, 0)
        """Each client's iteration, as its latest request said."""

    @classmethod
    def of_run(cls, topology: Topology, rank: int, seed: int, mode: str,
               max_gap: int = 0) -> ADPSGDCore:
        """Rank `rank`'s core in a run: the one recipe the driver and the simulation share, so
        that simulated workers draw the same partners as real ones (from the run's seed)."""
        neighbours = [*topology.in_peers(rank), *topology.out_peers(rank)]
        return cls(rank, neighbours, naive=mode == "naive",
                   rng=random.Random(f"adpsgd/{seed}/{rank}"), max_gap=max_gap)

    @property
    def model_at_rest(self) -> bool:
        """Whether no served average is being written into the model. Every other write to it
        (the optimizer step, a loaded average) runs on the training thread, so while this
        holds under the driver's lock, that thread may read the model whole (a snapshot, a
        checkpoint): no `Serve` is granted until it lets the lock go."""
        return self.holder is not Holder.SERVE

    @property
    def queued(self) -> tuple[int, ...]:
        """Clients whose requests wait to be served, oldest first."""
        return tuple(self._queue)

    @property
    def who(self) -> str:
        return f"adpsgd rank {self.rank}"

    def _handle(self, event: Event) -> list[Decision]:
        state = self.state
        if isinstance(event, IterationStarted):
            if state is not ADPSGDState.IDLE or event.iteration <= self.iteration:
                raise self._local(event)
            self.iteration, self.state = event.iteration, ADPSGDState.COMPUTING
            if not (self.active and self.partners):
                return []
            partner = self.rng.choice(self.partners)
            if self.naive and self.holder is not Holder.FREE:
                self.deferred = partner
                return []
            return [self._send(partner)]
        if isinstance(event, ComputeFinished):
            if state is not ADPSGDState.COMPUTING or event.iteration != self.iteration:
                raise self._local(event)
            self.state = ADPSGDState.FINISHING
            return self._progress()
        if isinstance(event, ReplyReceived):
            if event.src != self.awaiting_reply_from or self._reply_in:
                raise self._remote(event, f"awaiting a reply from {self.awaiting_reply_from}")
            self._reply_in = True
            return self._progress()
        if isinstance(event, StepFinished):
            if state is not ADPSGDState.STEPPING or event.iteration != self.iteration:
                raise self._local(event)
            self.state = ADPSGDState.STOPPED if event.wants_stop else ADPSGDState.IDLE
            finish: list[Decision] = [Finish(iteration=self.iteration, stop=event.wants_stop)]
            if self.holder is Holder.STEP:
                self.holder = Holder.FREE
                return finish + self._grant()
            return finish
        if isinstance(event, Leave):
            if state not in (ADPSGDState.IDLE, ADPSGDState.COMPUTING, ADPSGDState.STOPPED):
                raise self._local(event)
            self.deferred = None  # a naive request never sent is not sent now
            self.state = ADPSGDState.LEAVING
            return self._progress()
        if isinstance(event, RequestReceived):
            if event.src in self._lost:
                return []  # sent before it was lost: its client no longer counts
            self._check_client(event)
            if event.iteration < self.client_iteration[event.src]:
                raise self._remote(event, f"iteration {event.iteration} after its "
                                   f"{self.client_iteration[event.src]}")
            self.client_iteration[event.src] = event.iteration
            self._pending.add(event.src)
            self._queue.append(event.src)
            return self._grant() if self.holder is Holder.FREE else []
        if isinstance(event, Served):
            if self.holder is not Holder.SERVE or event.src != self.serving:
                raise self._local(event)
            self._pending.discard(event.src)
            self.holder, self.serving = Holder.FREE, None
            return self._grant()
        if isinstance(event, ByeReceived):
            if event.src in self._lost:
                return []  # already counted gone when it was lost
            self._check_client(event)
            return self._gone_client(event.src)
        if isinstance(event, ReplyLost):
            if event.src != self.awaiting_reply_from or self._reply_in:
                raise self._local(event)
            self.awaiting_reply_from = None
            if self.holder is Holder.REQUEST:
                self.holder = Holder.FREE
            return self._progress()
        if isinstance(event, PeerLost):
            self.partners = tuple(p for p in self.partners if p != event.rank)
            if event.rank not in self._client_set or event.rank in self._gone:
                return []
            self._lost.add(event.rank)
            return self._gone_client(event.rank)  # a request it queued is still served
        raise LocalProtocolError(f"adpsgd rank {self.rank}: unknown event {event!r}")

    def _gone_client(self, src: int) -> list[Decision]:
        """`src` no longer counts: the serving may end, and a step held for it may go."""
        self._gone.add(src)
        self.remaining_clients -= 1
        done: list[Decision] = [] if self.remaining_clients else [ServerDone()]
        return done + (self._grant() if self.holder is Holder.FREE else [])

    @property
    def held_for(self) -> tuple[int, ...]:
        """The live clients this worker's step waits for (`max_gap`): more than `max_gap`
        iterations behind it, as their latest requests said."""
        if not self.max_gap:
            return ()
        return tuple(c for c in self.clients if c not in self._gone
                     and self.iteration - self.client_iteration[c] > self.max_gap)

    def _check_client(self, event: RequestReceived | ByeReceived) -> None:
        src = event.src
        if src not in self._client_set or src in self._gone or src in self._pending:
            why = ("not a client" if src not in self._client_set else "it said goodbye"
                   if src in self._gone else "its last request is unanswered")
            raise self._remote(event, why)

    def _send(self, partner: int) -> SendRequest:
        if self.naive:
            self.holder = Holder.REQUEST
        self.awaiting_reply_from = partner
        return SendRequest(partner=partner, iteration=self.iteration)

    def _progress(self) -> list[Decision]:
        """The trainer's next move in FINISHING or LEAVING: load the reply once both it and
        the gradient are in, then step (under the lock if passive) or say goodbye."""
        decisions: list[Decision] = []
        if self.awaiting_reply_from is not None:
            if not self._reply_in or self.state not in (ADPSGDState.FINISHING,
                                                         ADPSGDState.LEAVING):
                return decisions
            decisions.append(LoadAverage(partner=self.awaiting_reply_from))
            self.awaiting_reply_from, self._reply_in = None, False
            if self.holder is Holder.REQUEST:
                self.holder = Holder.FREE
        if self.deferred is not None:  # naive: the lock is busy serving
            return decisions
        if self.state is ADPSGDState.LEAVING:
            self.state = ADPSGDState.DONE
            if self.active and self.partners:
                decisions.append(SendBye(to=self.partners))
            return decisions + (self._grant() if self.holder is Holder.FREE else [])
        if self.state is ADPSGDState.FINISHING:
            if not self.passive:
                self.state = ADPSGDState.STEPPING
                decisions.append(StepGranted(iteration=self.iteration))
            elif self.holder is Holder.FREE:
                decisions += self._grant()
        return decisions

    def _grant(self) -> list[Decision]:
        """The lock is free: the trainer's step or deferred request first, then the oldest
        queued request."""
        if self.state is ADPSGDState.FINISHING and self.awaiting_reply_from is None \
                and self.deferred is None and self.passive and not self.held_for:
            self.holder, self.state = Holder.STEP, ADPSGDState.STEPPING
            return [StepGranted(iteration=self.iteration)]
        if self.deferred is not None:
            partner, self.deferred = self.deferred, None
            return [self._send(partner)]
        if self._queue:
            self.holder = Holder.SERVE
            self.serving = self._queue.popleft()
            return [Serve(client=self.serving)]
        return []

    def _local(self, event: object) -> LocalProtocolError:
        return LocalProtocolError(f"adpsgd rank {self.rank}: cannot take {event!r} in state "
                                  f"{self.state.name} (iteration {self.iteration}, lock "
                                  f"{self.holder.name})")

    def _remote(self, event: object, why: str) -> RemoteProtocolError:
        return RemoteProtocolError(f"adpsgd rank {self.rank} in state {self.state.name}: "
                                   f"{event!r}: {why}")
