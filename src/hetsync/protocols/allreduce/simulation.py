"""All-Reduce (and DDP) on the virtual clock: `AllReduceWorker` per rank, `AllReduceRound` as
the collective.

Each worker computes, then contributes to the iteration's collective and blocks; the round's
core says when every worker has contributed, and the collective then costs the messages of a
ring all-reduce of the payload (`patterns.ring_allreduce`) on the network model, after which
every worker gets the vote count and its core says whether to stop. Every NIC is idle when a
collective starts (nothing else is sent in an all-reduce run), so its duration is the model's
for idle NICs, computed once: 2(n-1)n messages per collective would cost seconds at 1024
workers. DDP overlaps its bucketed all-reduces with the backward pass; on an emulated step
time the backward pass is the padding at its end, so it is simulated as one collective after
the compute, as All-Reduce.
"""

from __future__ import annotations

from hetsync.network.patterns import ring_allreduce
from hetsync.protocols.allreduce.core import (
    AllReduceRound,
    AllReduceWorker,
    Completed,
    Contributed,
    Finish,
    GradientsReady,
    Reduce,
    Reduced,
)
from hetsync.simulator.world import Simulation, SimWorker

__all__ = ["build_workers"]


class Collective:
    """One collective per iteration across all workers; `AllReduceRound` says when it is
    complete."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.round = AllReduceRound(sim.world)
        self.workers: list[AllReduceSimWorker] = []
        self._duration: float | None = None

    def contribute(self, rank: int, reduce: Reduce) -> None:
        event = Contributed(rank=rank, iteration=reduce.iteration, vote=reduce.vote)
        for completed in self.round.handle(event):
            self._run(completed)

    def _run(self, completed: Completed) -> None:
        sim = self.sim
        if self._duration is None:
            messages = ring_allreduce(range(sim.world), sim.costs.payload_bytes)
            self._duration = sim.costs.network.duration(messages)
        now = sim.clock.now
        end = now + self._duration
        if sim.math is not None:
            sim.math.average_gradients(range(sim.world))
        nbytes = 2 * (sim.world - 1) / sim.world * sim.costs.payload_bytes
        reduced = Reduced(iteration=completed.iteration, votes=completed.votes)
        for worker in self.workers:
            worker.charge(network_s=end - now, nbytes=nbytes)
            sim.clock.at(end, worker.reduced, reduced)


class AllReduceSimWorker(SimWorker):
    def __init__(self, sim: Simulation, rank: int, collective: Collective) -> None:
        super().__init__(sim, rank)
        self.core = AllReduceWorker(rank, sim.world)
        self.collective = collective

    def start(self) -> None:
        self.compute(1, self._computed, 1)

    def _computed(self, iteration: int) -> None:
        if self.sim.math is not None:
            self.sim.math.gradient(self.rank)
        event = GradientsReady(iteration=iteration, wants_stop=self.sim.wants_stop(iteration))
        for decision in self.core.handle(event):
            assert isinstance(decision, Reduce)
            self.block(lambda: f"the all-reduce of iteration {iteration}")
            self.collective.contribute(self.rank, decision)

    def reduced(self, event: Reduced) -> None:
        self.unblock()
        for decision in self.core.handle(event):
            assert isinstance(decision, Finish)
            if self.sim.math is not None:
                self.sim.math.step(self.rank)
            self.end_iteration()
            if decision.stop:
                self.finish()
            else:
                self.compute(decision.iteration + 1, self._computed, decision.iteration + 1)


def build_workers(sim: Simulation) -> list[SimWorker]:
    collective = Collective(sim)
    workers = [AllReduceSimWorker(sim, r, collective) for r in range(sim.world)]
    collective.workers = workers
    return list(workers)
