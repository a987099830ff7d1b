"""Generations of a run's membership: a lost worker, restarted, rejoins (`--on-failure rejoin`).

torch.distributed cannot add a process to a process group, so a membership change makes a new
*generation*: a gloo group of its members (in rank order) over the run's store, under the
prefix ``gen{n}/``, as torchft's reconfigure does per quorum. Generation 0 is the run's default
group. The launcher, the run's failure detector, decides every generation and publishes it
(`publish`): a lost worker restarted (its rank among the `newcomers`), or a worker whose
restarts are spent left out (the run goes on, smaller).

A worker learns of a new generation at one point, the wait of its link's collectives
(`Membership.wait`, hetsync.transport.links): a wait on the old group gives way when it fails
(a peer died) or when a newer generation is published (gloo's other pairs never fail by
themselves: in a ring of 4, the dead rank's far peer waited for good, measured with torch
2.13). The worker then forms the new group, the members hand the live state (the model, the
optimizer's state, the iteration) from a donor (the first member that is not new) to the
newcomers, and `Regrouped` tells the protocol, whose core contributes to the step again with
the new membership. The newcomer forms its group in `hetsync.init()` (`join_generation`) and
takes the state in `hetsync.prepare()` (`receive_state`). Old groups are left as they are: a
wait given up on one stays blocked on a gloo thread, harmlessly.

Every wait here has a deadline or gives way to a newer generation: the launcher publishes one
for every change, so a group that cannot form (a newcomer that died while joining) is left for
the next generation, which the launcher publishes once it has seen that death.
"""

from __future__ import annotations

import datetime
import io
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hetsync.transport.lost_workers import Waited, wait_each


class Regroupable(Protocol):
    """What a generation changes: a link (hetsync.transport.links, which imports this
    module, so it is named by its shape here)."""

    group: Any

    def regroup(self, group: dist.ProcessGroup, members: tuple[int, ...]) -> None: ...

__all__ = ["ENV_GENERATION", "GEN_KEY", "Generation", "Membership", "Regrouped", "latest",
           "publish", "read"]

#: The control-store key of the newest generation's number, and of each generation's members.
GEN_KEY = "gen"
MEMBERS_KEY = "gen/{number}"
#: Set by the launcher for a restarted worker: the generation it joins.
ENV_GENERATION = "HETSYNC_GENERATION"
POLL_S = 0.05


@dataclass(frozen=True)
class Generation:
    """One membership of the run: its number, its member ranks (sorted) and which of them
    are new in it (restarted workers, which take the live state)."""

    number: int
    members: tuple[int, ...]
    newcomers: tuple[int, ...] = ()

    def index(self, rank: int) -> int:
        """`rank`'s rank within this generation's group."""
        return self.members.index(rank)

    @property
    def donor(self) -> int:
        """The member that hands the live state to the newcomers: the first one not new."""
        return next(r for r in self.members if r not in self.newcomers)


def publish(store: dist.Store, generation: Generation) -> None:
    """Make `generation` the run's newest (the launcher's)."""
    store.set(MEMBERS_KEY.format(number=generation.number),
              json.dumps({"members": generation.members, "newcomers": generation.newcomers}))
    store.set(GEN_KEY, str(generation.number))


def latest(store: dist.Store) -> int:
    """The newest generation's number (0: the run's first, its default group)."""
    return int(store.get(GEN_KEY).decode()) if store.check([GEN_KEY]) else 0


def read(store: dist.Store, number: int) -> Generation:
    """Generation `number`, as the launcher published it."""
    value = json.loads(store.get(MEMBERS_KEY.format(number=number)).decode())
    return Generation(number, tuple(value["members"]), tuple(value["newcomers"]))


class Regrouped(Exception):  # noqa: N818 - not an error: the step goes on in a new membership
    """A collective was given up because the run's membership changed: the links now carry
    `generation`'s group; the protocol contributes to its step again."""

    def __init__(self, generation: Generation) -> None:
        super().__init__(f"the run's membership is now generation {generation.number}: ranks "
                         f"{', '.join(map(str, generation.members))}")
        self.generation = generation


class Membership:
    """A worker's view of the run's generations, and its part in changing them."""

    def __init__(self, store: dist.Store, group_store: Callable[[], dist.Store], rank: int,
                 timeout: datetime.timedelta, confirm_timeout: float,
                 generation: Generation) -> None:
        self._store = store
        self._group_store = group_store
        """A new client of the store where the generations' groups meet, one per group: a
        group that never formed (a member died meanwhile) leaves its client blocked in a
        wait, and a TCPStore client serves one call at a time (measured: the next group's
        rendezvous over a shared client waited behind it for good)."""
        self.rank = rank
        self.timeout = timeout
        self.confirm_timeout = confirm_timeout
        """How long a failed collective waits for the launcher's new generation."""
        self.current = generation
        self.links: list[Regroupable] = []
        """The links that carry the current generation's group (`Links.of` adds them)."""
        self.state_source: Callable[[], dict[str, object]] | None = None
        """The live state a donor hands over (SyncOptimizer's)."""
        self.changes: list[tuple[float, Generation]] = []
        """(time.time(), generation) of each change this worker went through."""
        self._waits: queue.SimpleQueue[Waited] = queue.SimpleQueue()
        self._waiter: threading.Thread | None = None

    @classmethod
    def join_generation(cls, store: dist.Store, group_store: Callable[[], dist.Store], rank: int,
                        timeout: datetime.timedelta, confirm_timeout: float,
                        number: int) -> tuple[Membership, dist.ProcessGroup]:
        """A restarted worker's membership, in generation `number`, and that generation's
        group: it forms once the members (waiting for it in a failed collective) form it."""
        generation = read(store, number)
        membership = cls(store, group_store, rank, timeout, confirm_timeout, generation)
        formed = membership._form(generation)
        if formed is None:
            raise RuntimeError(f"hetsync: rank {rank} could not rejoin: generation {number} was "
                               f"replaced by a newer one while it joined")
        return membership, formed[1]

    # --- the wait of a collective -------------------------------------------------------------
    def wait(self, work: dist.Work) -> None:
        """Wait for `work`, a collective of the current generation: return once done; where it
        fails or a newer generation is published, change to the newest generation and raise
        `Regrouped` (or the failure itself, if no new generation comes within
        `confirm_timeout`)."""
        error = self._wait(work)
        if error is None:
            return
        self.regroup(error if isinstance(error, RuntimeError) else None)

    def regroup(self, error: RuntimeError | None) -> None:
        """Change to the newest generation (see the module doc); raises `Regrouped`."""
        while True:
            generation = self._newer(error)
            formed = self._form(generation)
            if formed is None:
                continue  # replaced while forming: the newest one
            generation, group = formed
            for link in self.links:
                link.regroup(group, generation.members)
            self.current = generation
            self.changes.append((time.time(), generation))
            if generation.newcomers:
                failure = self._hand_over(generation)
                if failure is not None:
                    error = failure if isinstance(failure, RuntimeError) else None
                    continue
            raise Regrouped(generation)

    def receive_state(self) -> dict[str, object]:
        """A newcomer's part in the hand-over: the donor's live state."""
        return self._broadcast_state(self.current)

    # --- inside ------------------------------------------------------------------------------
    def _wait(self, work: dist.Work) -> RuntimeError | bool | None:
        """None once `work` is done; its error; True if a newer generation came first."""
        waited = Waited(work)
        if self._waiter is None:
            self._waiter = threading.Thread(target=wait_each, args=(self._waits,),
                                            name="hetsync-generation-wait", daemon=True)
            self._waiter.start()
        self._waits.put(waited)
        while not waited.done.wait(POLL_S):
            if latest(self._store) > self.current.number:
                self._waiter = None  # that thread may stay blocked: a new one for the next
                self._waits = queue.SimpleQueue()
                return True
        return waited.error

    def _newer(self, error: RuntimeError | None) -> Generation:
        """The newest generation after the current one, once the launcher publishes it."""
        deadline = time.monotonic() + self.confirm_timeout
        while (number := latest(self._store)) <= self.current.number:
            if time.monotonic() > deadline:
                if error is not None:
                    raise error
                raise RuntimeError(f"hetsync: rank {self.rank} waited {self.confirm_timeout:g} "
                                   f"s for the run's generation {self.current.number + 1}")
            time.sleep(POLL_S)
        generation = read(self._store, number)
        if self.rank not in generation.members:
            raise RuntimeError(f"hetsync: rank {self.rank} is not a member of the run's "
                               f"generation {number}")
        return generation

    def _form(self, generation: Generation) -> tuple[Generation, dist.ProcessGroup] | None:
        """`generation`'s group, formed on a thread: None if a newer generation is published
        first (a member died while it formed: that group never will)."""
        formed: list[dist.ProcessGroup] = []
        failed: list[BaseException] = []

        def form() -> None:
            try:
                formed.append(dist.ProcessGroupGloo(
                    dist.PrefixStore(f"gen{generation.number}/", self._group_store()),
                    generation.index(self.rank), len(generation.members), self.timeout))
            except Exception as error:  # noqa: BLE001 - raised by the caller
                failed.append(error)

        thread = threading.Thread(target=form, name="hetsync-generation-form", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(POLL_S)
            if thread.is_alive() and latest(self._store) > generation.number:
                return None
        if failed:
            raise failed[0]
        return generation, formed[0]

    def _hand_over(self, generation: Generation) -> RuntimeError | bool | None:
        """A member's part in handing the live state to `generation`'s newcomers; what ended
        it early (as `_wait`), or None."""
        try:
            self._broadcast_state(generation)
        except _GaveWay as gave_way:
            return gave_way.reason
        return None

    def _broadcast_state(self, generation: Generation) -> dict[str, object]:
        """The donor's state (serialised by torch.save), broadcast over `generation`'s group:
        its size, then its bytes. Every member takes part (a gloo broadcast is collective)."""
        link = self.links[0]
        root = generation.index(generation.donor)
        group = link.group
        assert group is not None, "a generation's link carries that generation's group"
        payload = torch.empty(0, dtype=torch.uint8)
        if self.rank == generation.donor:
            assert self.state_source is not None, "the donor's SyncOptimizer gives its state"
            buffer = io.BytesIO()
            torch.save(self.state_source(), buffer)
            payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        self._collective(group.broadcast(size, root))
        if self.rank != generation.donor:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._collective(group.broadcast(payload, root))
        if self.rank == generation.donor:
            return {}
        return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False,
                          map_location="cpu")

    def _collective(self, work: dist.Work) -> None:
        reason = self._wait(work)
        if reason is not None:
            raise _GaveWay(reason)


class _GaveWay(Exception):  # noqa: N818 - internal: a hand-over ended by a failure or a newer one
    def __init__(self, reason: RuntimeError | bool) -> None:
        super().__init__(str(reason))
        self.reason = reason
