"""Local SGD (and DiLoCo) on the virtual clock: `LocalSGDWorker` per rank, All-Reduce's
`AllReduceRound` as the collective of each round.

Each worker computes, steps, and asks its core: a local step ends the iteration at once; a
round's step contributes to the round's collective and blocks until every worker has, after
which the collective is a ring all-reduce of the payload (`Collectives.all_reduce`) and every
worker gets the sums of the votes and of `moved`, as the all-reduce's last two words carry
them. With `--math` the round's first `Finish` sets every worker's model to the mean, or with
DiLoCo to `outer_nesterov` of each worker's anchor (all equal in a real run; the fuzz starts
every worker from its own model, and each then keeps its own anchor and outer momentum, as a
real worker would).
"""

from __future__ import annotations

import torch

from hetsync.protocols.allreduce.core import AllReduceRound, Contributed
from hetsync.protocols.localsgd.core import (
    Average,
    Averaged,
    Decision,
    Finish,
    LocalSGDWorker,
    StepDone,
    dispatch,
    outer_nesterov,
)
from hetsync.simulator.channel import Collectives
from hetsync.simulator.world import Simulation, SimWorker

__all__ = ["build_workers"]


class Rounds:
    """The workers' rounds, one collective each; `AllReduceRound` says when one is complete
    (its iterations are the rounds' numbers)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.collective = AllReduceRound(sim.world)
        self.collectives = Collectives(sim)
        self.workers: list[LocalSGDSimWorker] = []
        self._moved = 0  # the open round's sum of `moved`, as the all-reduce sums it
        self._averaged = 0  # the last round whose models were averaged (`--math`)
        self.outer = sim.config.outer_optimizer == "nesterov"
        self.anchors: torch.Tensor | None = None
        """DiLoCo with `--math`: each worker's anchor (a row each), and its outer momentum."""
        self.buffers: torch.Tensor | None = None

    def begin(self) -> None:
        """DiLoCo with `--math`: take the anchors before any worker's first step."""
        if self.outer and self.sim.math is not None and self.anchors is None:
            self.anchors = self.sim.math.x.clone()
            self.buffers = torch.zeros_like(self.anchors)

    def contribute(self, rank: int, average: Average) -> None:
        self._moved += average.moved
        event = Contributed(rank=rank, iteration=average.round, vote=average.vote)
        for completed in self.collective.handle(event):
            averaged = Averaged(round=completed.iteration, votes=completed.votes,
                                moved=self._moved)
            self._moved = 0
            self.collectives.all_reduce(self.workers, LocalSGDSimWorker.averaged, averaged)

    def average(self, round_: int, outer_step: bool) -> None:
        """With `--math`, at the first `Finish` of round `round_` (every worker's is the same,
        and all come before any worker computes on): every model becomes the mean, or DiLoCo's
        outer step from it."""
        if self.sim.math is None or round_ == self._averaged:
            return
        self._averaged = round_
        x = self.sim.math.x
        mean = x.mean(0)
        if self.anchors is None or self.buffers is None or not outer_step:
            x[:] = mean
            return
        config = self.sim.config
        x[:] = outer_nesterov(self.anchors, mean, self.buffers, config.outer_lr,
                              config.outer_momentum)
        self.anchors.copy_(x)


class LocalSGDSimWorker(SimWorker):
    def __init__(self, sim: Simulation, rank: int, rounds: Rounds) -> None:
        super().__init__(sim, rank)
        self.core = LocalSGDWorker(rank, sim.world, sim.config.local_steps, sim.max_iterations)
        self.rounds = rounds
        self._round: int | None = None  # the round just averaged, for its `Finish`

    def start(self) -> None:
        self.compute(1, self._computed, 1)

    def _computed(self, iteration: int) -> None:
        math = self.sim.math
        if math is not None:
            self.rounds.begin()
            math.gradient(self.rank)
            math.step(self.rank)
        event = StepDone(iteration=iteration, wants_stop=self.sim.wants_stop(iteration))
        self._run(self.core.handle(event))

    def averaged(self, event: Averaged) -> None:
        self.unblock()
        self._round = event.round
        self._run(self.core.handle(event))

    def _run(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            dispatch(decision, self)

    # --- the core's decisions (`LocalSGDDecisionHandler`) ----------------------------------
    def on_average(self, decision: Average) -> None:
        self.block(lambda: f"the average of round {decision.round}")
        self.rounds.contribute(self.rank, decision)

    def on_finish(self, decision: Finish) -> None:
        round_, self._round = self._round, None
        if round_ is not None:
            self.rounds.average(round_, decision.outer_step)
        self.end_iteration_then(decision.iteration, decision.stop, self._computed)


def build_workers(sim: Simulation) -> list[SimWorker]:
    rounds = Rounds(sim)
    workers = [LocalSGDSimWorker(sim, r, rounds) for r in range(sim.world)]
    rounds.workers = workers
    return list(workers)
