"""One kind of a worker's traffic, with every duty its messages carry.

A protocol's driver turns its core's decisions into channel operations and does nothing else
with a message: the channel applies the delay fault (`--fault delay-messages`), gives a
transfer up when its peer is declared lost, writes the payload in the run's wire format
(`--compress`, `hetsync.transport.codec`), moves it over its `Link`, counts the bytes this
worker sent in the iteration's record, charges the emulated network from the operation's own
message pattern (`hetsync.network.patterns`), and counts the time the training thread was
blocked. `Network` is the emulator, or `FreeNetwork` where there is none: no driver asks
which.

Operations come in two kinds: on the training thread they take the iteration's `Step` (its
record); on a protocol's own threads (serving, receiving) they take none, and their emulated
waits are the run's background (cut at `--max-time` and announced to the launcher as the
training thread's are: a slow link is not a deadlock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.distributed as dist

from hetsync.network.model import Message
from hetsync.network.patterns import ring_allreduce
from hetsync.transport.codec import Codec, Residual
from hetsync.transport.header import Frame
from hetsync.transport.links import Link, Transfers
from hetsync.transport.lost_workers import unless_lost

if TYPE_CHECKING:
    from hetsync.network.emulator import Network
    from hetsync.step import Step
    from hetsync.transport.runtime import Runtime

__all__ = ["Channel", "Pattern", "Seconds", "compressed_all_reduce"]

Members = TypeVar("Members", bound=Sequence[int])
"""The ranks an operation ran among."""

Pattern = Callable[[float], Sequence[Message]]
"""An operation's messages given the declared size of its buffer (`hetsync.network.patterns`)."""


class Channel:
    """A worker's traffic of one kind over `link`; see the module doc."""

    def __init__(self, link: Link, runtime: Runtime, network: Network,
                 codec: Codec | None = None, codec_time: Seconds | None = None) -> None:
        self.link = link
        self.runtime = runtime
        self.network = network
        self.codec = codec if codec is not None else Codec()
        self.codec_time = codec_time if codec_time is not None else Seconds()
        """Seconds spent encoding and decoding (the row's `codec_s`: compression's own cost)."""
        self.rank = runtime.rank
        self._residuals: dict[str, Residual] = {}
        self._held_lock = threading.Lock()
        self._held_until = 0.0  # the latest modelled arrival `arrive` holds a message until

    # --- what every operation does ------------------------------------------------------------
    def _fault(self) -> None:
        self.runtime.before_send()

    def count(self, step: Step | None, nbytes: float) -> None:
        """Count `nbytes` as sent by this worker in `step` (None: nothing to count in)."""
        if step is not None:
            step.bytes_sent += int(nbytes)

    @contextmanager
    def waiting(self, step: Step | None) -> Iterator[None]:
        """Time inside counts as `step`'s wait for synchronisation (a wait for this channel's
        messages that a protocol makes itself: an inbox, a condition)."""
        with step.blocking() if step is not None else nullcontext():
            yield

    @contextmanager
    def waiting_on_arrivals(self, step: Step | None) -> Iterator[None]:
        """`waiting`, for a wait that a message this worker's receiving thread holds until its
        modelled arrival (`arrive`) may prolong: the rest of that hold is announced as the
        training thread's own emulated waits are (`Step.on_wait`), since the receiving
        thread's announcement gives way to this wait's (a slow link is not a deadlock)."""
        with self.waiting(step):
            if step is not None and step.on_wait is not None:
                with self._held_lock:
                    held_until = self._held_until
                rest = held_until - self.network.origin(self.runtime) - self.stamp()
                if rest > 0:
                    step.on_wait(rest)
            yield

    def declared(self, nbytes: float) -> float:
        """The size a buffer of `nbytes` real bytes is charged as (`--payload`)."""
        return self.network.scaled(nbytes)

    def stamp(self) -> float:
        """The time a message is sent at, on the run's clock, for a header: what the network
        model charges it from at the receiver (0 where nothing is charged)."""
        return self.network.stamp(self.runtime)

    def lost(self, peer: int, transfer: Callable[[], object]) -> bool:
        """Run `transfer` with `peer`; True (and nothing raised) where it failed because the
        launcher declared `peer` lost, False where it went through."""
        return not unless_lost(self.runtime.lost, peer, transfer)

    # --- messages in the wire format ----------------------------------------------------------
    def frame(self, frame: Frame) -> Frame:
        """`frame` (a header, then a flat model) as it travels: the payload in the codec's
        format. Receive buffers are made for this one (`empty`)."""
        if self.codec.lossless or frame.numel == 0:
            return frame
        if self.codec.half is not None:
            return Frame(frame.words, frame.numel, self.codec.half)
        return Frame(frame.words, self.codec.nbytes(frame.numel, frame.dtype), torch.uint8)

    def empty(self, frame: Frame) -> torch.Tensor:
        """A buffer to receive one message of `frame` (the model's frame) into."""
        return self.link.empty(self.frame(frame))

    def pack(self, frame: Frame, header: Sequence[int], tensors: Sequence[torch.Tensor] = (),
             out: torch.Tensor | None = None, feedback: str | None = None) -> torch.Tensor:
        """A message of `frame` (the model's frame) in the wire format: `header`, then the
        tensors' values encoded. `feedback` names a quantity sent again and again (a
        worker's model, its gradient): the error of each encoding is added to the next."""
        wire = self.frame(frame)
        if wire is frame:
            return self.link.pack(frame, header, tensors, out=out)
        message = self.link.empty(wire) if out is None else out
        wire.write_header(message, header)
        if not tensors:
            return message
        began = time.perf_counter()
        if tensors[0].device == self.link.device:
            values = self.link.flat(tensors).to(torch.float32)
        else:  # encoded where the model is (a GPU): a quarter of the bytes cross to the wire
            values = torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])
        data = (self.codec.encode(values) if feedback is None
                else self.codec.encode_fed_back(values, self._residual(feedback)))
        wire.payload(message).view(torch.uint8).copy_(data.to(message.device))
        self.codec_time.add(time.perf_counter() - began)
        return message

    def payload(self, frame: Frame, message: torch.Tensor) -> torch.Tensor:
        """The flat model a message of `frame` carries, in the model's dtype: a view into
        `message` where the wire is lossless, else decoded into a new buffer."""
        wire = self.frame(frame)
        if wire is frame:
            return frame.payload(message)
        began = time.perf_counter()
        out = torch.empty(frame.numel, dtype=frame.dtype, device=message.device)
        self.codec.decode(wire.payload(message).view(torch.uint8), out)
        self.codec_time.add(time.perf_counter() - began)
        return out

    # --- collectives (the training thread) ----------------------------------------------------
    def all_reduce(self, step: Step | None, flat: torch.Tensor, key: str,
                   exact_tail: int = 0) -> None:
        """Sum `flat` over the link's group, in place; its last `exact_tail` elements (votes)
        are summed exactly, whatever the codec."""
        world = self.link.world_size()
        with self.waiting(step):
            began = time.perf_counter()
            self._fault()
            wire = self._reduce(flat, key, exact_tail)
        self.network.after_blocking(step, ring_allreduce(range(world), self.declared(wire)),
                                    key, time.perf_counter() - began)
        self.count(step, 2 * (world - 1) * wire / world)

    def all_reduce_async(self, step: Step, flat: torch.Tensor, key: str,
                         exact_tail: int = 0) -> torch.futures.Future[torch.Tensor]:
        """`all_reduce` without waiting for it (a DDP communication hook's): the future of
        `flat` reduced, its wait and network charged to `step` when it completes. A
        compressed one is reduced at once (its future complete)."""
        world = self.link.world_size()
        if step.on_phase is not None:
            step.on_phase("sync")
        began = time.perf_counter()
        self._fault()
        if not self.codec.lossless:
            wire = self._reduce(flat, key, exact_tail)
            future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            future.set_result(flat)
        else:
            wire = flat.numel() * flat.element_size()
            work = self.link.all_reduce(flat, async_op=True)
            assert work is not None
            future = work.get_future().then(lambda fut: fut.value()[0])
        self.count(step, 2 * (world - 1) * wire / world)

        def charged(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            step.sync_wait_s += time.perf_counter() - began
            self.network.after_blocking(step, ring_allreduce(range(world),
                                                             self.declared(wire)),
                                        key, time.perf_counter() - began)
            return fut.value()

        return future.then(charged)

    def collective(self, step: Step | None, run: Callable[[], object], nbytes: float,
                   pattern: Pattern, key: str, sent: float) -> None:
        """A collective the link's operation `run` makes (a P-Reduce over a group): `nbytes`
        real bytes charged as `pattern`'s messages, `sent` of them by this worker."""
        with self.waiting(step):
            began = time.perf_counter()
            self._fault()
            run()
        self.network.after_blocking(step, pattern(self.declared(nbytes)), key,
                                    time.perf_counter() - began)
        self.count(step, sent)

    def collective_among(self, step: Step | None, run: Callable[[], Members], nbytes: float,
                         pattern: Callable[[Members, float], Sequence[Message]],
                         key: Callable[[Members], str]) -> Members:
        """`collective` for one whose members are known once it ran (a P-Reduce that leaves
        out members declared lost meanwhile): `run` returns them, `pattern` gives their
        messages of a buffer's declared size and `key` names the operation by them. Returns
        the members; counts nothing (what this worker sent depends on them: `count`)."""
        with self.waiting(step):
            began = time.perf_counter()
            self._fault()
            members = run()
        self.network.after_blocking(step, pattern(members, self.declared(nbytes)), key(members),
                                    time.perf_counter() - began)
        return members

    def _reduce(self, flat: torch.Tensor, key: str, exact_tail: int) -> int:
        """All-reduce `flat` in the codec's format; the bytes one worker's buffer takes on the
        wire."""
        if self.codec.lossless:
            self.link.all_reduce(flat)
            return flat.numel() * flat.element_size()
        return compressed_all_reduce(self.link, self.codec, flat, exact_tail,
                                     self._residual(f"{key}/own"),
                                     self._residual(f"{key}/share"), self.codec_time)

    def _residual(self, name: str) -> Residual:
        """The error feedback of the quantity `name` this channel sends again and again."""
        return self._residuals.setdefault(name, Residual())

    # --- point to point -----------------------------------------------------------------------
    def post(self, step: Step | None, sends: Transfers, receives: Transfers,
             tag: int) -> list[dist.Work]:
        """Post sends and receives together (they overlap with compute); `wait` for them."""
        sends = list(sends)
        self._fault()
        works = self.link.post(sends, receives, tag)
        self.count(step, sum(t.numel() * t.element_size() for t, _ in sends))
        return works

    def wait(self, step: Step | None, works: Sequence[dist.Work], peer: int | None = None) -> bool:
        """Wait for posted `works` (with `peer`: False once it is declared lost meanwhile)."""
        with self.waiting(step):
            if peer is None:
                for work in works:
                    work.wait()
                return True
            return not self.lost(peer, lambda: [self.link.wait(w, peer) for w in works])

    def send(self, step: Step | None, message: torch.Tensor, dst: int, tag: int) -> bool:
        """Send `message` to `dst` and wait until it left; False where `dst` was declared lost
        (nothing counted)."""
        self._fault()
        if self.lost(dst, lambda: self.link.send(message, dst, tag=tag)):
            return False
        self.count(step, message.numel() * message.element_size())
        return True

    def isend(self, step: Step | None, message: torch.Tensor, to: Sequence[int],
              tag: int) -> list[tuple[dist.Work, int]]:
        """Start sending `message` to each of `to`; the works started (a peer declared lost as
        it was posted to is left out, and not counted)."""
        self._fault()
        works: list[tuple[dist.Work, int]] = []
        for j in to:
            self.lost(j, lambda j=j: works.append((self.link.isend(message, j, tag=tag), j)))
        self.count(step, message.numel() * message.element_size() * len(works))
        return works

    def request(self, step: Step | None, message: torch.Tensor, reply: torch.Tensor,
                partner: int, tags: tuple[int, int]) -> list[dist.Work] | None:
        """Post `message` to `partner` and the receive of its `reply` (tags: the request's
        and the reply's); None where `partner` was declared lost."""
        works: list[dist.Work] = []
        self._fault()
        if self.lost(partner, lambda: works.extend([
                self.link.isend(message, partner, tag=tags[0]),
                self.link.irecv(reply, partner, tag=tags[1])])):
            return None
        self.count(step, message.numel() * message.element_size())
        return works

    def hand_over(self, deliver: Callable[[], object]) -> None:
        """A message to a service on this worker, handed over in-process by `deliver`: delayed
        as a sent one is (`--fault delay-messages`), nothing else to do."""
        self._fault()
        deliver()

    def recv(self, step: Step | None, buffer: torch.Tensor, src: int, tag: int) -> None:
        with self.waiting(step):
            self.link.recv(buffer, src, tag=tag)

    # --- the emulated network's charges -------------------------------------------------------
    def hold(self, step: Step | None, pattern: Pattern, nbytes: float, sent: float) -> None:
        """What a posted operation brought is usable once `pattern`'s messages of `nbytes`
        real bytes, sent at `sent` (`stamp()`, the latest of its members'), would have
        arrived."""
        messages = pattern(self.declared(nbytes))
        modelled = self.network.duration(messages)
        self.network.hold_until(step, self.network.origin(self.runtime) + sent + modelled,
                                modelled)

    def hold_for(self, step: Step | None, posted: float, modelled: float) -> None:
        """Hold until `posted` (on the machine's clock) plus `modelled` seconds."""
        self.network.hold_until(step, posted + modelled, modelled)

    def duration(self, pattern: Pattern, nbytes: float) -> float:
        """The modelled seconds of `pattern`'s messages of `nbytes` real bytes."""
        return self.network.duration(pattern(self.declared(nbytes)))

    def busy_with(self, pattern: Pattern, nbytes: float) -> None:
        """A serving thread takes part in `pattern`'s messages of `nbytes` real bytes, one
        operation at a time: it is busy for their modelled time."""
        self.network.occupy(pattern(self.declared(nbytes)))

    def occupy_control(self, messages: Sequence[Message]) -> None:
        """`busy_with` for control messages (a Group Generator's answer, a token): charged
        their own real size, which `--payload` does not scale."""
        self.network.occupy(messages)

    def arrive(self, src: int, nbytes: float, copies: int, sent: float) -> None:
        """A receiving thread: hold a message of `nbytes` real bytes from `src`, sent at
        `sent` (`stamp()`) as one of `copies` equal ones, until its modelled arrival on this
        worker's NIC (messages that overlap share its ingress)."""
        self.runtime.clock_started.wait()
        at = self.network.origin(self.runtime) + sent
        arrival = self.network.deliver(Message(src, self.rank, self.declared(nbytes)),
                                       copies, at)
        with self._held_lock:
            self._held_until = max(self._held_until, arrival)
        self.network.hold_until(None, arrival, arrival - at)


class Seconds:
    """Seconds added up from several threads, taken by the iteration's row."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._total += seconds

    def take(self) -> float:
        with self._lock:
            taken, self._total = self._total, 0.0
        return taken


def compressed_all_reduce(link: Link, codec: Codec, flat: torch.Tensor, exact_tail: int,
                          own: Residual, part: Residual, codec_time: Seconds | None = None,
                          ) -> int:
    """Sum `flat` over `link`'s group with its body on the wire in `codec`'s format, summed in
    fp32 after decoding: each worker's share of the body (a k-th) is sent to the worker that
    owns that share (an all-to-all: a reduce-scatter's bytes), which decodes and sums the k
    copies, encodes the sum and sends it to all (an all-gather). Each worker sends
    2(k-1)/k of its encoded buffer, as a ring all-reduce does. Error feedback: `own` for this
    worker's body, `part` for the share it sums. The `exact_tail` last elements ride raw, in
    fp32, summed exactly. Returns the bytes of one worker's encoded buffer."""
    began = time.perf_counter()
    k = link.world_size()
    n = flat.numel() - exact_tail
    share = -(-n // k)
    body = torch.zeros(share * k, dtype=torch.float32, device=flat.device)
    body[:n].copy_(flat[:n])
    tail = flat[n:].float()
    wire = -(-codec.nbytes(share) // 8) * 8  # every block's parts start 8-byte aligned
    block = wire + -(-4 * exact_tail // 8) * 8
    own.add_into(body)
    send = torch.empty(k * block, dtype=torch.uint8, device=flat.device)
    sent_body = torch.empty_like(body)
    for j in range(k):
        piece = send[j * block : (j + 1) * block]
        codec.encode(body[j * share : (j + 1) * share], out=piece[:wire])
        codec.decode(piece[:wire], sent_body[j * share : (j + 1) * share])
        piece[wire : wire + 4 * exact_tail].view(torch.float32).copy_(tail)
    own.keep(body, sent_body)
    received = link.zeros(k * block, torch.uint8)  # on the wire, for the all-to-all
    coding = time.perf_counter() - began
    link.all_to_all(received, link.on_wire(send))
    began = time.perf_counter()
    total = torch.zeros(share + exact_tail, dtype=torch.float32, device=flat.device)
    decoded = torch.empty(share, dtype=torch.float32, device=flat.device)
    for j in range(k):
        piece = received[j * block : (j + 1) * block].to(flat.device)
        total[:share].add_(codec.decode(piece[:wire], decoded))
        total[share:].add_(piece[wire : wire + 4 * exact_tail].view(torch.float32))
    mine = torch.empty(block, dtype=torch.uint8, device=flat.device)
    codec.encode_fed_back(total[:share], part, out=mine[:wire])
    mine[wire : wire + 4 * exact_tail].view(torch.float32).copy_(total[share:])
    gathered = link.zeros(k * block, torch.uint8)
    coding += time.perf_counter() - began
    link.all_gather(gathered, link.on_wire(mine))
    began = time.perf_counter()
    gathered = gathered.to(flat.device)
    for j in range(k):
        piece = gathered[j * block : (j + 1) * block]
        codec.decode(piece[:wire], body[j * share : (j + 1) * share])
    flat[:n].copy_(body[:n])
    if exact_tail:
        flat[n:].copy_(gathered[wire : wire + 4 * exact_tail].view(torch.float32))
    if codec_time is not None:
        codec_time.add(coding + time.perf_counter() - began)
    return k * block
