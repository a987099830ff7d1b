"""AD-PSGD on the virtual clock: `ADPSGDCore` per worker, both its sides (trainer and server).

An active worker's request is sent when its iteration starts (overlapping the compute, as the
real driver posts it): a payload-sized message to the partner the core drew. The partner's
core serves requests one at a time under its model lock; the serving thread is busy until its
reply has left its NIC, and only then takes the next request, as the real receiver thread,
which sends each reply before receiving the next request. A trainer whose compute ends before
its reply (or whose step waits for its lock) is blocked until the core grants what it needs.
In naive mode two workers that request each other wait forever: the event queue runs dry and
the simulation reports the deadlock with each worker's wait.

A worker declared lost becomes `PeerLost` on every survivor, and `ReplyLost` on one whose
request awaits its reply with none on the way (the real driver's transfer with the dead
partner fails and the launcher confirms the loss); a request or a goodbye from it arriving
afterwards goes to the core, which drops it, as in the real driver.
"""

from __future__ import annotations

from typing import Any

from hetsync.protocols.adpsgd.core import (
    ADPSGDCore,
    ByeReceived,
    ComputeFinished,
    Decision,
    Finish,
    IterationStarted,
    Leave,
    LoadAverage,
    PeerLost,
    ReplyLost,
    ReplyReceived,
    RequestReceived,
    SendBye,
    SendRequest,
    Serve,
    Served,
    ServerDone,
    StepFinished,
    StepGranted,
    dispatch,
)
from hetsync.simulator.channel import SimChannel
from hetsync.simulator.world import Simulation, SimWorker
from hetsync.topology import build

__all__ = ["build_workers"]


class ADPSGDSimWorker(SimWorker):
    def __init__(self, sim: Simulation, rank: int, core: ADPSGDCore) -> None:
        super().__init__(sim, rank)
        self.core = core
        self.peers: list[ADPSGDSimWorker] = []
        self.channel = SimChannel(sim, rank, lambda j: self.peers[j].receive)
        self._reply: dict[int, Any] = {}  # the average a partner's reply carries (--math)
        self._partner: int | None = None
        self._left = False
        self._server_done = not (core.passive and core.clients)
        self._answered: set[int] = set()
        """Partners whose reply to this worker was sent, until it is loaded."""

    def start(self) -> None:
        self._begin(1)

    def receive(self, event: Any) -> None:
        self._run(self.core.handle(event))  # the core drops what a client lost before sent

    def lost(self, rank: int) -> None:
        """`rank` was declared lost (the driver's `_on_lost`, then its failed transfer)."""
        if self.done:
            return
        self.receive(PeerLost(rank=rank))
        if self.core.awaiting_reply_from == rank and rank not in self._answered:
            self.receive(ReplyLost(src=rank))

    def _begin(self, iteration: int) -> None:
        if self.sim.math is not None:
            self.sim.math.gradient(self.rank)  # on x_k, before any average, as prescribed
        self._run(self.core.handle(IterationStarted(iteration=iteration)))
        self.compute(iteration, self._computed, iteration)

    def _computed(self, iteration: int) -> None:
        decisions = self.core.handle(ComputeFinished(iteration=iteration))
        if not decisions:
            partner = self.core.awaiting_reply_from
            self.block(f"rank {partner}'s reply" if partner is not None else "its model lock")
        self._run(decisions)

    def _run(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            dispatch(decision, self)

    # --- the core's decisions (`ADPSGDDecisionHandler`) -----------------------------------
    def on_send_request(self, decision: SendRequest) -> None:
        partner = self._partner = decision.partner
        if self.sim.math is not None:
            self.sim.math.send_model(self.rank)
        self.channel.send(self, partner, RequestReceived(src=self.rank,
                                                         iteration=decision.iteration))

    def on_serve(self, decision: Serve) -> None:
        sim, client = self.sim, decision.client
        if sim.math is not None:
            self.peers[client]._reply[self.rank] = sim.math.serve(self.rank, client)
        self.peers[client]._answered.add(self.rank)
        arrival = self.channel.send(None, client, ReplyReceived(src=self.rank))
        self.channel.busy_with(arrival, self.receive, Served(src=client))

    def on_load_average(self, decision: LoadAverage) -> None:
        self._answered.discard(decision.partner)
        if self.sim.math is not None:
            self.sim.math.load(self.rank, self._reply.pop(decision.partner))

    def on_step_granted(self, decision: StepGranted) -> None:
        self.unblock()
        if self.sim.math is not None:
            self.sim.math.step(self.rank)
        k = decision.iteration
        self._run(self.core.handle(StepFinished(iteration=k, wants_stop=self.sim.wants_stop(k))))

    def on_finish(self, decision: Finish) -> None:
        self.end_iteration(partner=self._partner if self._partner is not None else -1)
        self._partner = None
        if decision.stop:
            self._left = True
            self._run(self.core.handle(Leave()))
            self._maybe_finish()
        else:
            self._begin(decision.iteration + 1)

    def on_send_bye(self, decision: SendBye) -> None:
        for partner in decision.to:
            self.channel.control(partner, ByeReceived(src=self.rank))

    def on_server_done(self, decision: ServerDone) -> None:
        self._server_done = True
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._left and self._server_done and not self.done:
            self.finish()
        elif self._left and not self.done:
            self.block("its clients' goodbyes")


def build_workers(sim: Simulation) -> list[SimWorker]:
    config = sim.config
    topology = build(config.topology, config.workers, config.weights)
    workers = [ADPSGDSimWorker(sim, rank, ADPSGDCore.of_run(topology, rank, config.seed,
                                                            config.adpsgd_mode,
                                                            config.adpsgd_max_gap))
               for rank in range(sim.world)]
    for worker in workers:
        worker.peers = workers
        sim.subscribe(worker.lost, worker.rank)
    return list(workers)
