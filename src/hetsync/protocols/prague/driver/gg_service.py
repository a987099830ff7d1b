"""Rank 0's Group Generator service: the threads that carry `GroupGeneratorCore`'s messages.

A receiver thread turns the workers' messages (`ToGG`, one receive per peer over
`PeerStreams`, so a dead worker fails only its own) into entries of one inbox; a generator
thread owns the core, feeds it the inbox in arrival order and sends the assignments it returns
(`FromGG`; rank 0's own go to it directly through `deliver`). With a ready-wait policy the
generator wakes the core when a held request's wait runs out (`WaitTimedOut`)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from functools import partial

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
from hetsync.transport.links import Link
from hetsync.transport.lost_workers import unless_lost
from hetsync.transport.peer_streams import PeerStreams
from hetsync.transport.runtime import Runtime

__all__ = ["GroupGeneratorService"]

_LOST = 4  # an inbox entry's kind besides `Kind`'s: the launcher declared the rank lost


class GroupGeneratorService:
    """Rank 0's GG: a receiver thread turns messages into events; a generator thread owns the
    core and sends assignments (to rank 0 itself through `deliver`)."""

    def __init__(
        self, core: GroupGeneratorCore, deliver: Callable[[AssignGroup, float], None],
        ready_wait: float, link: Link, runtime: Runtime,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.core = core
        self.link = link  # the host link: receives on threads
        self.runtime = runtime
        self.world = core.world
        self.deliver = deliver
        self._requested_at: dict[int, float] = {}
        self.inbox: queue.Queue[tuple[int, int, int, float]] = queue.Queue()
        self.error: BaseException | None = None
        self._on_error = on_error
        self.ready_wait = ready_wait
        self.thread = threading.Thread(target=self._serve, name="prague-gg", daemon=True)
        """The generator; its receiver, which may wait on a lost worker for good, is left."""
        if self.world > 1:
            threading.Thread(target=self._receive, name="prague-gg-recv", daemon=True).start()
        if runtime.lost is not None:
            runtime.lost.subscribe(lambda rank: self.put(rank, _LOST, 0, 0.0))

    def put(self, rank: int, kind: int, value: int, flag: float) -> None:
        """A message from `rank` (rank 0's own come here directly)."""
        self.inbox.put((rank, kind, value, flag))

    def _receive(self) -> None:
        try:
            messages = PeerStreams(self.link, range(1, self.world), TO_GG_TAG, ToGG.empty,
                                   lambda message: ToGG.decode(message).kind == Kind.BYE,
                                   reuse=True, name="prague-gg-recv")
            for src, message in messages:
                to_gg = ToGG.decode(message)
                self.put(src, to_gg.kind, to_gg.value, to_gg.flag)
        except BaseException as error:  # noqa: BLE001 - reported by the serving thread
            self.error = error
            self.put(-1, Kind.BYE, 0, 0.0)

    def _serve(self) -> None:
        try:
            gone: set[int] = set()  # said goodbye or were lost
            lost: set[int] = set()
            while len(gone) < self.world and self.error is None:
                wait = self.ready_wait if self.core.waiting else None
                try:
                    rank, kind, value, flag = self.inbox.get(timeout=wait)
                except queue.Empty:
                    self._send_all(self.core.handle(WaitTimedOut()))
                    continue
                if kind == _LOST:
                    lost.add(rank)
                    if rank not in gone:
                        gone.add(rank)
                        self._send_all(self.core.handle(WorkerLost(rank=rank)))
                elif kind == Kind.BYE:
                    if rank not in lost:  # a lost worker's channel has nobody to end it for
                        gone.add(rank)
                        self._end(rank)
                elif kind == Kind.REQUEST:
                    event = GroupRequested(rank=rank, iteration=value, last=bool(flag))
                    self._requested_at[rank] = time.perf_counter()
                    self._send_all(self.core.handle(event))
                else:
                    self._send_all(self.core.handle(GroupFinished(group_id=value, rank=rank)))
        except BaseException as error:  # noqa: BLE001 - re-raised on rank 0's training thread
            self.error = error
        if self.error is not None:  # its own, or its receiver's
            self._on_error(self.error)

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
        self.runtime.before_send()
        unless_lost(self.runtime.lost, rank, partial(self.link.send, message, rank,
                                                     tag=FROM_GG_TAG))

    def raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"prague: the Group Generator failed: {self.error!r}")
