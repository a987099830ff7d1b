"""Hop on the virtual clock: `HopCore` per worker, its decisions turned into timed messages.

Mirrors the real driver (hetsync.protocols.hop.driver): an iteration starts when the core says so
(tokens), sends its model, computes, then aggregates when the core has what it needs. Updates
are booked on the receiver's ingress with the sender's egress shared among its copies
(`SimChannel.isend`, as Hop's receiver threads book them in emulated runs); tokens are
control messages. A neighbour declared lost becomes `NeighbourLost`, as the driver's
`_on_lost` makes it; what it sent before it was lost still arrives and is fed to the core.
"""

from __future__ import annotations

from typing import Any

from hetsync.protocols.hop.core import (
    Aggregate,
    ComputeFinished,
    Drop,
    HopCore,
    NeighbourLeft,
    NeighbourLost,
    ReadyToStart,
    ReturnTokens,
    SendUpdate,
    SkipTo,
    StartIteration,
    Stopping,
    TokensReceived,
    UpdateReceived,
    Wait,
    dispatch,
)
from hetsync.simulator.channel import SimChannel
from hetsync.simulator.world import Simulation, SimWorker
from hetsync.topology import build

__all__ = ["build_workers"]


class HopWorker(SimWorker):
    def __init__(self, sim: Simulation, rank: int, core: HopCore) -> None:
        super().__init__(sim, rank)
        self.core = core
        self.peers: list[HopWorker] = []
        self.channel = SimChannel(sim, rank, lambda j: self.peers[j].receive)
        self.neighbours = sorted(set(core.in_peers) | set(core.out_peers))
        self._extra: dict[str, Any] = {}
        self._stopping = False

    def start(self) -> None:
        self._run(ReadyToStart())

    def receive(self, event: Any) -> None:
        if not self.done:
            self._run(event)

    def lost(self, rank: int) -> None:
        """`rank` was declared lost (the driver's `_on_lost`)."""
        if rank in self.neighbours:
            self.receive(NeighbourLost(rank=rank))

    def _computed(self, iteration: int) -> None:
        math = self.sim.math
        if math is not None:
            math.gradient(self.rank)
        self._stopping = self.sim.wants_stop(self.iteration + 1)  # rows, as Step.iteration
        self._run(ComputeFinished(iteration=iteration))

    def _run(self, event: Any) -> None:
        completed = False
        for decision in self.core.handle(event):
            completed |= dispatch(decision, self)
        if completed:
            self.end_iteration(**self._extra)
            self._extra = {}
            if self._stopping:
                self._leave()
            else:
                self._run(ReadyToStart())

    # --- the core's decisions (`HopDecisionHandler`): True where an iteration completes ------
    def on_send_update(self, decision: SendUpdate) -> bool:
        self.channel.isend(self, decision.to, UpdateReceived(src=self.rank, tag=decision.tag))
        if self.sim.math is not None:
            self.sim.math.publish(self.rank, decision.tag, len(decision.to))
        return False

    def on_start_iteration(self, decision: StartIteration) -> bool:
        self.unblock()
        self._extra["tag"] = decision.iteration
        self.compute(decision.iteration, self._computed, decision.iteration)
        return False

    def on_return_tokens(self, decision: ReturnTokens) -> bool:
        event = TokensReceived(src=self.rank, count=decision.count)
        for dst in decision.to:
            self.channel.control(dst, event)
        return False

    def on_aggregate(self, decision: Aggregate) -> bool:
        self.unblock()
        math = self.sim.math
        if math is not None:
            math.mix(self.rank, decision.self_weight, decision.weights, decision.inputs)
            math.step(self.rank)
        self._extra["used"] = len(decision.inputs)
        self._extra["staleness"] = decision.staleness
        return True

    def on_wait(self, decision: Wait) -> bool:
        self.block(lambda: _describe(decision))
        return False

    def on_skip_to(self, decision: SkipTo) -> bool:
        self._extra["skipped"] = decision.skipped
        if self.sim.math is not None:
            self.sim.math.mix(self.rank, decision.self_weight, decision.weights, decision.inputs)
        return False

    def on_drop(self, decision: Drop) -> bool:
        if self.sim.math is not None:
            self.sim.math.drop(decision.src, decision.tags)
        return False

    def _leave(self) -> None:
        for decision in self.core.handle(Stopping()):
            dispatch(decision, self)
        event = NeighbourLeft(rank=self.rank)
        for peer in self.neighbours:
            self.channel.control(peer, event)
        self.finish()


def _describe(wait: Wait) -> str:
    wanted = [f"rank {src}'s update {tag}" for src, tag in wait.updates.items()]
    return ", ".join(wanted + [f"rank {src}'s token" for src in wait.tokens])


def build_workers(sim: Simulation) -> list[SimWorker]:
    config = sim.config
    topology = build(config.topology, config.workers, config.weights)
    hop = config.hop_config(topology)
    workers = [HopWorker(sim, rank, HopCore.of_run(topology, rank, hop))
               for rank in range(config.workers)]
    for worker in workers:
        worker.peers = workers
        sim.subscribe(worker.lost, worker.rank)
    return list(workers)
