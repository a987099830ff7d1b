"""The channel's twin on the virtual clock: every duty of a simulated message.

A protocol's simulation turns its core's decisions into these operations and does nothing
else with a message, as its real driver does with `hetsync.transport.channel.Channel`: the
operation charges the network model from its own message pattern (`hetsync.network.patterns`),
counts the bytes this worker sent in its row, and schedules the arrival on the clock, where a
message to a worker lost by then does nothing (`Simulation.deliver`, which also applies the
fuzz's jitter). Payload-sized messages weigh `Costs.payload_bytes` (`--payload` or the model,
times the codec's ratio); control messages (a request, a token, a goodbye) only their latency.

`SimChannel` is one worker's traffic of one kind, bound to where its messages land (`inbox`);
`Collectives` is the workers' collectives, which end for all their members at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hetsync.network.model import Message
from hetsync.network.patterns import fan_out, ring_allreduce
from hetsync.simulator.world import Simulation, SimWorker

__all__ = ["Collectives", "Pattern", "SimChannel"]

W = TypeVar("W", bound=SimWorker)

Pattern = Callable[[float], Sequence[Message]]
"""An operation's messages given the size of its buffer (`hetsync.network.patterns`)."""

Inbox = Callable[[int], Callable[..., None]]
"""What handles a message to rank j on arrival (a worker's receive, a service's queue)."""


class SimChannel:
    """Worker `rank`'s traffic of one kind, its messages handled by `inbox(dst)`; see the
    module doc. Operations that take a `step` count the bytes in that worker's row (None: a
    serving thread's message, counted in no row, as a real one is not)."""

    def __init__(self, sim: Simulation, rank: int, inbox: Inbox) -> None:
        self.sim = sim
        self.rank = rank
        self.inbox = inbox

    def count(self, step: SimWorker | None, nbytes: float) -> None:
        """Count `nbytes` as sent by `step`'s worker in its iteration (None: in no row)."""
        if step is not None:
            step.charge(nbytes=nbytes)

    def send(self, step: SimWorker | None, dst: int, *event: Any) -> float:
        """A payload-sized message to `dst` sent now (a push, a request, a reply): handled
        as `inbox(dst)(*event)` on arrival; a worker's message to itself crosses no network.
        Returns its arrival as the network model books it."""
        sim = self.sim
        now = sim.clock.now
        payload = sim.costs.payload_bytes
        arrival = now if dst == self.rank else sim.costs.network.send(
            [Message(self.rank, dst, payload)], at=now)[0]
        sim.deliver(self.rank, dst, arrival, self.inbox(dst), *event)
        self.count(step, payload)
        return arrival

    def busy_with(self, arrival: float, then: Callable[..., None], *args: Any) -> None:
        """A serving thread that sent a message arriving at `arrival` is busy until it has
        left this worker's NIC (its arrival less the latency): `then(*args)` runs then."""
        sim = self.sim
        sent = arrival - sim.costs.network.nics[self.rank].latency
        sim.at(self.rank, sent, then, *args)

    def post(self, step: SimWorker | None, to: Sequence[int], *event: Any) -> list[float]:
        """A payload-sized message to each of `to`, posted together now and booked as one
        fan-out on the network model (D-PSGD's exchange, a server's answers); each handled
        as `inbox(dst)(*event)` on arrival. Returns their arrivals."""
        sim = self.sim
        payload = sim.costs.payload_bytes
        arrivals = sim.costs.network.send(fan_out(self.rank, to, payload), at=sim.clock.now)
        for dst, arrival in zip(to, arrivals, strict=True):
            sim.deliver(self.rank, dst, arrival, self.inbox(dst), *event)
        self.count(step, payload * len(to))
        return arrivals

    def isend(self, step: SimWorker | None, to: Sequence[int], *event: Any) -> None:
        """A payload-sized message to each of `to`, each copy booked at its receiver's ingress
        with this worker's egress shared among the copies (`NetworkModel.deliver`: as Hop's
        receiving threads book what they receive, the real channel's `arrive`)."""
        sim = self.sim
        network, payload, now = sim.costs.network, sim.costs.payload_bytes, sim.clock.now
        copies = len(to)
        for dst in to:
            arrival = network.deliver(Message(self.rank, dst, payload), now, copies)
            sim.deliver(self.rank, dst, arrival, self.inbox(dst), *event)
        self.count(step, payload * copies)

    def hand_over(self, at: float, *event: Any) -> None:
        """A message to this worker's own side (a service's answer to its host), handed over
        in-process at `at`: handled as `inbox(rank)(*event)`."""
        self.sim.deliver(self.rank, self.rank, at, self.inbox(self.rank), *event)

    def control(self, dst: int, *event: Any) -> None:
        """A control message (a request, a token, a goodbye) to `dst`, sent now: it costs its
        latency; handled as `inbox(dst)(*event)` on arrival."""
        sim = self.sim
        sim.deliver(self.rank, dst, sim.clock.now + sim.costs.latency(self.rank, dst),
                    self.inbox(dst), *event)


class Collectives:
    """The workers' collectives in `sim`: each ends for all its members at once, which are
    charged its modelled time and their share of its bytes, and hear of it then."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._ring_s: float | None = None
        self._epoch = -1  # the network's, when `_ring_s` was modelled

    def all_reduce(self, workers: Sequence[W], receive: Callable[..., None],
                   *args: Any) -> None:
        """A ring all-reduce of the payload across every worker, whose last contribution is
        in: `receive(worker, *args)` for each of `workers` when it ends. Every NIC is idle when
        one starts (nothing else is sent in the runs that use it), so its duration is the
        network model's for idle NICs, computed once: 2(n-1)n messages per collective would
        cost seconds at 1024 workers."""
        sim = self.sim
        network = sim.costs.network
        network.refresh()
        if self._ring_s is None or self._epoch != network.epoch:  # (a link slowed down)
            self._ring_s = network.duration(ring_allreduce(range(sim.world),
                                                           sim.costs.payload_bytes))
            self._epoch = network.epoch
        now = sim.clock.now
        end = now + self._ring_s
        nbytes = 2 * (sim.world - 1) / sim.world * sim.costs.payload_bytes
        for worker in workers:
            worker.charge(network_s=end - now, nbytes=nbytes)
            sim.at(worker.rank, end, receive, worker, *args)

    def collective(self, members: Sequence[W], pattern: Pattern, shares: int,
                   receive: Callable[..., None], *args: Any) -> None:
        """A collective among `members` (a P-Reduce of a group), whose last member is in:
        `pattern`'s messages of the payload booked on the network model from now, each
        member charged until the last arrives and `shares` payloads sent, and
        `receive(member, *args)` for each then."""
        sim = self.sim
        payload = sim.costs.payload_bytes
        now = sim.clock.now
        end = max(sim.costs.network.send(pattern(payload), at=now), default=now)
        sent = payload * shares
        for member in members:
            member.charge(network_s=end - now, nbytes=sent)
            sim.at(member.rank, end, receive, member, *args)
