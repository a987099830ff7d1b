"""Hop's synchronisation decisions for one worker, with no I/O (Luo et al., ASPLOS'19).

Theory of operation. Worker i runs logical iterations k = 1, 2, ... Each iteration it takes one
*token* from each out-neighbour j (the token queue of edge i->j starts with `max_gap` tokens),
sends its model tagged k to its out-neighbours, computes its gradient, then collects tagged
models from its in-neighbours into its *update queue*, averages and returns one token to each
in-neighbour. So on every edge i->j, Iter(i) - Iter(j) <= max_gap at all times, and a sender
never has more than max_gap + 1 updates outstanding at a receiver: queues stay bounded
whatever the collection rule, which is what makes the rules below safe.

The tokens i holds for j are max_gap + Iter(j) - Iter(i), and j can lead i only as far as the
path back lets it: by max_gap per edge, so i holds at most (1 + dist(j->i)) * max_gap. Where j
also sends to i that is 2 * max_gap, and this core checks it. Over a one-way edge the path back
runs through other workers (with backup or skipping, j need not wait for i's updates), and a
worker stops waiting for the tokens of a neighbour that stopped, so no bound is local: none is
checked.

Which updates iteration k uses, per in-neighbour j (`staleness` s):
- the freshest update with tag in [k - s, k];
- if j has already sent a later tag but none in the window, j skipped iteration k: its
  earliest later update stands in for it (a receiver waiting on tag t accepts any tag >= t);
- an update older than k - s is stale: it is dropped when it arrives or falls out of the window.
The iteration completes once |in(i)| - `backup` in-neighbours are resolved (all of them with
backup 0); it averages what it has, with the topology's weights renormalised over the models
used. A neighbour that left the run is waited for only up to the last update it sent (one
that was lost, not at all: `NeighbourLost`). Its end
marker comes on each of its channels, and the one on its token channel can overtake updates
still in flight on the other; so where it also takes this worker's tokens, those (all in by
its end marker) show the iterations it completed, hence its last tag, and that update is
still awaited.

With `average_once` (ours; the paper's reading is unclear), an update is averaged in once:
an iteration whose update from j is the one it already averaged in (staleness lets it reuse
it) goes on without j, with the weights renormalised as for a backup worker. Reused, a stale
model is averaged in every iteration until a newer one comes, which drags a fast worker back
toward a slow neighbour's old model (half of it each iteration on a ring of 2). Every worker
starts from the same model, which counts as each in-neighbour's update tagged 0, averaged in
already: so iterations 1 to s wait for nobody (a slow neighbour's first step, with its
warm-up, is its slowest), and iteration s + 1 needs j's tag 1 or later.

Iteration skipping (`skip`): before starting its next iteration k, a worker jumps to the
iteration k' its in-neighbours' newest updates reach, if k' >= k + `skip_threshold`, capped by
the tokens it holds. It merges their newest models (except one it has averaged in already:
that would only pull it closer to the same model, at the cost of a pass over it), returns the
k' - k skipped iterations' tokens at once and sends its merged model tagged k'. Its
out-neighbours accept the missing tags by the rule above. Two refinements keep one slow
worker from holding back the rest:
- an update tagged t from j reaches t + 1 where j also sends tokens to this worker and they
  show that j has completed t: j then waits for this worker's tokens, so its x_{t+1} cannot
  come yet, and stopping at t would return only max_gap - 1 tokens per slow iteration;
- a worker *held back* by an out-neighbour (it had to wait for its tokens, and that neighbour
  has not got ahead of it since: it holds at most max_gap of its tokens) does not skip. It lags
  its other neighbours because of the tokens, not its speed, so skipping would spend the few
  tokens it gets without computing, and its own in-neighbours would then skip in turn.

Deferred updates (`send_ahead` a > 0, an option of this implementation; the paper sends every
update). A receiver several iterations behind uses at most one of the updates that arrive
while it computes (the freshest in its window, or the newest when it skips) and drops the
rest, yet it takes every one in: on a slow worker that costs real CPU (a 45 MB model a step),
and its sender waits for each transfer. So a sender defers its update to j while the last one
it sent j is a or more iterations beyond those j's tokens show it completed (with a = 1: until
j completed that update's iteration, so a slow receiver gets one update a step). The deferred
update goes as soon as j's tokens show it caught up, and when the worker stops (before its
end marker: a neighbour takes the last tag it sent from its tokens). It is the message first
sent with its tag, or where none was, the model as it is then: the model the tag names while
the iteration runs, a newer one once it ended (the worker waits for tokens). A receiver that
skips reads how far j got from j's tokens: its updates in between were withheld, not lost. A
receiver never waits long on a deferred update: deferral needs an update beyond its iteration
already sent, and its next tokens release the next.

`mode="notify-ack"` is the design Hop improves on: one update in flight per edge, released by
the receiver's acknowledgement once it has consumed it. Here that is a token queue of size 1
returned on consumption, with no backup, staleness or skipping (which it cannot express).

Driving a core: feed it events with `handle()`; execute the decisions it returns in order. A
trailing `Wait` means the pending request (start or finish an iteration) is blocked: feed the
next incoming event. The core names tensors only as (source rank, tag); the driver owns them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, TypeVar

from hetsync.cores.core import Core, unhandled
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.cores.events import FROZEN, ComputeFinished
from hetsync.topology import Topology

__all__ = [
    "Aggregate",
    "ComputeFinished",
    "Decision",
    "Drop",
    "Event",
    "HopDecisionHandler",
    "HopConfig",
    "HopCore",
    "NeighbourLeft",
    "NeighbourLost",
    "ReadyToStart",
    "ReturnTokens",
    "SendUpdate",
    "SkipTo",
    "StartIteration",
    "State",
    "Stopping",
    "TokensReceived",
    "UpdateReceived",
    "Wait",
    "dispatch",
]

MODES = ("queues", "notify-ack")


@dataclass(**FROZEN)
class HopConfig:
    """Hop's options (see the module doc); the defaults are the paper's. A run's options left
    unset are resolved from its graph (`hetsync.protocols.hop.options.Options.for_graph`)."""

    max_gap: int = 8
    backup: int = 0
    staleness: int = 0
    skip: bool = False
    skip_threshold: int = 1
    send_ahead: int = 0
    average_once: bool = False
    mode: str = "queues"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"Arg `mode` must be one of {MODES} (got {self.mode!r})")
        if (self.max_gap < 1 or self.backup < 0 or self.staleness < 0 or self.skip_threshold < 1
                or self.send_ahead < 0):
            raise ValueError(f"Args must be max_gap >= 1, backup >= 0, staleness >= 0, "
                             f"skip_threshold >= 1, send_ahead >= 0 (got {self})")
        if self.max_gap <= self.staleness:
            raise ValueError(f"Arg `max_gap` must be > staleness {self.staleness} so that an "
                             f"update fresh enough can always be sent (got {self.max_gap})")
        if self.mode == "notify-ack" and (self.backup or self.staleness or self.skip
                                          or self.send_ahead):
            raise ValueError("notify-ack cannot express backup workers, staleness, skipping "
                             "or deferred updates")

    @property
    def tokens(self) -> int:
        """Tokens each edge starts with: the largest gap a sender may run ahead."""
        return 1 if self.mode == "notify-ack" else self.max_gap


# --- events in ---------------------------------------------------------------------------------
# (ComputeFinished: hetsync.cores.events, shared with other cores)
@dataclass(**FROZEN)
class ReadyToStart:
    """The training loop wants to start its next iteration."""


@dataclass(**FROZEN)
class UpdateReceived:
    src: int
    tag: int


@dataclass(**FROZEN)
class TokensReceived:
    src: int
    count: int = 1


@dataclass(**FROZEN)
class Stopping:
    """The worker stops (after its last iteration, or where its loop ended): its deferred
    update goes now."""


@dataclass(**FROZEN)
class NeighbourLeft:
    """`rank` stopped: it sends no more updates and takes no more tokens."""

    rank: int


@dataclass(**FROZEN)
class NeighbourLost:
    """`rank` was lost (`--on-failure continue`): unlike a neighbour that left, it may not
    have sent the update its tokens promise, so nothing more is awaited from it."""

    rank: int


Event = (ReadyToStart | ComputeFinished | UpdateReceived | TokensReceived | NeighbourLeft
         | NeighbourLost | Stopping)


# --- decisions out -----------------------------------------------------------------------------
@dataclass(**FROZEN)
class SkipTo:
    """Jump from `skipped_from` to `iteration`, merging the newest models: x <- the weighted
    average of x and the updates `inputs` ({src: tag})."""

    skipped_from: int
    iteration: int
    inputs: Mapping[int, int]
    self_weight: float
    weights: Mapping[int, float]

    @property
    def skipped(self) -> int:
        """Iterations skipped (a row's `skipped`, in real and simulated runs alike)."""
        return self.iteration - self.skipped_from


@dataclass(**FROZEN)
class StartIteration:
    iteration: int


@dataclass(**FROZEN)
class SendUpdate:
    """Send the current model tagged `tag` to ranks `to`; where `tag` was sent already, send
    the same message (a deferred update: module doc)."""

    tag: int
    to: tuple[int, ...]


@dataclass(**FROZEN)
class Aggregate:
    """x <- self_weight * x + sum_j weights[j] * update(j, inputs[j]); ends `iteration`."""

    iteration: int
    inputs: Mapping[int, int]
    self_weight: float
    weights: Mapping[int, float]

    @property
    def staleness(self) -> int:
        """The age of the oldest update used (a row's `staleness`)."""
        return max((self.iteration - tag for tag in self.inputs.values()), default=0)


@dataclass(**FROZEN)
class ReturnTokens:
    to: tuple[int, ...]
    count: int


@dataclass(**FROZEN)
class Drop:
    """The buffered updates (src, tag) for `tags` will never be used: free them."""

    src: int
    tags: tuple[int, ...]


@dataclass(**FROZEN)
class Wait:
    """The pending request is blocked on these: updates {src: lowest useful tag}, tokens."""

    iteration: int
    updates: Mapping[int, int] = field(default_factory=dict)
    tokens: tuple[int, ...] = ()


Decision = SkipTo | StartIteration | SendUpdate | Aggregate | ReturnTokens | Drop | Wait

R = TypeVar("R", covariant=True)


class HopDecisionHandler(Protocol[R]):
    """What executes Hop's decisions: the driver and the simulated worker each implement
    every method, so a decision added here fails type-checking (and
    tests/protocols/test_decision_handlers.py) in both until both carry it out."""

    def on_skip_to(self, decision: SkipTo, /) -> R: ...
    def on_start_iteration(self, decision: StartIteration, /) -> R: ...
    def on_send_update(self, decision: SendUpdate, /) -> R: ...
    def on_aggregate(self, decision: Aggregate, /) -> R: ...
    def on_return_tokens(self, decision: ReturnTokens, /) -> R: ...
    def on_drop(self, decision: Drop, /) -> R: ...
    def on_wait(self, decision: Wait, /) -> R: ...


def dispatch(decision: Decision, handler: HopDecisionHandler[R]) -> R:
    """Carry out `decision` with `handler`'s method for its type."""
    match decision:
        case SkipTo():
            return handler.on_skip_to(decision)
        case StartIteration():
            return handler.on_start_iteration(decision)
        case SendUpdate():
            return handler.on_send_update(decision)
        case Aggregate():
            return handler.on_aggregate(decision)
        case ReturnTokens():
            return handler.on_return_tokens(decision)
        case Drop():
            return handler.on_drop(decision)
        case Wait():
            return handler.on_wait(decision)
        case _:
            unhandled(decision)


class State(Enum):
    IDLE = "idle"  # between iterations; `iteration` is the next one
    STARTING = "starting"  # wants to start `iteration`; short of tokens
    COMPUTING = "computing"  # `iteration` started; its update sent
    COLLECTING = "collecting"  # `iteration` computed; waiting for in-neighbours' updates
    ERROR = "error"  # a misuse or a broken invariant; every call raises


class HopCore(Core[Event, Decision]):
    """One worker's Hop state machine (see the module doc)."""

    @classmethod
    def of_run(cls, topology: Topology, rank: int, config: HopConfig) -> HopCore:
        """Rank `rank`'s core in a run: the one recipe the driver and the simulation share."""
        self_weight, weights = topology.recv_weights(rank)
        return cls(rank, topology.in_peers(rank), topology.out_peers(rank), self_weight, weights,
                   config)

    def __init__(
        self,
        rank: int,
        in_peers: Sequence[int],
        out_peers: Sequence[int],
        self_weight: float,
        weights: Mapping[int, float],
        config: HopConfig | None = None,
    ) -> None:
        self.rank = rank
        self.config = config or HopConfig()
        self.in_peers = tuple(in_peers)
        self.out_peers = tuple(out_peers)
        if self.in_peers and not self.config.backup < len(self.in_peers):
            raise ValueError(f"Arg `backup` must be < in-degree {len(self.in_peers)} of rank "
                             f"{rank} (got {self.config.backup})")
        if set(weights) != set(self.in_peers):
            raise ValueError(f"Arg `weights` must name the in-neighbours {self.in_peers} of "
                             f"rank {rank} (got {sorted(weights)})")
        self.self_weight = self_weight
        self.weights = dict(weights)
        self.iteration = 1
        self.completed = 0
        self.state = State.IDLE
        self.tokens = {j: self.config.tokens for j in self.out_peers}
        self.held: dict[int, list[int]] = {j: [] for j in self.in_peers}
        self.newest = {j: 0 for j in self.in_peers}
        self.left: set[int] = set()
        self.last_tag: dict[int, int] = {}  # a left in-neighbour's last update, as its tokens show
        self.held_back_by: set[int] = set()
        # The tag of j's last update averaged in: every worker starts from the same model.
        self.averaged = dict.fromkeys(self.in_peers, 0)
        self.last_sent = {j: 0 for j in self.out_peers}  # the tag each was sent last
        self.update_tag = 0  # this worker's newest update, sent or deferred
        self.deferred: set[int] = set()  # the out-neighbours it is deferred for

    # --- the one mutating entry point -----------------------------------------------------
    @property
    def who(self) -> str:
        return f"hop rank {self.rank}"

    def _handle(self, event: Event) -> list[Decision]:
        if isinstance(event, ReadyToStart):
            self._expect(State.IDLE, event)
            self.state = State.STARTING
        elif isinstance(event, ComputeFinished):
            self._expect(State.COMPUTING, event)
            if event.iteration != self.iteration:
                raise LocalProtocolError(f"rank {self.rank}: {event} during iteration "
                                         f"{self.iteration}")
            self.state = State.COLLECTING
        elif isinstance(event, UpdateReceived):
            self._receive_update(event)
        elif isinstance(event, TokensReceived):
            self._receive_tokens(event)
        elif isinstance(event, (NeighbourLeft, NeighbourLost)):
            if event.rank not in self.in_peers and event.rank not in self.out_peers:
                raise RemoteProtocolError(f"rank {self.rank}: {event} from a non-neighbour")
            if event.rank not in self.left:
                self._leaving(event.rank)
            if isinstance(event, NeighbourLost):
                self.last_tag.pop(event.rank, None)
        elif isinstance(event, Stopping):  # in any state: a loop may end mid-iteration
            return self._release(every=True)
        else:
            raise LocalProtocolError(f"rank {self.rank}: unknown event {event!r}")
        if self.state is State.STARTING:
            decisions = self._try_start()
            if self.state is State.STARTING:  # blocked on tokens: deferred updates may go
                return [*self._release(), *decisions]
            return decisions
        if self.state is State.COLLECTING:
            return [*self._release(), *self._try_finish()]
        if self.state is State.COMPUTING:
            return [*self._release(), *self._prune()]
        return self._prune()  # IDLE: the next start sends a fresher update anyway

    def _expect(self, state: State, event: Event) -> None:
        if self.state is not state:
            raise LocalProtocolError(f"rank {self.rank}: {event} in state {self.state.name} "
                                     f"(iteration {self.iteration})")

    # --- incoming messages ----------------------------------------------------------------
    def _leaving(self, j: int) -> None:
        """Mark j left. Its first end marker may come on the token channel, ahead of updates
        in flight; its tokens are then all in and give the iterations it completed: held =
        max_gap + completed by j - started here. The tag it last sent is the one it completed
        last. An end marker on the update channel comes after every update, and the tokens
        then undercount, which is harmless."""
        if j in self.held and j in self.tokens:
            self.last_tag[j] = self._completed_by(j)
        self.left.add(j)
        self.deferred.discard(j)

    def _may_send(self, j: int) -> bool:
        """Whether in-neighbour j may still send an update (module doc)."""
        return j not in self.left or self.newest[j] < self.last_tag.get(j, 0)

    def _receive_update(self, event: UpdateReceived) -> None:
        src, tag = event.src, event.tag
        if src not in self.held:
            raise RemoteProtocolError(f"rank {self.rank}: update from {src}, not an in-neighbour")
        if tag <= self.newest[src]:
            raise RemoteProtocolError(f"rank {self.rank}: update tag {tag} from {src} after tag "
                                      f"{self.newest[src]}; tags must increase")
        if tag > self.completed + self.config.tokens:
            raise RemoteProtocolError(
                f"rank {self.rank}: update tag {tag} from {src} breaks the gap bound: this "
                f"worker completed {self.completed}, max gap {self.config.tokens}")
        self.newest[src] = tag
        self.held[src].append(tag)

    def _receive_tokens(self, event: TokensReceived) -> None:
        if event.src not in self.tokens:
            raise RemoteProtocolError(f"rank {self.rank}: tokens from {event.src}, "
                                      "not an out-neighbour")
        self.tokens[event.src] += event.count
        if event.src in self.held and self.tokens[event.src] > 2 * self.config.tokens:
            raise RemoteProtocolError(f"rank {self.rank}: {self.tokens[event.src]} tokens "
                                      f"from {event.src}, which also sends to this worker: "
                                      "more than twice the max gap")

    # --- starting an iteration ------------------------------------------------------------
    def _live_out(self) -> tuple[int, ...]:
        return tuple(j for j in self.out_peers if j not in self.left)

    def _try_start(self) -> list[Decision]:
        live_out = self._live_out()
        short = tuple(j for j in live_out if self.tokens[j] < 1)
        self.held_back_by.update(short)
        self.held_back_by.difference_update(
            j for j in live_out if self.tokens[j] > self.config.tokens)  # j got ahead
        if short:
            return [*self._prune(), Wait(iteration=self.iteration, tokens=short)]
        decisions: list[Decision] = []
        skipped = self._skip_distance(live_out)
        if skipped:
            decisions += self._skip(skipped)
        for j in live_out:
            self.tokens[j] -= 1 + skipped
        self.state = State.COMPUTING
        self.deferred = {j for j in live_out if not self._admits(j)}
        self.update_tag = self.iteration
        decisions += [*self._prune(), StartIteration(iteration=self.iteration)]
        return decisions + self._send(tuple(j for j in live_out if j not in self.deferred))

    def _admits(self, j: int) -> bool:
        """Whether out-neighbour j may be sent an update now: its tokens show it less than
        `send_ahead` iterations short of the last one sent to it (module doc)."""
        return (not self.config.send_ahead
                or self.last_sent[j] - self._completed_by(j) < self.config.send_ahead)

    def _completed_by(self, j: int) -> int:
        """The iterations out-neighbour j completed, as its tokens show (less those in
        flight): held = max_gap + completed by j - started here."""
        running = self.state in (State.COMPUTING, State.COLLECTING)
        started = self.iteration if running else self.iteration - 1
        return self.tokens[j] + started - self.config.tokens

    def _send(self, to: tuple[int, ...]) -> list[Decision]:
        if not to:
            return []
        for j in to:
            self.last_sent[j] = self.update_tag
        return [SendUpdate(tag=self.update_tag, to=to)]

    def _release(self, *, every: bool = False) -> list[Decision]:
        """Send the deferred update to the out-neighbours that caught up (`every`: to all)."""
        due = tuple(j for j in self._live_out() if j in self.deferred
                    and (every or self._admits(j)))
        self.deferred.difference_update(due)
        return self._send(due)

    def _skip_distance(self, live_out: tuple[int, ...]) -> int:
        """Iterations to skip now (0: none): up to where the in-neighbours' newest updates
        reach, as far as the tokens held allow, if at least the threshold (module doc)."""
        if not self.config.skip or not self.in_peers or self.held_back_by.intersection(live_out):
            return 0
        budget = min((self.tokens[j] for j in live_out), default=math.inf)
        reach = max(self._reach(j, live_out) for j in self.in_peers)
        distance = int(min(reach, self.iteration - 1 + budget) - self.iteration)
        return distance if distance >= self.config.skip_threshold else 0

    def _reach(self, j: int, live_out: tuple[int, ...]) -> int:
        """The iteration in-neighbour j's updates reach (module doc): its newest tag t, or
        t + 1 where j also takes this worker's tokens and they show it completed t. With
        deferred updates, as far as those tokens show j got: its updates in between were
        withheld, not lost on the way."""
        if j not in live_out:
            return self.newest[j]
        completed = self._completed_by(j)
        if self.config.send_ahead:
            return max(self.newest[j], completed + 1)
        return self.newest[j] + (completed >= self.newest[j])

    def _skip(self, skipped: int) -> list[Decision]:
        inputs = {j: self.held[j][-1] for j in self.in_peers
                  if self.held[j] and self.held[j][-1] != self.averaged[j]}
        self.averaged.update(inputs)
        self_weight, weights = self._renormalised(inputs)
        start = self.iteration
        self.iteration += skipped
        self.completed += skipped
        live_in = tuple(j for j in self.in_peers if j not in self.left)
        return [SkipTo(skipped_from=start, iteration=self.iteration, inputs=inputs,
                       self_weight=self_weight, weights=weights),
                ReturnTokens(to=live_in, count=skipped)]

    # --- finishing an iteration -----------------------------------------------------------
    def _choice(self, j: int) -> int | None:
        """The tag of j's update iteration k uses, or None if it has none yet (module doc)."""
        k, tags = self.iteration, self.held[j]
        in_window = [t for t in tags if k - self.config.staleness <= t <= k]
        if in_window:
            return in_window[-1]
        later = [t for t in tags if t > k]
        if later:
            return later[0]
        if self.config.average_once and k <= self.config.staleness:
            return 0  # the common initial model, averaged in from the start (module doc)
        return None

    def _try_finish(self) -> list[Decision]:
        k = self.iteration
        inputs = {j: tag for j in self.in_peers if (tag := self._choice(j)) is not None}
        can_come = [j for j in self.in_peers if j in inputs or self._may_send(j)]
        need = min(len(self.in_peers) - self.config.backup, len(can_come))
        if len(inputs) < need:
            low = k - self.config.staleness
            missing = {j: low for j in self.in_peers if j not in inputs and self._may_send(j)}
            return [*self._prune(), Wait(iteration=k, updates=missing)]
        if self.config.average_once:
            inputs = {j: tag for j, tag in inputs.items() if tag not in (0, self.averaged[j])}
        self_weight, weights = self._renormalised(inputs)
        live_in = tuple(j for j in self.in_peers if j not in self.left)
        self.averaged.update(inputs)
        self.completed = k
        self.iteration = k + 1
        self.state = State.IDLE
        return [Aggregate(iteration=k, inputs=inputs, self_weight=self_weight, weights=weights),
                ReturnTokens(to=live_in, count=1), *self._prune()]

    def _renormalised(self, inputs: Mapping[int, int]) -> tuple[float, dict[int, float]]:
        if len(inputs) == len(self.in_peers):
            return self.self_weight, dict(self.weights)  # as given: D-PSGD's exact weights
        total = self.self_weight + sum(self.weights[j] for j in inputs)
        return self.self_weight / total, {j: self.weights[j] / total for j in inputs}

    def _prune(self) -> list[Drop]:
        """Free updates no iteration from now on can use: older than the staleness window,
        or superseded by a fresher one that is not from the future."""
        k, drops = self.iteration, []
        low = k - self.config.staleness
        for j, tags in self.held.items():
            if not tags or (tags[0] >= low and (len(tags) == 1 or tags[1] > k)):
                continue  # none stale, at most one in the window (tags increase): O(1)
            keep = [t for t in tags if t > k]
            current = [t for t in tags if k - self.config.staleness <= t <= k]
            keep = current[-1:] + keep
            if len(keep) < len(tags):
                drops.append(Drop(src=j, tags=tuple(t for t in tags if t not in keep)))
                self.held[j] = keep
        return drops
