"""Prague (Luo et al., ASPLOS'20): Partial All-Reduce among groups of workers.

Theory of operation. After its local step a worker averages its model with a *group* of
workers (P-Reduce, hetsync.transport.preduce), then starts its next step. Who averages with
whom comes from one of two places:

- `--schedule random` (default): the Group Generator (hetsync.protocols.prague.group_generator), a
  thread on rank 0. Rank 0 because it is a fixed, known address every worker can reach with
  point-to-point messages and the GG's work is tiny (a few microseconds per request), so it
  costs rank 0 nothing measurable. A worker that finished a step sends a request; the GG
  answers every member of the group it forms, in one global order, which each worker's
  `PragueWorkerCore` follows so that conflicting groups never deadlock. Requests, finished
  groups and goodbyes travel on one tag to rank 0's receiver thread; assignments travel back
  on another to each worker's receiver thread. Workers stop independently: a worker's last
  request is answered, and no later group contains it.
- `--schedule static`: a periodic sequence of partitions (`static_schedule`), no GG traffic
  and no conflicts; meant for homogeneous clusters. Every worker runs the same steps in
  lock-step, so all must stop after the same step: after `--max-iterations`, which
  every worker foresees, or else after a step proposed far enough ahead in the control store
  by the first worker whose other stop conditions hold (the schedule's period times the
  number of workers bounds how far apart two workers can be); every worker reads it before
  each step (`StaticStop`).

`--overlap` (random groups only): the P-Reduces run on a communication thread beside the
compute, on a copy of the model that `MergeModels` folds back in (see `PragueWorkerCore`);
the training thread only sends its request and, a step later, waits for that request's group
if it is not done yet. Every thread feeds the core under one lock and executes the decisions
it gets back (a merge, a message to the GG) under it, so the GG sees each worker's messages
in the core's order; P-Reduces go to the communication thread, steps to the training thread.

Where the time goes (rows' `extra`, seconds per iteration): `gg_wait_s` waiting for the GG's
answer, of which `gg_hold_s` the GG held the request for a group to form (ready policy);
`wake_s` from the answer's arrival on the receiving thread to the training thread running;
`preduce_s` the P-Reduces, waits for late members included; with overlap `overlap_wait_s`
the training thread's wait for the previous request's group, and `preduce_s` is the
communication thread's (not on the training thread's path).

Every wait is bounded by `--hang-timeout`, and its error names what was awaited.

Lost workers (`--on-failure continue`, hetsync.transport.lost_workers): the GG hears of each
from a watcher and puts it in no later group (`WorkerLost`); a group it was already in runs
without it, its P-Reduce averaging over the members whose buffers arrived (only ``mesh`` can
do that, so it is the P-Reduce used). Rank 0 hosts the GG: its loss ends the run.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from hetsync.metrics import strict_json
from hetsync.network.patterns import point_to_point, push_pull
from hetsync.protocols.base import Protocol, Step
from hetsync.protocols.prague.gg_wire import FromGG, ToGG
from hetsync.protocols.prague.group_generator import (
    AssignGroup,
    Group,
    GroupFinished,
    GroupGeneratorCore,
    GroupRequested,
    WaitTimedOut,
    WorkerLost,
)
from hetsync.protocols.prague.options import group_generator
from hetsync.protocols.prague.static_schedule import StaticStop, static_group, static_schedule
from hetsync.protocols.prague.worker import (
    Decision,
    GroupAssigned,
    Leave,
    MergeModels,
    PragueWorkerCore,
    PReduceFinished,
    RequestGroup,
    RunPReduce,
    StartStep,
    StepFinished,
    WorkerState,
)
from hetsync.protocols.registry import register_protocol
from hetsync.transport.flat import model_tensors
from hetsync.transport.links import Link
from hetsync.transport.lost_workers import unless_lost
from hetsync.transport.peer_streams import PeerStreams
from hetsync.transport.preduce import make_preducer
from hetsync.transport.runtime import Runtime

_TO_GG, _FROM_GG = 51, 52
_REQUEST, _FINISHED, _BYE, _LOST = 1.0, 2.0, 3.0, 4.0
_STOP_KEY = "prague/stop_at"
_Inbox = tuple[GroupAssigned, float, float] | RunPReduce | BaseException | None
"""An assignment (with when it arrived and how long the GG held its request), a P-Reduce for
the communication thread, a failure, or the end (None)."""


def _add_time(step: Step, key: str, began: float) -> None:
    """Accumulate the seconds since `began` in the row's `key` (a step may wait several times)."""
    step.extra[key] = float(step.extra.get(key, 0.0)) + time.perf_counter() - began  # type: ignore[arg-type]


@register_protocol("prague")
class Prague(Protocol):
    """Model averaging within groups: random groups from a Group Generator, or static ones."""

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        config, rank = runtime.config, runtime.rank
        self.rank, self.timeout = rank, runtime.wait_timeout
        self.tensors = model_tensors(model)
        self._gg_link = runtime.links.host  # the GG's messages, received on threads: gloo
        self.link = runtime.links.direct  # P-Reduces: known peers, on the GPU under NCCL
        kind = config.preduce if runtime.lost is None else "mesh"  # see the module doc
        self.preducer = make_preducer(kind, rank, runtime.world_size, store=runtime.store,
                                      network=self.network, link=self.link)
        self.static = config.schedule == "static"
        self.period = static_schedule(runtime.world_size, config.workers_per_node)
        self.stopping = StaticStop(len(self.period) * runtime.world_size, config.max_iterations)
        self.inbox: queue.Queue[_Inbox] = queue.Queue()
        self.overlap = config.overlap and not self.static
        self.core = PragueWorkerCore(rank, runtime.world_size, overlap=self.overlap)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # overlap: the core, the GG channel and the model
        self._resume: queue.Queue[StartStep | Leave | BaseException] = queue.Queue()
        self._comm: torch.Tensor | None = None  # overlap: the copy the P-Reduces average
        self._handed: torch.Tensor | None = None  # ... and the model it was when handed over
        self._ran: list[list[int]] = []  # overlap: groups run since the last row
        self._comm_preduce_s = 0.0
        self._sent_bytes = 0
        self._gg: _GroupGeneratorService | None = None
        if not self.static:
            if rank == 0:
                self._gg = _GroupGeneratorService(group_generator(config), self._deliver,
                                                  config.ready_wait / 1000.0, self._gg_link,
                                                  runtime, self._gg_failed)
                self._threads.append(self._gg.thread)
            elif runtime.world_size > 1:
                self._threads.append(threading.Thread(target=self._receive, daemon=True,
                                                      name="prague-assignments"))
            if self.overlap:
                self._threads.append(threading.Thread(target=self._communicate, daemon=True,
                                                      name="prague-preduce"))
        for thread in self._threads:
            thread.start()

    def after_optimizer_step(self, step: Step) -> None:
        step.begin_sync()
        if self.static:
            self._static_step(step)
        elif self.overlap:
            self._overlapped_step(step)
        else:
            self._group_step(step)

    def go_on_from(self, iteration: int) -> None:
        """The static schedule's steps count from 1 again: `--max-iterations` is K - iteration
        of them (at least one; the first step's stop conditions then hold)."""
        left = self.runtime.config.max_iterations
        if left is not None:
            self.stopping = StaticStop(self.stopping.lead, max(1, left - iteration))

    def loop_ended(self, step: Step) -> None:
        """The script's loop ended without a last step (its epochs ran out): the step begun
        ends as a last one without an update. With the GG this worker's last request is
        answered and every group it is in is run, so no member waits for it; on a static
        schedule it proposes a stop and keeps averaging (no update) until the agreed step,
        since the others may still have data."""
        step.wants_stop = True
        if self.static:
            self._static_step(step)
            while not step.stop:
                step = Step(iteration=step.iteration + 1, wants_stop=True,
                            on_phase=step.on_phase)
                self._static_step(step)
        elif self.core.state is WorkerState.COMPUTING:
            (self._overlapped_step if self.overlap else self._group_step)(step)

    # --- random groups from the Group Generator ------------------------------------------
    def _group_step(self, step: Step) -> None:
        decisions = self.core.handle(StepFinished(iteration=step.iteration, last=step.wants_stop))
        while decisions:
            decision, *decisions = decisions
            if isinstance(decision, RequestGroup):
                self._to_gg(_REQUEST, step.iteration, float(decision.last))
            elif isinstance(decision, RunPReduce):
                group = decision.group
                step.extra.setdefault("groups", []).append([group.id, *group.members])
                self._preduce(group.members, step)
                self._to_gg(_FINISHED, group.id, 0.0)
                decisions += self.core.handle(PReduceFinished(group_id=group.id))
            elif isinstance(decision, (StartStep, Leave)):
                step.stop = isinstance(decision, Leave)
                return
            if not decisions:
                decisions = self.core.handle(self._next_assignment(step))

    def _next_assignment(self, step: Step) -> GroupAssigned:
        with step.blocking():
            began = time.perf_counter()
            try:
                item = self.inbox.get(timeout=self.timeout)
            except queue.Empty:
                raise TimeoutError(f"prague: rank {self.rank} waited {self.timeout:g} s for "
                                   f"the Group Generator (rank 0) after step "
                                   f"{step.iteration}") from None
            _add_time(step, "gg_wait_s", began)
        if isinstance(item, BaseException):
            raise RuntimeError(f"prague: group messages failed: {item!r}") from item
        assigned, arrived, held = item
        if assigned.answers_request:
            step.extra["gg_hold_s"] = float(step.extra.get("gg_hold_s", 0.0)) + held  # type: ignore[arg-type]
        _add_time(step, "wake_s", max(arrived, began))
        return assigned

    # --- random groups, P-Reduces overlapped with the compute ------------------------------
    def _overlapped_step(self, step: Step) -> None:
        with self._lock:
            decisions = self.core.handle(StepFinished(iteration=step.iteration,
                                                      last=step.wants_stop))
            resume = self._execute(decisions)
        if resume is None:
            with step.blocking():
                began = time.perf_counter()
                try:
                    resume = self._resume.get(timeout=self.timeout)
                except queue.Empty:
                    raise TimeoutError(
                        f"prague: rank {self.rank} waited {self.timeout:g} s after step "
                        f"{step.iteration} for its previous group: {self._waiting_for()}"
                    ) from None
                _add_time(step, "overlap_wait_s", began)
        if isinstance(resume, BaseException):
            raise RuntimeError(f"prague: the P-Reduce thread failed: {resume!r}") from resume
        with self._lock:  # the communication thread adds to these under it
            step.extra["groups"], self._ran = self._ran, []
            step.extra["preduce_s"], self._comm_preduce_s = self._comm_preduce_s, 0.0
            step.bytes_sent += self._sent_bytes
            self._sent_bytes = 0
        step.stop = isinstance(resume, Leave)

    def _waiting_for(self) -> str:
        with self._lock:
            core = self.core
            return (f"answer {'awaited' if core.awaiting_answer else 'received'}, running "
                    f"{core.running}, queued {list(core.queued)}")

    def _execute(self, decisions: list[Decision]) -> StartStep | Leave | None:
        """Under the lock: merge and message the GG now, hand P-Reduces to the communication
        thread; the step to start (or Leave), for the training thread."""
        resume = None
        for decision in decisions:
            if isinstance(decision, MergeModels):
                self._merge()
            elif isinstance(decision, RequestGroup):
                self._to_gg(_REQUEST, decision.iteration, float(decision.last))
            elif isinstance(decision, RunPReduce):
                self.inbox.put(decision)
            else:
                assert isinstance(decision, (StartStep, Leave))
                resume = decision
        return resume

    def _merge(self) -> None:
        """x <- c + (x - s); then c = s = x (the training thread is waiting)."""
        flat = self.link.flat(self.tensors)
        if self._comm is not None and self._handed is not None:
            flat.sub_(self._handed).add_(self._comm)  # exact with lr 0
            with torch.no_grad():
                self.link.unpack_into(flat, self.tensors)
        self._comm, self._handed = flat, flat.clone()

    def _communicate(self) -> None:
        """The communication thread: feeds assignments to the core, runs the P-Reduces."""
        try:
            while self.core.state is not WorkerState.DONE:
                item = self.inbox.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, RunPReduce):
                    self._background_preduce(item.group)
                    continue
                with self._lock:
                    resume = self._execute(self.core.handle(item[0]))
                if resume is not None:
                    self._resume.put(resume)
        except BaseException as error:  # noqa: BLE001 - re-raised on the training thread
            self._resume.put(error)

    def _background_preduce(self, group: Group) -> None:
        comm = self._comm
        assert comm is not None
        began = time.perf_counter()
        members = group.members
        if len(members) > 1:
            members = self._average(comm, members)
            if self.network is not None:
                nbytes = self.network.scaled(comm.numel() * comm.element_size())
                self.network.after_blocking(None, self.preducer.messages(members, nbytes),
                                            f"preduce{len(members)}", time.perf_counter() - began)
        with self._lock:
            self._ran.append([group.id, *group.members])
            self._comm_preduce_s += time.perf_counter() - began
            self._sent_bytes += self._bytes_out(comm, members)
            self._to_gg(_FINISHED, group.id, 0.0)
            resume = self._execute(self.core.handle(PReduceFinished(group_id=group.id)))
        if resume is not None:
            self._resume.put(resume)

    def _to_gg(self, kind: float, value: int, flag: float) -> None:
        self.runtime.before_send()
        if self._gg is not None:
            self._gg.put(self.rank, kind, value, flag)
        else:
            message = ToGG(int(kind), value, flag).encode()
            self._gg_link.send(message, 0, tag=_TO_GG)

    def _deliver(self, assign: AssignGroup, held: float) -> None:
        """Rank 0's GG hands rank 0 its own assignments directly."""
        assigned = GroupAssigned(group=assign.group, answers_request=assign.answers_request)
        self.inbox.put((assigned, time.perf_counter(), held))

    def _gg_failed(self, error: BaseException) -> None:
        """Rank 0's GG failed: rank 0's threads raise it at their next wait, with its traceback,
        instead of every worker timing out and a deadlock being blamed on one of them."""
        failure = RuntimeError(f"prague: the Group Generator (rank 0) failed: {error!r}")
        failure.__cause__ = error
        self.inbox.put(failure)
        self._resume.put(failure)

    def _receive(self) -> None:
        """Assignments from the GG, in its order, until the answer to this worker's last
        request has come and every group it announced has been run."""
        try:
            while True:
                message = FromGG.empty(self.runtime.world_size)
                self._gg_link.recv(message, 0, tag=_FROM_GG)
                if self.network is not None:  # an answer is charged with its request
                    sent = push_pull(self.rank, 0, 12, message.numel() * 4) if message[1] else (
                        point_to_point(0, self.rank, message.numel() * 4))
                    self.network.occupy(sent)
                answer = FromGG.decode(message)
                if answer.group is None:
                    return
                assigned = GroupAssigned(group=answer.group,
                                         answers_request=answer.answers_request)
                self.inbox.put((assigned, time.perf_counter(), answer.held))
        except BaseException as error:  # noqa: BLE001 - re-raised on the training thread
            self.inbox.put(error)

    # --- static schedules ------------------------------------------------------------------
    def _static_step(self, step: Step) -> None:
        store, stopping = self.runtime.store, self.stopping
        proposal = stopping.proposal(step.iteration, step.wants_stop)
        if proposal is not None:
            self._learn_stop(store.compare_set(_STOP_KEY, "", str(proposal)), step.iteration)
        elif stopping.needs_news(step.iteration) and store.check([_STOP_KEY]):
            self._learn_stop(store.get(_STOP_KEY), step.iteration)
        members = static_group(self.period, step.iteration, self.rank)
        step.extra["groups"] = [[step.iteration, *members]]
        self._preduce(members, step)
        step.stop = stopping.stops_after(step.iteration)

    def _learn_stop(self, agreed: bytes, iteration: int) -> None:
        try:
            self.stopping.learn(int(agreed.decode()), iteration)
        except RuntimeError as error:
            raise RuntimeError(f"prague: rank {self.rank} {error}") from None

    # --- shared ----------------------------------------------------------------------------
    def _preduce(self, members: tuple[int, ...], step: Step) -> None:
        if len(members) == 1:
            return
        flat = self.link.flat(self.tensors)
        with step.blocking():
            began = time.perf_counter()
            members = self._average(flat, members)
            _add_time(step, "preduce_s", began)
        if self.network is not None:
            nbytes = self.network.scaled(flat.numel() * flat.element_size())
            self.network.after_blocking(step, self.preducer.messages(members, nbytes),
                                        f"preduce{len(members)}", time.perf_counter() - began)
        with torch.no_grad():
            self.link.unpack_into(flat, self.tensors)
        step.bytes_sent += self._bytes_out(flat, members)

    def _bytes_out(self, flat: torch.Tensor, members: tuple[int, ...]) -> int:
        """What this rank sent to average `flat` over `members` with the P-Reduce kind that ran
        (a mesh sends k-1 buffers, a ring 2(k-1)/k, a leader's member one)."""
        real = flat.numel() * flat.element_size()
        declared = self.network.scaled(real) if self.network is not None else real  # `auto`'s
        sent = sum(m.nbytes for m in self.preducer.messages(members, declared)
                   if m.src == self.rank)
        return round(sent * real / declared) if declared else 0

    def _average(self, flat: torch.Tensor, members: tuple[int, ...]) -> tuple[int, ...]:
        """P-Reduce `flat` over `members`; the members it averaged over (lost ones left out)."""
        self.runtime.before_send()
        if self.runtime.lost is None:
            self.preducer.average(flat, members)
            return members
        return self.preducer.average_surviving(flat, members, self.runtime.lost.confirm)

    def close(self) -> None:
        """Say goodbye to the GG; rank 0 waits until every worker has said it."""
        if not self.static:
            if self.overlap:
                self.inbox.put(None)  # the communication thread, if it still waits
            self._to_gg(_BYE, 0, 0.0)
            for thread in self._threads:
                thread.join()
            if self._gg is not None:
                self._gg.raise_error()
                if self.runtime.run_dir is not None:
                    stats = dataclasses.asdict(self._gg.core.stats)
                    path = self.runtime.run_dir / "group_generator.json"
                    path.write_text(strict_json.dumps(stats))
        self.preducer.close()


class _GroupGeneratorService:
    """Rank 0's GG: a receiver thread turns messages into events; a generator thread owns the
    core and sends assignments (to rank 0 itself through `deliver`)."""

    def __init__(
        self, core: GroupGeneratorCore, deliver: Callable[[AssignGroup, float], None],
        ready_wait: float, link: Link, runtime: Runtime,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.core = core
        self.link = link  # the host link: receives on threads
        self.runtime = runtime
        self.world = core.world
        self.deliver = deliver
        self._requested_at: dict[int, float] = {}
        self.inbox: queue.Queue[tuple[int, float, int, float]] = queue.Queue()
        self.error: BaseException | None = None
        self._on_error = on_error
        self.ready_wait = ready_wait
        self.thread = threading.Thread(target=self._serve, name="prague-gg", daemon=True)
        """The generator; its receiver, which may wait on a lost worker for good, is left."""
        if self.world > 1:
            threading.Thread(target=self._receive, name="prague-gg-recv", daemon=True).start()
        if runtime.lost is not None:
            runtime.lost.subscribe(lambda rank: self.put(rank, _LOST, 0, 0.0))

    def put(self, rank: int, kind: float, value: int, flag: float) -> None:
        self.inbox.put((rank, kind, value, flag))

    def _receive(self) -> None:
        try:
            messages = PeerStreams(self.link, range(1, self.world), _TO_GG, ToGG.empty,
                                   lambda message: ToGG.decode(message).kind == _BYE,
                                   reuse=True, name="prague-gg-recv")
            for src, message in messages:
                to_gg = ToGG.decode(message)
                self.put(src, float(to_gg.kind), to_gg.value, to_gg.flag)
        except BaseException as error:  # noqa: BLE001 - reported by the serving thread
            self.error = error
            self.put(-1, _BYE, 0, 0.0)

    def _serve(self) -> None:
        try:
            gone: set[int] = set()  # said goodbye or were lost
            lost: set[int] = set()
            while len(gone) < self.world and self.error is None:
                wait = self.ready_wait if self.core.waiting else None
                try:
                    rank, kind, value, flag = self.inbox.get(timeout=wait)
                except queue.Empty:
                    self._send_all(self.core.handle(WaitTimedOut()))
                    continue
                if rank in lost:
                    continue  # sent before it was lost: it no longer counts
                if kind == _LOST:
                    lost.add(rank)
                    if rank not in gone:
                        gone.add(rank)
                        self._send_all(self.core.handle(WorkerLost(rank=rank)))
                elif kind == _BYE:
                    gone.add(rank)
                    self._end(rank)
                elif kind == _REQUEST:
                    event = GroupRequested(rank=rank, iteration=value, last=bool(flag))
                    self._requested_at[rank] = time.perf_counter()
                    self._send_all(self.core.handle(event))
                else:
                    self._send_all(self.core.handle(GroupFinished(group_id=value, rank=rank)))
        except BaseException as error:  # noqa: BLE001 - re-raised on rank 0's training thread
            self.error = error
        if self.error is not None:  # its own, or its receiver's
            self._on_error(self.error)

    def _send_all(self, assignments: list[AssignGroup]) -> None:
        now = time.perf_counter()
        for assign in assignments:
            asked = self._requested_at.pop(assign.rank, now) if assign.answers_request else now
            held = now - asked
            if assign.rank == 0:
                self.deliver(assign, held)
            else:
                self._send(assign.rank, assign.group, assign.answers_request, held)

    def _end(self, rank: int) -> None:
        """`rank` said goodbye: end its assignment channel."""
        if rank > 0:
            self._send(rank, None, False, 0.0)

    def _send(self, rank: int, group: Group | None, answers_request: bool, held: float) -> None:
        """One assignment (or, with no group, the end marker): id, whether it answers the
        request, how long the GG held that request, size, members. A blocking send returns at
        once: the worker's receiver thread always waits for the next one."""
        message = FromGG(group, answers_request, held).encode(self.world)
        self.runtime.before_send()
        unless_lost(self.runtime.lost, rank, partial(self.link.send, message, rank,
                                                     tag=_FROM_GG))

    def raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"prague: the Group Generator failed: {self.error!r}")
