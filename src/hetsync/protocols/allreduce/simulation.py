"""All-Reduce (and DDP) on the virtual clock: `AllReduceWorker` per rank, `AllReduceRound` as
the collective.

Each worker computes, then contributes to the iteration's collective and blocks; the round's
core says when every worker has contributed, and the collective is then a ring all-reduce of
the payload (`Collectives.all_reduce`), after which every worker gets the vote count and its
core says whether to stop. DDP overlaps its bucketed all-reduces with the backward pass; on an
emulated step time the backward pass is the padding at its end, so it is simulated as one
collective after the compute, as All-Reduce.
"""

from __future__ import annotations

from hetsync.protocols.allreduce.core import (
    AllReduceRound,
    AllReduceWorker,
    Contributed,
    Decision,
    Finish,
    GradientsReady,
    Reduce,
    Reduced,
    dispatch,
)
from hetsync.simulator.channel import Collectives
from hetsync.simulator.world import Simulation, SimWorker

__all__ = ["build_workers"]


class Collective:
    """One collective per iteration across all workers; `AllReduceRound` says when it is
    complete."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.round = AllReduceRound(sim.world)
        self.collectives = Collectives(sim)
        self.workers: list[AllReduceSimWorker] = []

    def contribute(self, rank: int, reduce: Reduce) -> None:
        event = Contributed(rank=rank, iteration=reduce.iteration, vote=reduce.vote)
        for completed in self.round.handle(event):
            if self.sim.math is not None:
                self.sim.math.average_gradients(range(self.sim.world))
            reduced = Reduced(iteration=completed.iteration, votes=completed.votes)
            self.collectives.all_reduce(self.workers, AllReduceSimWorker.reduced, reduced)


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
        self._run(self.core.handle(event))

    def reduced(self, event: Reduced) -> None:
        self.unblock()
        self._run(self.core.handle(event))

    def _run(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            dispatch(decision, self)

    # --- the core's decisions (`AllReduceDecisionHandler`) ---------------------------------
    def on_reduce(self, decision: Reduce) -> None:
        self.block(lambda: f"the all-reduce of iteration {decision.iteration}")
        self.collective.contribute(self.rank, decision)

    def on_finish(self, decision: Finish) -> None:
        if self.sim.math is not None:
            self.sim.math.step(self.rank)
        self.end_iteration_then(decision.iteration, decision.stop, self._computed)


def build_workers(sim: Simulation) -> list[SimWorker]:
    collective = Collective(sim)
    workers = [AllReduceSimWorker(sim, r, collective) for r in range(sim.world)]
    collective.workers = workers
    return list(workers)
