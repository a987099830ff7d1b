"""D-PSGD on the virtual clock: `DPSGDCore` per worker.

Each iteration a worker sends x_k to its out-neighbours when it starts (`SimChannel.post`: a
fan-out on the network model, overlapping the compute, as the real driver posts them), then
computes; its core says when every in-neighbour's x_k is in and the worker averages, steps and
starts the next iteration, or stops on the agreed iteration.
"""

from __future__ import annotations

from hetsync.protocols.dpsgd.core import (
    Average,
    ComputeFinished,
    Decision,
    DPSGDCore,
    Exchange,
    IterationStarted,
    ModelReceived,
    dispatch,
)
from hetsync.simulator.channel import SimChannel
from hetsync.simulator.world import Simulation, SimWorker
from hetsync.topology import build

__all__ = ["build_workers"]


class DPSGDSimWorker(SimWorker):
    def __init__(self, sim: Simulation, rank: int, core: DPSGDCore) -> None:
        super().__init__(sim, rank)
        self.core = core
        self.peers: list[DPSGDSimWorker] = []
        self.channel = SimChannel(sim, rank, lambda j: self.peers[j].receive)

    def start(self) -> None:
        self._begin(1)

    def receive(self, event: ModelReceived) -> None:
        self._run(self.core.handle(event))

    def _begin(self, iteration: int) -> None:
        self._run(self.core.handle(IterationStarted(iteration=iteration)))
        self.compute(iteration, self._computed, iteration)

    def _computed(self, iteration: int) -> None:
        sim = self.sim
        if sim.math is not None:
            sim.math.gradient(self.rank)
        event = ComputeFinished(iteration=iteration, wants_stop=sim.wants_stop(iteration))
        decisions = self.core.handle(event)
        if not decisions:
            waiting = self.core.waiting_for
            self.block(lambda: ", ".join(f"rank {j}'s model of iteration {iteration}"
                                         for j in waiting))
        self._run(decisions)

    def _run(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            dispatch(decision, self)

    # --- the core's decisions (`DPSGDDecisionHandler`) -------------------------------------
    def on_exchange(self, decision: Exchange) -> None:
        sim = self.sim
        k, to = decision.iteration, decision.send_to
        if sim.math is not None:
            sim.math.publish(self.rank, k, len(to))
        self.channel.post(self, to, ModelReceived(src=self.rank, iteration=k,
                                                  stop_at=decision.stop_at))

    def on_average(self, decision: Average) -> None:
        self.unblock()
        k, math = decision.iteration, self.sim.math
        if math is not None:
            math.mix(self.rank, decision.self_weight, decision.weights,
                     dict.fromkeys(decision.weights, k))
            for j in decision.weights:
                math.drop(j, (k,))
            math.step(self.rank)
        self.end_iteration()
        if decision.stop:
            self.finish()
        else:
            self._begin(k + 1)


def build_workers(sim: Simulation) -> list[SimWorker]:
    config = sim.config
    topology = build(config.topology, config.workers, config.weights)
    workers = [DPSGDSimWorker(sim, r, DPSGDCore.of_run(topology, r, config.max_iterations))
               for r in range(sim.world)]
    for worker in workers:
        worker.peers = workers
    return list(workers)
