"""Rank 0's Group Generator service: the threads that carry `GroupGeneratorCore`'s messages.

The workers' messages (`ToGG`) arrive on one receive per peer (`PeerStreams`, so a dead worker
fails only its own), and the thread a message arrives on feeds it to the core and sends the
assignments the core returns (`FromGG`; rank 0's own go to it directly through `deliver`),
all under one lock: a message wakes one thread at rank 0, not three (its peer's, a consumer's,
a generator's: the CPU it saved, docs/notes/real-compute-log.md). Rank 0's own messages are fed
the same way by the thread that sends them. With a ready-wait policy a timer thread wakes the
core when a held request's wait runs out (`WaitTimedOut`): `ready_wait` after the last
message served."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hetsync.protocols.prague.gg_wire import FROM_GG_TAG, TO_GG_TAG, FromGG, Kind, ToGG
from hetsync.protocols.prague.group_generator import (
    AssignGroup,
    Group,
    GroupFinished,
    GroupGeneratorCore,
    GroupRequested,
    WaitTimedOut,
    WorkerLost,
)
from hetsync.transport.channel import Channel
from hetsync.transport.peer_streams import Item, PeerStreams
from hetsync.transport.runtime import Runtime

__all__ = ["GroupGeneratorService"]

_LOST = 4  # a message's kind besides `Kind`'s: the launcher declared the rank lost


class GroupGeneratorService:
    """Rank 0's GG: the thread a message arrives on feeds the core and sends the assignments
    (to rank 0 itself through `deliver`); `thread` is the ready-wait timer, which ends once
    every worker has said goodbye or was lost."""

    def __init__(
        self, core: GroupGeneratorCore, deliver: Callable[[AssignGroup, float], None],
        ready_wait: float, channel: Channel, runtime: Runtime,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.core = core
        self.channel = channel  # the Group Generator's, on the host link: receives on threads
        self.world = core.world
        self.deliver = deliver
        self.ready_wait = ready_wait
        self.error: BaseException | None = None
        self._on_error = on_error
        self._requested_at: dict[int, float] = {}
        self._gone: set[int] = set()  # said goodbye or were lost
        self._lost: set[int] = set()
        self._cond = threading.Condition()  # the core, the sends and the fields above
        self._served_at = time.perf_counter()  # when the last message was served
        self._timer_idle = False  # the timer waits for requests to be held, with no deadline
        self.thread = threading.Thread(target=self._time_waits, name="prague-gg", daemon=True)
        if self.world > 1:
            PeerStreams(channel.link, range(1, self.world), TO_GG_TAG, ToGG.empty,
                        lambda message: ToGG.decode(message).kind == Kind.BYE,
                        reuse=False, name="prague-gg-recv", deliver=self._receive)
        if runtime.lost is not None:
            runtime.lost.subscribe(lambda rank: self.put(rank, ToGG(_LOST, 0, 0.0)))

    def put(self, rank: int, message: ToGG) -> None:
        """Serve a message from `rank` on the calling thread (rank 0's own come here directly,
        the others' from their receive threads)."""
        with self._cond:
            if self.error is not None or self._done():
                return
            try:
                self._serve(rank, message)
            except BaseException as error:  # noqa: BLE001 - re-raised on rank 0's training thread
                self._fail(error)
                return
            self._served_at = time.perf_counter()
            if (self._timer_idle and self.core.waiting) or self._done():
                self._cond.notify_all()  # the timer starts, or ends; a deadline it has set
                # only moves later, and it finds that when it wakes (no wake-up a message)

    def _receive(self, item: Item) -> None:
        """A worker's message, or its receive's failure, on that worker's receive thread."""
        if isinstance(item, BaseException):
            with self._cond:
                self._fail(item)
            return
        src, message = item
        if message is not None:  # None: its stream ended (its goodbye came, or it was lost)
            self.put(src, ToGG.decode(message))

    def _serve(self, rank: int, message: ToGG) -> None:
        kind, value = message.kind, message.value
        if kind == _LOST:
            self._lost.add(rank)
            if rank not in self._gone:
                self._gone.add(rank)
                self._send_all(self.core.handle(WorkerLost(rank=rank)))
        elif kind == Kind.BYE:
            if rank not in self._lost:  # a lost worker's channel has nobody to end it for
                self._gone.add(rank)
                self._end(rank)
        elif kind == Kind.REQUEST:
            if message.finished >= 0:  # a group finished, told with the request: before it
                self._send_all(self.core.handle(GroupFinished(group_id=message.finished,
                                                              rank=rank)))
            event = GroupRequested(rank=rank, iteration=value, last=bool(message.flag))
            self._requested_at[rank] = time.perf_counter()
            self._send_all(self.core.handle(event))
        else:
            self._send_all(self.core.handle(GroupFinished(group_id=value, rank=rank)))

    def _done(self) -> bool:
        return len(self._gone) >= self.world

    def _time_waits(self) -> None:
        """The ready-wait timer: `WaitTimedOut` once requests have waited `ready_wait` since
        the last message served."""
        with self._cond:
            while self.error is None and not self._done():
                if not self.core.waiting:
                    self._timer_idle = True
                    self._cond.wait()
                    self._timer_idle = False
                    continue
                left = self._served_at + self.ready_wait - time.perf_counter()
                if left > 0:
                    self._cond.wait(left)
                    continue
                try:
                    self._send_all(self.core.handle(WaitTimedOut()))
                except BaseException as error:  # noqa: BLE001 - re-raised on rank 0's training thread
                    self._fail(error)
                self._served_at = time.perf_counter()

    def _fail(self, error: BaseException) -> None:
        """The first failure (lock held) stops the service and is raised on rank 0's threads."""
        if self.error is None:
            self.error = error
            self._cond.notify_all()
            self._on_error(error)

    def _send_all(self, assignments: list[AssignGroup]) -> None:
        now = time.perf_counter()
        for assign in assignments:
            asked = self._requested_at.pop(assign.rank, now) if assign.answers_request else now
            held = now - asked
            if assign.rank == 0:
                self.deliver(assign, held)
            else:
                self._send(assign.rank, assign.group, assign.answers_request, held)

    def _end(self, rank: int) -> None:
        """`rank` said goodbye: end its assignment channel."""
        if rank > 0:
            self._send(rank, None, False, 0.0)

    def _send(self, rank: int, group: Group | None, answers_request: bool, held: float) -> None:
        """One assignment (or, with no group, the end marker): id, whether it answers the
        request, how long the GG held that request, size, members. A blocking send returns at
        once: the worker's receiver thread always waits for the next one."""
        message = FromGG(group, answers_request, held).encode(self.world)
        self.channel.send(None, message, rank, FROM_GG_TAG)

    def raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"prague: the Group Generator failed: {self.error!r}")
