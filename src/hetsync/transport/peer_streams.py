"""Receives from a known set of peers, each peer on a receive of its own.

gloo's receive from any source is one operation pending with every peer at once: a peer that
dies fails it, and it can take down a message another peer was sending at that moment. Seen
in the fault fuzz (`experiments/fault_fuzz.py --seed 11 --case 24`): a parameter-server
client killed while the server was stopped, and a live client's push was never received, its
sender blocked in `send` for good. Here each peer has a thread that receives from it alone, so
a dead peer fails only its own receive: the thread asks the launcher (`LostWorkers.confirm`)
and ends that peer's stream, and every other peer's messages arrive untouched.

A thread per peer costs nothing while it waits (gloo's receive releases the GIL) and one
hand-over per message; the protocols that use it (the parameter server, Hop, AD-PSGD's passive
side, Prague's Group Generator) receive from a handful of peers, or from each worker once an
iteration.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator

import torch

from hetsync.transport.links import Link

__all__ = ["PeerStreams"]

_Item = tuple[int, torch.Tensor | None] | BaseException
"""(peer, message), (peer, None) when the peer's stream has ended, or a receive's error."""


class PeerStreams:
    """Messages tagged `tag` from each of `peers`, in arrival order across peers and in send
    order from each, until every peer has sent its `last` message or was lost.

    `buffer()` makes a receive buffer. With `reuse`, each peer receives into one buffer of its
    own, which a message handed out by the iterator keeps until the consumer asks for the
    next one (for request-reply protocols, whose peer sends nothing more before it is
    answered); without it, every message gets a new buffer, which the consumer may keep.
    A failed receive whose peer the launcher does not declare lost is raised by the iterator.
    """

    def __init__(self, link: Link, peers: Iterable[int], tag: int,
                 buffer: Callable[[], torch.Tensor], last: Callable[[torch.Tensor], bool],
                 *, reuse: bool, name: str) -> None:
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
        self._queue: queue.Queue[_Item] = queue.Queue()
        self._released = {peer: threading.Event() for peer in self.peers}
        for peer in self.peers:
            threading.Thread(target=self._receive, args=(peer,), name=f"{name}-from-{peer}",
                             daemon=True).start()

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
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
                self._released[peer].clear()
                self._queue.put((peer, message))
                if self._last(message):
                    break
                if self._reuse:
                    self._released[peer].wait()
                else:
                    message = self._buffer()
        except BaseException as error:  # noqa: BLE001 - raised by the consumer's iterator
            self._queue.put(error)
            return
        self._queue.put((peer, None))
