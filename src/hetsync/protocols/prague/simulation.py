"""Prague on the virtual clock: `PragueWorkerCore` per worker, `GroupGeneratorCore` behind a
single-server queue on rank 0, and P-Reduces booked on the network model.

Mirrors the real driver (hetsync.protocols.prague.driver): after its step a worker follows its core
(request a group, run queued P-Reduces in the global order, start the next step). The Group
Generator serves one message at a time, each taking its service time (`costs.SERVICE_S`), so
its queue grows where requests come faster than it answers; with the ready policy its timer
fires `ready_wait` after the last message it served, as the real thread's timed `get` does.
A P-Reduce starts when its last member reaches it and costs the messages of the P-Reduce kind
the real run would choose (`--preduce`), on the shared NIC clocks. The static schedule has no
Group Generator: each step's partition comes from `static_group`, and the stop step is agreed
through a shared value that plays the control store.

With `--overlap` the core's decisions say the same as in the real run: a P-Reduce runs beside
the compute (the worker blocks only where its core returned no step to start), and
`MergeModels` folds the averaged copy into the model (`MathModel.merge`).

A worker declared lost reaches the Group Generator as `WorkerLost`, through its queue as the
real driver's watcher puts it there; its messages served afterwards no longer count. A group
it was in finishes over the survivors (`PReducer.average_surviving`, the mesh P-Reduce that
real runs use under `--on-failure continue`): its buffer counts if it had joined the P-Reduce
before it was lost, and the survivors wait for its declaration if it had not. Unlike a real
run, where a buffer in flight may reach some members and not others, the survivors here
agree on whom they averaged over.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Any

from hetsync.protocols.prague.group_generator import (
    GroupFinished,
    GroupGeneratorCore,
    GroupRequested,
    WaitTimedOut,
    WorkerLost,
)
from hetsync.protocols.prague.options import group_generator
from hetsync.protocols.prague.preduce import make_preducer
from hetsync.protocols.prague.static_schedule import StaticStop, static_group, static_schedule
from hetsync.protocols.prague.worker import (
    Decision,
    GroupAssigned,
    MergeModels,
    PragueWorkerCore,
    PReduceFinished,
    ReportFinished,
    RequestGroup,
    RunPReduce,
    StartStep,
    StepFinished,
    StopTraining,
    dispatch,
)
from hetsync.simulator.channel import Collectives, SimChannel
from hetsync.simulator.costs import Server
from hetsync.simulator.world import Simulation, SimWorker

__all__ = ["build_workers"]


class Rendezvous:
    """P-Reduces by key: each starts when its last member arrives, or its last survivor once
    the lost ones are declared lost, and ends for all at once."""

    def __init__(self, sim: Simulation, copies: bool = False) -> None:
        self.sim = sim
        self.copies = copies  # overlap: the P-Reduces average the copies
        kind = sim.config.preduce if sim.config.on_failure == "stop" else "mesh"  # as the driver
        self.preducer = make_preducer(kind if kind != "subgroup" else "mesh", 0, sim.world,
                                      network=sim.costs.network)
        self.collectives = Collectives(sim)
        self._arrived: dict[object, tuple[tuple[int, ...], list[PragueWorker]]] = {}

    def join(self, key: object, members: tuple[int, ...], worker: PragueWorker) -> None:
        arrived = self._arrived.setdefault(key, (members, []))[1]
        arrived.append(worker)
        if len(arrived) == len(members) or (self.sim.declared and self._without_lost(key)):
            self._run(key)

    def lost(self, rank: int) -> None:
        """`rank` was declared lost: its groups' survivors no longer wait for it."""
        for key in [key for key, (members, _) in self._arrived.items() if rank in members]:
            if self._without_lost(key):
                self._run(key)

    def _without_lost(self, key: object) -> bool:
        """Whether every member of `key` missing is declared lost."""
        members, arrived = self._arrived[key]
        here = {w.rank for w in arrived}
        return all(m in here or m in self.sim.declared for m in members)

    def _run(self, key: object) -> None:
        arrived = self._arrived.pop(key)[1]
        members = tuple(sorted(w.rank for w in arrived))  # whose buffers it averages
        math = self.sim.math
        if math is not None:
            if self.copies:
                math.average_copies(members)
            else:
                math.average(members)
        self.collectives.collective(arrived, functools.partial(self.preducer.messages, members),
                                    len(members) - 1, PragueWorker.preduced, key)


class GroupGeneratorService:
    """Rank 0's Group Generator thread: a FIFO server around the core."""

    def __init__(self, sim: Simulation, core: GroupGeneratorCore) -> None:
        self.sim, self.core = sim, core
        self.server = Server(sim.service_s["group-generator"])
        sim.services["group_generator"] = self.server
        self.workers: list[PragueWorker] = []
        self.channel = SimChannel(sim, 0, lambda j: self.workers[j].receive)
        self.ready_wait = sim.config.ready_wait / 1000.0 if core.policy == "ready" else None
        self._timer = 0

    def receive(self, *events: Any) -> None:
        """One message: its events (a request may carry a group finished before it)."""
        self.sim.clock.at(self.server.admit(self.sim.clock.now), self._serve, events)

    def lost(self, rank: int) -> None:
        """`rank` was declared lost: the watcher puts it in the generator's queue."""
        self.receive(WorkerLost(rank=rank))

    def _serve(self, events: tuple[Any, ...]) -> None:
        for event in events:  # the core drops what a lost worker sent before
            self._send(self.core.handle(event))

    def _expired(self, timer: int) -> None:
        if timer == self._timer and self.core.waiting:
            self._send(self.core.handle(WaitTimedOut()))

    def _send(self, assignments: list[Any]) -> None:
        clock = self.sim.clock
        for assign in assignments:
            message = GroupAssigned(group=assign.group, answers_request=assign.answers_request)
            self.channel.control(assign.rank, message)
        if self.ready_wait is not None:
            self._timer += 1
            if self.core.waiting:
                clock.after(self.ready_wait, self._expired, self._timer)


class PragueWorker(SimWorker):
    def __init__(self, sim: Simulation, rank: int, rendezvous: Rendezvous,
                 gg: GroupGeneratorService | None, stop: StaticStop | None,
                 period: list[Any] | None = None) -> None:
        super().__init__(sim, rank)
        self.rendezvous, self.gg, self.stop, self.period = rendezvous, gg, stop, period
        self.channel = SimChannel(sim, rank, self._to_group_generator)
        self.core = PragueWorkerCore.of_run(sim.config, rank, sim.world)
        self.overlap = self.core.overlap
        self._static_groups: dict[int, tuple[int, ...]] = {}
        """This worker's group at each place of the period (`static_group` is pure)."""
        self._pending: list[Decision] = []
        """Decisions that wait for the P-Reduce running (without overlap)."""
        self._todo: deque[Decision] = deque()  # the decisions `_run` carries out
        self._groups: list[list[int]] = []
        self._step = 1

    def start(self) -> None:
        self.compute(1, self._stepped, 1)

    def _stepped(self, iteration: int) -> None:
        math = self.sim.math
        if math is not None:
            math.gradient(self.rank)
            math.step(self.rank)
        wants_stop = self.sim.wants_stop(iteration)
        if self.gg is None:
            self._static(iteration, wants_stop)
            return
        decisions = self.core.handle(StepFinished(iteration=iteration, last=wants_stop))
        if self.overlap and not any(isinstance(d, (StartStep, StopTraining)) for d in decisions):
            self.block("the group of its previous request")
        self._run(decisions)

    # --- random groups ---------------------------------------------------------------------
    def _to_group_generator(self, rank: int) -> Callable[..., None]:
        """Where this worker's control messages go: the Group Generator's queue on rank 0."""
        assert self.gg is not None
        return self.gg.receive

    def receive(self, message: GroupAssigned) -> None:
        self._run(self.core.handle(message))

    def _run(self, decisions: list[Decision]) -> None:
        todo = self._todo = deque(decisions)
        while todo:
            dispatch(todo.popleft(), self)

    # --- the core's decisions (`PragueDecisionHandler`) ------------------------------------
    def on_request_group(self, decision: RequestGroup) -> None:
        assert self.gg is not None
        event = GroupRequested(rank=self.rank, iteration=decision.iteration, last=decision.last)
        finished = () if decision.finished is None else (
            GroupFinished(group_id=decision.finished, rank=self.rank),)
        self.channel.control(0, *finished, event)
        if not self.overlap:
            self.block("the Group Generator's answer")

    def on_report_finished(self, decision: ReportFinished) -> None:
        assert self.gg is not None
        event = GroupFinished(group_id=decision.group_id, rank=self.rank)
        self.channel.control(0, event)

    def on_merge_models(self, decision: MergeModels) -> None:
        if self.sim.math is not None:
            self.sim.math.merge(self.rank)

    def on_run_preduce(self, decision: RunPReduce) -> None:
        """A group of one is done at once; a P-Reduce runs beside the compute (overlap: the
        decisions go on) or holds the rest of them until it ends (`preduced`)."""
        group = decision.group
        self._groups.append([group.id, *group.members])
        if len(group.members) == 1:
            self._todo.extend(self.core.handle(PReduceFinished(group_id=group.id)))
            return
        if not self.overlap:
            self._pending = list(self._todo)
            self._todo.clear()
            self.block(lambda g=group: f"the P-Reduce of group {g.id} {list(g.members)}")
        self.rendezvous.join(group.id, group.members, self)

    def on_start_step(self, decision: StartStep) -> None:
        self._end_step()
        self.compute(decision.iteration, self._stepped, decision.iteration)

    def on_stop_training(self, decision: StopTraining) -> None:
        self._end_step()
        self.finish()

    def preduced(self, key: object) -> None:
        if self.gg is None:
            self._static_done(key)
            return
        group_id = key
        assert isinstance(group_id, int)
        decisions, self._pending = self._pending, []
        self._run(decisions + self.core.handle(PReduceFinished(group_id=group_id)))

    def _end_step(self) -> None:
        self.unblock()
        self.end_iteration(groups=self._groups)
        self._groups = []

    # --- the static schedule ---------------------------------------------------------------
    def _static(self, iteration: int, wants_stop: bool) -> None:
        stop = self.stop
        assert stop is not None
        proposal = stop.proposal(iteration, wants_stop)
        shared = self.sim.services
        if proposal is not None:
            stop.learn(shared.setdefault("static_stop", proposal), iteration)
        elif stop.needs_news(iteration) and "static_stop" in shared:
            stop.learn(shared["static_stop"], iteration)
        assert self.period is not None
        place = iteration % len(self.period)
        members = self._static_groups.get(place)
        if members is None:
            members = self._static_groups[place] = static_group(self.period, iteration,
                                                                self.rank)
        self._groups.append([iteration, *members])
        self._step = iteration
        if len(members) == 1:
            self._static_done((iteration, members))
            return
        self.block(lambda: f"the P-Reduce of step {iteration} with {list(members)}")
        self.rendezvous.join((iteration, members), members, self)

    def _static_done(self, key: Any) -> None:
        assert self.stop is not None
        self._end_step()
        if self.stop.stops_after(self._step):
            self.finish()
        else:
            self.compute(self._step + 1, self._stepped, self._step + 1)


def build_workers(sim: Simulation) -> list[SimWorker]:
    config = sim.config
    rendezvous = Rendezvous(sim, copies=config.overlap and config.schedule != "static")
    if config.schedule == "static":
        period = static_schedule(sim.world, config.workers_per_node)
        lead = len(period) * sim.world
        return [PragueWorker(sim, r, rendezvous, None, StaticStop(lead, config.max_iterations),
                             period) for r in range(sim.world)]
    gg = GroupGeneratorService(sim, group_generator(config))
    workers = [PragueWorker(sim, r, rendezvous, gg, None) for r in range(sim.world)]
    gg.workers = workers
    sim.subscribe(gg.lost, 0)
    sim.subscribe(rendezvous.lost)
    return list(workers)
