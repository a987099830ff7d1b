"""Receives from a known set of peers, each peer on a receive of its own.

gloo's receive from any source is one operation pending with every peer at once: a peer that
dies fails it, and it can take down a message another peer was sending at that moment. Seen
in the fault fuzz (`experiments/fault_fuzz.py --seed 11 --case 24`): a parameter-server
client killed while the server was stopped, and a live client's push was never received, its
sender blocked in `send` for good. Here each peer has a thread that receives from it alone, so
a dead peer fails only its own receive: the thread asks the launcher (`LostWorkers.confirm`)
and ends that peer's stream, and every other peer's messages arrive untouched.

A thread per peer costs nothing while it waits (gloo's receive releases the GIL). A message is
handed either to the consumer's iterator (one hand-over: the parameter server, AD-PSGD's
passive side, Prague's Group Generator, which serve one message at a time) or, with `deliver`,
to a function called on the peer's own thread as the message arrives (Hop's receivers, which
only turn a message into an event for the training thread: a thread woken a message fewer,
which Hop, taking in four messages an iteration on a ring, paid in CPU its compute shares).

A receive waits for as long as the process group's timeout (`runtime.PG_TIMEOUT`: under
hetsync's launcher longer than any run), not less: a peer may be busy in its script's own
code for minutes between two messages, and a gloo receive that times out closes the pair,
failing the peer's later sends too. A hung peer is the launcher's to find.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator

import torch

from hetsync.transport.links import Link

__all__ = ["Item", "PeerStreams"]

Item = tuple[int, torch.Tensor | None] | BaseException
"""(peer, message), (peer, None) when the peer's stream has ended, or a receive's error."""


class PeerStreams:
    """Messages tagged `tag` from each of `peers`, in arrival order across peers and in send
    order from each, until every peer has sent its `last` message or was lost.

    `buffer()` makes a receive buffer. With `reuse`, each peer receives into one buffer of its
    own, which a message handed out by the iterator keeps until the consumer asks for the
    next one (for request-reply protocols, whose peer sends nothing more before it is
    answered); without it, every message gets a new buffer, which the consumer may keep.
    A failed receive whose peer the launcher does not declare lost is raised by the iterator.

    With `deliver`, there is no iterator: each item (`Item`: an error among them, also one
    `deliver` itself raised) is passed to `deliver` on the thread of the peer it came from,
    several peers' at once, so `deliver` must be thread-safe. Without `reuse` only: a reused
    buffer waits for a consumer to ask for the next message.
    """

    def __init__(self, link: Link, peers: Iterable[int], tag: int,
                 buffer: Callable[[], torch.Tensor], last: Callable[[torch.Tensor], bool],
                 *, reuse: bool, name: str, deliver: Callable[[Item], None] | None = None
                 ) -> None:
        self.link = link
        self.peers = sorted(set(peers))
        world = link.world_size()
        if any(not 0 <= peer < world for peer in self.peers):  # gloo would crash the process
            raise ValueError(f"{name}: peers {self.peers} are not all ranks of the "
                             f"{link.name} link's group of {world}")
        self.tag = tag
        self._buffer = buffer
        self._last = last
        self._reuse = reuse
        if deliver is not None and reuse:
            raise ValueError(f"{name}: a delivered message cannot reuse its buffer (nobody "
                             "asks for the next one)")
        self._queue: queue.Queue[Item] = queue.Queue()
        self._deliver = self._queue.put if deliver is None else deliver
        self._delivered = deliver is not None
        self._released = {peer: threading.Event() for peer in self.peers}
        for peer in self.peers:
            threading.Thread(target=self._receive, args=(peer,), name=f"{name}-from-{peer}",
                             daemon=True).start()

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        if self._delivered:
            raise TypeError("these streams hand their messages to `deliver`, not to an iterator")
        return self._messages()

    def _messages(self) -> Iterator[tuple[int, torch.Tensor]]:
        open_streams = len(self.peers)
        while open_streams:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            peer, message = item
            if message is None:
                open_streams -= 1
                continue
            yield peer, message
            if self._reuse:
                self._released[peer].set()

    def _receive(self, peer: int) -> None:
        lost = self.link.lost
        message = self._buffer()
        try:
            while lost is None or peer not in lost.ranks:
                try:
                    self.link.recv(message, peer, self.tag)
                except RuntimeError as error:
                    if lost is None:
                        raise
                    lost.confirm(peer, error)  # raises unless the launcher declares it lost
                    break
                if self._reuse:
                    self._released[peer].clear()
                last = self._last(message)  # before the consumer may reuse the buffer
                self._deliver((peer, message))
                if last:
                    break
                if self._reuse:
                    self._released[peer].wait()
                else:
                    message = self._buffer()
        except BaseException as error:  # noqa: BLE001 - the consumer's to raise
            self._deliver(error)
            return
        self._deliver((peer, None))
