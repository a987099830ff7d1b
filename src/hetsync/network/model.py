"""The network cost model: when each message of a pattern arrives, on the NICs of a spec.

No I/O, no sleeps, no threads: real runs ask it how long a communication should have taken
(`hetsync.network.emulator`), and a discrete-event simulator can drive the same object on its
virtual clock.

The rule, per message of b bytes from i to j (a "circuit" held at both ends):

    start   = max(ready, egress_free[i], ingress_free[j])
    end     = start + b / min(egress[i], ingress[j])
    arrival = end + max(latency[i], latency[j])

after which i's egress and j's ingress are free at `end`. Messages take the NICs in the order
they become ready (FIFO), ties broken by the order given. FIFO rather than fair share because
the makespan of messages of one size through one NIC is the same under both (an incast of 7
equal gradients ends at 7b/B either way, and that makespan is what a synchronous step waits
for), and because FIFO needs only each NIC's own clock, which the worker that owns the NIC can
keep by itself. It is pessimistic for a short message queued behind a long one, which fair
sharing would let through early; `--network` runs report the model's figures beside the real
ones so the difference can be seen.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hetsync.network.spec import NetworkSpec

__all__ = ["LinkChange", "Message", "NetworkModel"]


@dataclass(frozen=True)
class LinkChange:
    """From `at` seconds into the run, the NICs of `ranks` carry at most `bandwidth` bytes/s
    each way (`--fault slow-link`): every message to or from them is charged at it."""

    ranks: tuple[int, ...]
    at: float
    bandwidth: float


@dataclass(frozen=True)
class Message:
    """b bytes from `src` to `dst`, sent once the messages at indices `after` have arrived."""

    src: int
    dst: int
    nbytes: float
    after: tuple[int, ...] = ()


class NetworkModel:
    """NIC clocks of every rank of a `NetworkSpec`; `send` books messages on them."""

    def __init__(self, spec: NetworkSpec, world: int, changes: Sequence[LinkChange] = (),
                 now: Callable[[], float] = lambda: 0.0) -> None:
        self.spec = spec
        self.nics = [spec.nic(r) for r in range(world)]
        self.egress_free = [0.0] * world
        self.ingress_free = [0.0] * world
        self.changes = sorted(changes, key=lambda change: change.at)
        self.now = now
        """Seconds into the run (the real clock, or the simulator's), for `changes`."""
        self.epoch = 0
        """How many changes apply so far: a figure cached from the NICs holds for one epoch."""

    def refresh(self) -> None:
        """Apply the changes due by now (each NIC the slower of its own and the change's)."""
        while self.epoch < len(self.changes) and self.now() >= self.changes[self.epoch].at:
            change = self.changes[self.epoch]
            for r in change.ranks:
                nic = self.nics[r]
                self.nics[r] = replace(nic, egress=min(nic.egress, change.bandwidth),
                                       ingress=min(nic.ingress, change.bandwidth))
            self.epoch += 1

    def send(self, messages: Sequence[Message], at: float = 0.0) -> list[float]:
        """Book `messages` (none may depend on a later one) from time `at`; their arrivals."""
        self.refresh()
        arrival = [float("nan")] * len(messages)
        waiting = [len(m.after) for m in messages]
        unlocks: list[list[int]] = [[] for _ in messages]
        for k, m in enumerate(messages):
            for d in m.after:
                if d >= k:
                    raise ValueError(f"message {k} waits for message {d}, not an earlier one")
                unlocks[d].append(k)
        ready = [(at, k) for k, n in enumerate(waiting) if n == 0]
        heapq.heapify(ready)
        while ready:
            t, k = heapq.heappop(ready)
            arrival[k] = self._book(messages[k], t)
            for nxt in unlocks[k]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    when = max([at] + [arrival[d] for d in messages[nxt].after])
                    heapq.heappush(ready, (when, nxt))
        return arrival

    def deliver(self, m: Message, at: float, copies: int = 1) -> float:
        """The arrival of `m`, sent at `at` as one of `copies` equal messages its sender's
        egress serves together (a fan-out: fair share, all end at copies * b / egress), and
        taking the receiver's ingress in FIFO order: how a receiver that sees only its own
        messages (Hop's) books them on its own NIC's clock."""
        self.refresh()
        src, dst = self.nics[m.src], self.nics[m.dst]
        sent = at + copies * m.nbytes / src.egress
        start = max(at, self.ingress_free[m.dst])
        self.ingress_free[m.dst] = start + m.nbytes / dst.ingress
        return max(sent, self.ingress_free[m.dst]) + max(src.latency, dst.latency)

    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        """How long one message of `nbytes` takes from `src` to `dst` on idle NICs (the rule
        above without queueing; books nothing)."""
        self.refresh()
        a, b = self.nics[src], self.nics[dst]
        return nbytes / min(a.egress, b.ingress) + max(a.latency, b.latency)

    def duration(self, messages: Sequence[Message]) -> float:
        """How long `messages` take on idle NICs: the last arrival, from time 0."""
        self.refresh()
        fresh = NetworkModel(self.spec, len(self.nics))
        fresh.nics = list(self.nics)
        return max(fresh.send(messages), default=0.0)

    def _book(self, m: Message, ready: float) -> float:
        src, dst = self.nics[m.src], self.nics[m.dst]
        start = max(ready, self.egress_free[m.src], self.ingress_free[m.dst])
        end = start + m.nbytes / min(src.egress, dst.ingress)
        self.egress_free[m.src] = self.ingress_free[m.dst] = end
        return end + max(src.latency, dst.latency)
