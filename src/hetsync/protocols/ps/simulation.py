"""The parameter server on the virtual clock: `PSWorkerCore` per worker, `PSServerCore` behind a
single-server queue on rank 0.

Each worker computes, pushes its gradient to rank 0 (a payload-sized message on the network
model, so pushes queue at rank 0's ingress: the incast) and blocks until the reply. The server
thread takes pushes in arrival order, each for its service time; its core decides what is
accumulated, applied and answered, and every answer is a payload-sized message from rank 0
(queueing at its egress). Rank 0's own pushes and replies do not cross the network; its reply
comes once the remote ones of the same answer have arrived, as in the driver.

A worker declared lost becomes `WorkerLost`, as the driver's `_on_lost` makes it: rounds
stop waiting for it, and a push of its served afterwards no longer counts.
"""

from __future__ import annotations

from typing import Any

from hetsync.protocols.ps.core import (
    Accumulate,
    Answer,
    Apply,
    Bye,
    GradientReady,
    Leave,
    LoadModel,
    PSServerCore,
    PSWorkerCore,
    Push,
    ReplyReceived,
    SendBye,
    SendPush,
    WorkerDecision,
    WorkerLost,
    dispatch_server,
    dispatch_worker,
)
from hetsync.simulator.channel import SimChannel
from hetsync.simulator.costs import Server
from hetsync.simulator.world import Simulation, SimWorker

__all__ = ["build_workers"]


class ServerThread:
    """Rank 0's serving thread: a FIFO server around `PSServerCore`."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.core = PSServerCore.of_run(sim.config, sim.world)
        self.server = Server(sim.service_s["parameter-server"])
        sim.services["parameter_server"] = self.server
        self.workers: list[PSSimWorker] = []
        self.channel = SimChannel(sim, 0, lambda j: self.workers[j].reply)

    def receive(self, event: Any) -> None:
        self.sim.clock.at(self.server.admit(self.sim.clock.now), self._serve, event)

    def lost(self, rank: int) -> None:
        """`rank` was declared lost (the driver's `_on_lost`)."""
        self._decide(WorkerLost(rank=rank))

    def _serve(self, event: Push | Bye) -> None:
        self._decide(event)  # the core drops what a lost worker sent before its loss

    def _decide(self, event: Push | Bye | WorkerLost) -> None:
        for decision in self.core.handle(event):
            dispatch_server(decision, self)

    # --- the core's decisions (`ServerDecisionHandler`) -----------------------------------
    def on_accumulate(self, decision: Accumulate) -> None:
        if self.sim.math is not None:
            self.sim.math.accumulate(decision.rank)

    def on_apply(self, decision: Apply) -> None:
        if self.sim.math is not None:
            self.sim.math.apply(decision.divisor, decision.lr_scale)

    def on_answer(self, decision: Answer) -> None:
        math = self.sim.math
        reply = ReplyReceived(version=decision.version, staleness=decision.staleness,
                              stop=decision.stop)
        if math is not None:
            for rank in decision.ranks:
                math.load_server(rank)  # the worker waits: nothing changes it meanwhile
        # Remote ranks first; rank 0 takes its reply once they have theirs, as the driver's
        # server hands it over after sending them (`_Server._send`).
        arrivals = self.channel.post(None, [rank for rank in decision.ranks if rank != 0], reply)
        if 0 in decision.ranks:
            self.channel.hand_over(max([self.sim.clock.now, *arrivals]), reply)


class PSSimWorker(SimWorker):
    def __init__(self, sim: Simulation, rank: int, server: ServerThread) -> None:
        super().__init__(sim, rank)
        self.core = PSWorkerCore.of_run(sim.config, rank)
        self.server = server
        self.channel = SimChannel(sim, rank, lambda j: server.receive)

    def start(self) -> None:
        self.compute(1, self._computed, 1)

    def _computed(self, iteration: int) -> None:
        sim = self.sim
        if sim.math is not None:
            sim.math.gradient(self.rank)
        event = GradientReady(iteration=iteration, wants_stop=sim.wants_stop(iteration))
        self._run(self.core.handle(event))

    def reply(self, event: ReplyReceived) -> None:
        self.unblock()
        self._run(self.core.handle(event))

    def _run(self, decisions: list[WorkerDecision]) -> None:
        for decision in decisions:
            dispatch_worker(decision, self)

    # --- the core's decisions (`WorkerDecisionHandler`) -----------------------------------
    def on_send_push(self, decision: SendPush) -> None:
        self.channel.send(self, 0, Push(rank=self.rank, version=decision.version,
                                        vote=decision.vote))
        self.block("the parameter server's reply")

    def on_load_model(self, decision: LoadModel) -> None:
        extra = {"staleness": decision.staleness}
        if decision.dropped is not None:
            extra["dropped"] = int(decision.dropped)
        self.end_iteration(**extra)
        if decision.stop:
            self._run(self.core.handle(Leave()))
            self.finish()
        else:
            self.compute(decision.iteration + 1, self._computed, decision.iteration + 1)

    def on_send_bye(self, decision: SendBye) -> None:
        self.channel.control(0, Bye(rank=self.rank))


def build_workers(sim: Simulation) -> list[SimWorker]:
    server = ServerThread(sim)
    workers = [PSSimWorker(sim, r, server) for r in range(sim.world)]
    server.workers = workers
    sim.subscribe(server.lost, 0)
    return list(workers)
