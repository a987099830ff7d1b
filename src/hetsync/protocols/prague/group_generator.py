"""Prague's Group Generator (GG): who averages with whom, and in which order; no I/O.

Theory of operation. A worker that finished a local step sends a request; the GG answers with a
`Group` containing it and tells every member (`AssignGroup`). Group ids increase in the order
groups are assigned: the id *is* the group's place in one global order, and every worker runs
its groups' P-Reduces in id order (`PragueWorkerCore`). Two groups that share workers are
therefore met in the same relative order by all of them, so no wait cycle can form: the
unfinished group with the smallest id always heads the queue of each of its members. This needs
FIFO channels between the GG and each worker, both ways: assignments arrive in id order, and a
worker's `GroupFinished` arrives before its next request. A group assigned while one of its
members still has an unfinished group is a *conflict*: the P-Reduces must run one after the
other. `stats` counts them.

Policies (`policy`):
- `random`, the paper's: the requester plus `group_size - 1` workers drawn uniformly from its
  division. Members may be busy (computing, or queued behind other groups), hence conflicts.
- `ready`, as Hetu's PartialReduce: a group forms from workers with an outstanding request
  only, as soon as `group_size` of one division wait (the oldest first), so a slow worker
  delays no one but itself and groups never conflict. Fewer than `group_size` wait for more,
  unless the driver's timer fires (`WaitTimedOut`): then all waiting workers are grouped at
  once, oldest first, in groups of at most `group_size` (a group of one is a local no-op).
  Groups follow arrival timing: perfectly regular timing repeats them, so use divisions
  (reshuffled) or the static schedule there.

Group Buffer (`buffer`, random policy). The paper gives little more than the name; both
readings we found are implemented, and both answer a requester that already has an unfinished
group (others pulled it in during its step) with that group (`reused`): its step will be
averaged there, so a new group would only add a conflict.
- `queue` (recommended): each worker's queue of assigned groups is its buffer (the second
  reading: pre-assigned groups are consumed without asking for new ones), and a new group
  draws its other members from workers whose queues are empty first, topping up with busy
  ones only when too few are idle. Randomness is only slightly reduced: uniform among the
  idle.
- `batch` (the first reading): the GG draws a random partition of every division into groups
  of at most `group_size` and hands each requester its group from it; a requester whose group
  was already handed out gets a freshly drawn partition. Groups of one partition never
  conflict, but a partition ignores who is busy.
In a one-off simulation of these cores (16 workers, group size 3, two of them 4x slower; the
test `test_group_buffer_cuts_conflicts_queue_most` checks only the order), conflicts per group were
0.88 (`off`), 0.46 (`batch`), 0.09 (`queue`) and 0 (policy `ready`), with 3.0, 1.3, 1.05 and
1.0 P-Reduces per step, and the median worker finished 1.0, 0.58, 0.47 and 0.30 times as late
as with `off`. So `queue` is the random policy's choice for heterogeneous clusters.

Group Division (`divisions=K`): the workers are split into K divisions of near-equal size and
groups form within the requester's division, so groups of different divisions never
conflict and a slow worker holds back only its own division. Every `redivide_every` requests
(default: world, about one step of every worker) the divisions are drawn afresh at random, so
over time the union of groups connects all workers and models mix globally. It cuts conflicts
little by itself (0.85 instead of 0.88 with K = 2 in the simulation above) and raises them
with `queue` (0.25: a division has fewer idle workers to choose from); the paper's reading
may differ, and a division by speed did no better in our trials.

Leaving: a worker's `last` request is answered normally; afterwards no group contains it
(required group sizes shrink to the workers still in). A worker lost from the run
(`WorkerLost`) leaves at once, its request unanswered and its groups finished for it; what it
sent before its loss and arrives after is dropped here (no engine filters on the core's behalf).
`handle` is the only entry point; randomness comes only from the injected `rng`, so runs
replay exactly.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace
from enum import Enum

from hetsync.cores.core import Core
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.cores.events import FROZEN
from hetsync.protocols.prague.static_schedule import split_evenly

__all__ = [
    "BUFFERS", "POLICIES", "AssignGroup", "GeneratorState", "Group", "GroupFinished",
    "GroupGeneratorCore", "GroupRequested", "GroupStats", "WaitTimedOut", "WorkerLost",
]

POLICIES = ("random", "ready")
BUFFERS = ("off", "queue", "batch")


@dataclass(**FROZEN)
class Group:
    """Workers that average together; `id` is the group's place in the global order."""

    id: int
    members: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.id < 0 or not self.members or self.members[0] < 0:
            raise ValueError(f"invalid group: id {self.id}, members {self.members}")
        if list(self.members) != sorted(set(self.members)):
            raise ValueError(f"group {self.id}: members must be sorted and distinct "
                             f"(got {self.members})")

    def __contains__(self, rank: object) -> bool:
        return rank in self.members


@dataclass(**FROZEN)
class GroupRequested:
    """`rank` finished local step `iteration` and asks for a group; `last`: its final one."""

    rank: int
    iteration: int
    last: bool = False


@dataclass(**FROZEN)
class GroupFinished:
    """`rank` completed its P-Reduce of group `group_id`."""

    group_id: int
    rank: int


@dataclass(**FROZEN)
class WorkerLost:
    """`rank` was lost from the run (`--on-failure continue`): it is in no later group, and
    the groups it had not finished count as finished by it (their other members leave it
    out of their P-Reduce)."""

    rank: int


@dataclass(**FROZEN)
class WaitTimedOut:
    """The driver's wait timer fired (ready policy): group whoever waits now."""


@dataclass(**FROZEN)
class AssignGroup:
    """Tell `rank` it is a member of `group`; `answers_request`: this answers its request."""

    rank: int
    group: Group
    answers_request: bool

    def __post_init__(self) -> None:
        if self.rank not in self.group:
            raise ValueError(f"rank {self.rank} is not a member of group {self.group}")


@dataclass(slots=True)
class GroupStats:
    """What the GG did so far (a snapshot: `GroupGeneratorCore.stats`)."""

    requests: int = 0
    groups: int = 0
    conflicts: int = 0
    """Groups assigned while at least one member had an unfinished group."""
    conflicting_members: int = 0
    """Members that had an unfinished group, summed over conflicting groups."""
    reused: int = 0
    """Requests answered by a group the requester was already in (Group Buffer)."""
    undersized: int = 0
    """Groups smaller than `group_size` (small division, workers gone, or a timeout)."""


class GeneratorState(Enum):
    RUNNING = "running"  # answering requests
    ERROR = "error"  # a misuse or a broken invariant; every call raises


class GroupGeneratorCore(Core[object, AssignGroup]):
    """The central Group Generator (see the module doc)."""

    def __init__(
        self, world: int, group_size: int, rng: random.Random, *, policy: str = "random",
        buffer: str = "off", divisions: int = 1, redivide_every: int | None = None,
    ) -> None:
        if world < 1 or not 1 <= group_size <= world:
            raise ValueError(f"Args must be world >= 1 and 1 <= group_size <= world "
                             f"(got world {world}, group_size {group_size})")
        if policy not in POLICIES:
            raise ValueError(f"Arg `policy` must be one of {POLICIES} (got {policy!r})")
        if buffer not in BUFFERS or (buffer != "off" and policy != "random"):
            raise ValueError(f"Arg `buffer` must be one of {BUFFERS}, and 'off' unless policy "
                             f"is 'random' (ready groups never conflict) (got {buffer!r} with "
                             f"{policy!r})")
        if not 1 <= divisions <= world // group_size:
            raise ValueError(f"Arg `divisions` must be in 1..{world // group_size} so that a "
                             f"division of {world} workers holds a group of {group_size} "
                             f"(got {divisions})")
        if redivide_every is not None and redivide_every < 1:
            raise ValueError(f"Arg `redivide_every` must be >= 1 (got {redivide_every})")
        self.world, self.group_size, self.policy = world, group_size, policy
        self.buffer, self.redivide_every = buffer, redivide_every or world
        self._rng = rng
        self.state = GeneratorState.RUNNING
        self._stats = GroupStats()
        self._live = set(range(world))
        self._lost: set[int] = set()  # declared lost: what they sent before is dropped
        self._last_iteration: dict[int, int] = {}
        self._waiting: dict[int, GroupRequested] = {}  # insertion order = arrival order
        self._unfinished: list[deque[Group]] = [deque() for _ in range(world)]
        self._left_to_finish: dict[int, set[int]] = {}  # group id -> members yet to finish
        self._batch: dict[int, tuple[int, ...]] = {}  # rank -> its unused group (`batch`)
        self._division_count = divisions
        self._division_of: dict[int, int] = {}
        self._next_id = 0
        self._redivide()

    @property
    def stats(self) -> GroupStats:
        return replace(self._stats)

    @property
    def waiting(self) -> tuple[int, ...]:
        """Ranks whose request is not answered yet, oldest first (ready policy only)."""
        return tuple(self._waiting)

    @property
    def divisions(self) -> tuple[tuple[int, ...], ...]:
        """The current divisions of the workers still in the run."""
        return tuple(self._division_members(d) for d in range(self._division_count))

    @property
    def live(self) -> frozenset[int]:
        """Ranks that have not left (their last request is not answered yet)."""
        return frozenset(self._live)

    def unfinished(self, rank: int) -> tuple[Group, ...]:
        """Groups assigned to `rank` that it has not reported finished, in order."""
        return tuple(self._unfinished[rank])

    @property
    def who(self) -> str:
        return "group generator"

    def _handle(self, event: object) -> list[AssignGroup]:
        if isinstance(event, GroupRequested | GroupFinished | WorkerLost) \
                and event.rank in self._lost:
            return []  # sent before it was lost (or its loss told twice): it no longer counts
        if isinstance(event, GroupRequested):
            return self._on_request(event)
        if isinstance(event, GroupFinished):
            return self._on_finished(event)
        if isinstance(event, WaitTimedOut):
            return self._on_timeout()
        if isinstance(event, WorkerLost):
            return self._on_lost(event)
        raise LocalProtocolError(f"group generator: unknown event {event!r}")

    def _on_request(self, event: GroupRequested) -> list[AssignGroup]:
        rank = event.rank
        problem = self._request_problem(event)
        if problem:
            raise RemoteProtocolError(f"group generator: {event}: {problem}")
        self._last_iteration[rank] = event.iteration
        self._stats.requests += 1
        if self._division_count > 1 and self._stats.requests % self.redivide_every == 0:
            self._redivide()
        if self.policy == "ready":
            self._waiting[rank] = event
            return self._form_ready_groups()
        if self.buffer != "off" and self._unfinished[rank]:
            self._stats.reused += 1
            if event.last:
                self._leave(rank)
            return [AssignGroup(rank=rank, group=self._unfinished[rank][-1], answers_request=True)]
        if self.buffer == "batch":
            members = self._batch_group(rank)
        else:
            members = self._random_group(rank, idle_first=self.buffer == "queue")
        return self._assign(members, {rank: event.last})

    def _request_problem(self, event: GroupRequested) -> str | None:
        rank = event.rank
        if not 0 <= rank < self.world:
            return f"no rank {rank} in a world of {self.world}"
        if rank not in self._live:
            return f"rank {rank} already left (its last request was answered)"
        if rank in self._waiting:
            return f"rank {rank} already waits for a group since {self._waiting[rank]}"
        last = self._last_iteration.get(rank)
        if last is not None and event.iteration <= last:
            return f"iteration {event.iteration} does not follow rank {rank}'s iteration {last}"
        return None

    def _on_finished(self, event: GroupFinished) -> list[AssignGroup]:
        rank, group_id = event.rank, event.group_id
        if group_id not in self._left_to_finish:
            raise RemoteProtocolError(f"group generator: {event}: group {group_id} is not "
                                      f"assigned or already finished by all its members")
        queue = self._unfinished[rank] if 0 <= rank < self.world else deque()
        if group_id not in (g.id for g in queue):
            raise RemoteProtocolError(f"group generator: {event}: rank {rank} is not a member "
                                      f"of group {group_id} or already finished it")
        if queue[0].id != group_id:
            raise RemoteProtocolError(f"group generator: {event}: rank {rank} finished group "
                                      f"{group_id} before its earlier group {queue[0].id}")
        queue.popleft()
        left = self._left_to_finish[group_id]
        left.discard(rank)
        if not left:
            del self._left_to_finish[group_id]
        return []

    def _on_lost(self, event: WorkerLost) -> list[AssignGroup]:
        rank = event.rank
        if not 0 <= rank < self.world:
            raise RemoteProtocolError(f"group generator: {event}: no rank {rank} in a world "
                                      f"of {self.world}")
        self._lost.add(rank)
        self._leave(rank)
        self._waiting.pop(rank, None)
        for group in self._unfinished[rank]:
            left = self._left_to_finish[group.id]
            left.discard(rank)
            if not left:
                del self._left_to_finish[group.id]
        self._unfinished[rank].clear()
        return self._form_ready_groups() if self.policy == "ready" else []

    def _on_timeout(self) -> list[AssignGroup]:
        waiting = list(self._waiting)
        decisions = []
        for chunk in split_evenly(waiting, -(-len(waiting) // self.group_size)):
            decisions += self._assign(chunk, {w: self._waiting.pop(w).last for w in chunk})
        return decisions

    def _form_ready_groups(self) -> list[AssignGroup]:
        decisions = []
        while (members := self._next_ready_group()) is not None:
            decisions += self._assign(members, {w: self._waiting.pop(w).last for w in members})
        return decisions

    def _next_ready_group(self) -> list[int] | None:
        for d in range(self._division_count):
            waiting = [w for w in self._waiting if self._division_of[w] == d]
            needed = min(self.group_size, len(self._division_members(d)))
            if waiting and len(waiting) >= needed:
                return waiting[:needed]
        return None

    def _random_group(self, rank: int, idle_first: bool) -> list[int]:
        others = [w for w in self._division_members(self._division_of[rank]) if w != rank]
        wanted = min(self.group_size - 1, len(others))
        if not idle_first:
            return [rank, *self._rng.sample(others, wanted)]
        idle = [w for w in others if not self._unfinished[w]]
        busy = [w for w in others if self._unfinished[w]]
        chosen = self._rng.sample(idle, min(wanted, len(idle)))
        return [rank, *chosen, *self._rng.sample(busy, wanted - len(chosen))]

    def _batch_group(self, rank: int) -> list[int]:
        if rank not in self._batch:
            self._batch = self._draw_batch()
        members = self._batch[rank]
        for w in members:
            del self._batch[w]
        return [w for w in members if w in self._live]

    def _draw_batch(self) -> dict[int, tuple[int, ...]]:
        batch = {}
        for d in range(self._division_count):
            members = list(self._division_members(d))
            self._rng.shuffle(members)
            for group in split_evenly(members, -(-len(members) // self.group_size)):
                batch.update(dict.fromkeys(group, tuple(sorted(group))))
        return batch

    def _assign(self, members: list[int], answering: dict[int, bool]) -> list[AssignGroup]:
        """Create the group `members`; `answering` maps the requesters it answers to `last`."""
        group = Group(id=self._next_id, members=tuple(sorted(members)))
        self._next_id += 1
        busy = sum(1 for w in members if self._unfinished[w])
        self._stats.groups += 1
        self._stats.conflicts += busy > 0
        self._stats.conflicting_members += busy
        self._stats.undersized += len(members) < self.group_size
        for w in group.members:
            self._unfinished[w].append(group)
        self._left_to_finish[group.id] = set(group.members)
        for w, last in answering.items():
            if last:
                self._leave(w)
        return [AssignGroup(rank=w, group=group, answers_request=w in answering)
                for w in group.members]

    def _division_members(self, division: int) -> tuple[int, ...]:
        members = self._members.get(division)
        if members is None:  # cached: a request must cost O(group), not O(world), at scale
            members = tuple(w for w in sorted(self._live) if self._division_of[w] == division)
            self._members[division] = members
        return members

    def _leave(self, rank: int) -> None:
        self._live.discard(rank)
        self._members.clear()

    def _redivide(self) -> None:
        """Draw new divisions among the live workers; a `batch` partition spans the old ones."""
        ranks = sorted(self._live)
        if self._division_count > 1:
            self._rng.shuffle(ranks)
        parts = split_evenly(ranks, self._division_count)
        self._division_of = {w: d for d, part in enumerate(parts) for w in part}
        self._members: dict[int, tuple[int, ...]] = {}
        self._batch = {}
