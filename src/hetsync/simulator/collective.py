"""The end of a ring all-reduce across every worker, as All-Reduce's and Local SGD's
simulations cost it.

Every NIC is idle when such a collective starts (nothing else is sent in those runs), so its
duration is the network model's for idle NICs, computed once: 2(n-1)n messages per collective
would cost seconds at 1024 workers. Each worker is charged that time and its ring share of
the bytes, and hears the result when the collective ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from hetsync.network.patterns import ring_allreduce
from hetsync.simulator.world import Simulation, SimWorker

__all__ = ["RingAllReduce"]

W = TypeVar("W", bound=SimWorker)
E = TypeVar("E")


class RingAllReduce:
    """Ring all-reduces of the payload across all of `sim`'s workers."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._duration: float | None = None
        self._epoch = -1  # the network's, when `_duration` was modelled

    def end(self, workers: Sequence[W], receive: Callable[[W, E], None], result: E) -> None:
        """The last contribution is in: charge each of `workers` and call `receive(worker,
        result)` when the collective ends."""
        sim = self.sim
        network = sim.costs.network
        network.refresh()
        if self._duration is None or self._epoch != network.epoch:  # (a link slowed down)
            messages = ring_allreduce(range(sim.world), sim.costs.payload_bytes)
            self._duration = network.duration(messages)
            self._epoch = network.epoch
        now = sim.clock.now
        end = now + self._duration
        nbytes = 2 * (sim.world - 1) / sim.world * sim.costs.payload_bytes
        for worker in workers:
            worker.charge(network_s=end - now, nbytes=nbytes)
            sim.clock.at(end, receive, worker, result)
