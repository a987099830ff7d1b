"""Prague with random groups (`--schedule random`, the default): groups come from the Group
Generator, and a worker P-Reduces with each between its steps.

The GG is a service on rank 0 (`gg_service`): a fixed, known address every worker can reach
with point-to-point messages, and its work is tiny (a few microseconds per request), so it
costs rank 0 nothing measurable. A worker that finished a step sends a request; the GG answers
every member of the group it forms, in one global order, which each worker's
`PragueWorkerCore` follows so that conflicting groups never deadlock. Requests, finished
groups and goodbyes travel on one tag to rank 0's receiver thread; assignments travel back on
another to each worker's receiver thread (`_receive`; rank 0's are handed over directly).
Workers stop independently: a worker's last request is answered, and no later group contains
it. `overlapped` runs the P-Reduces beside the compute instead."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from hetsync.metrics import strict_json
from hetsync.network.model import Message
from hetsync.network.patterns import point_to_point, push_pull
from hetsync.protocols.base import Step
from hetsync.protocols.prague.driver.averaging import GroupAverager, add_time
from hetsync.protocols.prague.driver.gg_service import GroupGeneratorService
from hetsync.protocols.prague.gg_wire import FROM_GG_TAG, TO_GG_TAG, FromGG, Kind, ToGG
from hetsync.protocols.prague.group_generator import AssignGroup
from hetsync.protocols.prague.options import group_generator
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
    WorkerState,
    dispatch,
)
from hetsync.transport.channel import Channel
from hetsync.transport.runtime import Runtime

__all__ = ["RandomGroups", "answer_messages"]


@dataclass(frozen=True, slots=True)
class Arrival:
    """An assignment, when it arrived (time.perf_counter()) and how long the GG held the
    request it answers (seconds)."""

    assigned: GroupAssigned
    arrived: float
    held: float


Inbox = Arrival | RunPReduce | BaseException | None
"""An assignment, a P-Reduce for the communication thread, a failure, or the end (None)."""


class RandomGroups:
    """A worker's steps with groups from the GG, each P-Reduced between its steps."""

    def __init__(self, runtime: Runtime, averager: GroupAverager, gg_channel: Channel) -> None:
        self.runtime, self.rank, self.averager = runtime, runtime.rank, averager
        self.timeout = runtime.wait_timeout
        self.gg_channel = gg_channel  # the GG's messages, received on threads: the host link
        self.inbox: queue.Queue[Inbox] = queue.Queue()
        self.core = PragueWorkerCore.of_run(runtime.config, self.rank, runtime.world_size)
        self._step = Step(0)  # the step whose decisions are being carried out
        self._todo: deque[Decision] = deque()  # ... and those still to carry out
        self.gg: GroupGeneratorService | None = None
        self._threads: list[threading.Thread] = []
        if self.rank == 0:
            self.gg = GroupGeneratorService(group_generator(runtime.config), self._deliver,
                                            runtime.config.ready_wait / 1000.0, gg_channel,
                                            runtime, self._gg_failed)
            self._threads.append(self.gg.thread)
        elif runtime.world_size > 1:
            self._threads.append(threading.Thread(target=self._receive, daemon=True,
                                                  name="prague-assignments"))

    def start(self) -> None:
        """Start the threads (once the mode is fully built: they call back into it)."""
        for thread in self._threads:
            thread.start()

    def after_step(self, step: Step) -> None:
        self._step = step
        todo = self._todo = deque(self.core.handle(StepFinished(iteration=step.iteration,
                                                                last=step.wants_stop)))
        while todo:
            resume = dispatch(todo.popleft(), self)
            if resume is not None:
                step.stop = isinstance(resume, StopTraining)
                return
            if not todo:
                todo.extend(self.core.handle(self._next_assignment(step)))

    # --- the core's decisions (`PragueDecisionHandler`): the step to resume with, if any ------
    def on_request_group(self, decision: RequestGroup) -> None:
        finished = -1 if decision.finished is None else decision.finished
        self._to_gg(ToGG(Kind.REQUEST, decision.iteration, float(decision.last), finished))

    def on_report_finished(self, decision: ReportFinished) -> None:
        self._to_gg(ToGG(Kind.FINISHED, decision.group_id, 0.0))

    def on_run_preduce(self, decision: RunPReduce) -> None:
        """Run the P-Reduce now, between the steps."""
        group, step = decision.group, self._step
        step.extra.setdefault("groups", []).append([group.id, *group.members])
        self.averager.preduce(group.members, step)
        self._todo.extend(self.core.handle(PReduceFinished(group_id=group.id)))

    def on_merge_models(self, decision: MergeModels) -> None:
        raise AssertionError("prague: MergeModels without --overlap")  # the core's bug

    def on_start_step(self, decision: StartStep) -> StartStep:
        return decision

    def on_stop_training(self, decision: StopTraining) -> StopTraining:
        return decision

    def loop_ended(self, step: Step) -> None:
        """This worker's last request is answered and every group it is in is run, so no
        member waits for it."""
        if self.core.state is WorkerState.COMPUTING:
            self.after_step(step)

    def _next_assignment(self, step: Step) -> GroupAssigned:
        with self.gg_channel.waiting(step):
            began = time.perf_counter()
            try:
                item = self.inbox.get(timeout=self.timeout)
            except queue.Empty:
                raise TimeoutError(f"prague: rank {self.rank} waited {self.timeout:g} s for "
                                   f"the Group Generator (rank 0) after step "
                                   f"{step.iteration}") from None
            add_time(step, "gg_wait_s", began)
        if isinstance(item, BaseException):
            raise RuntimeError(f"prague: group messages failed: {item!r}") from item
        assert isinstance(item, Arrival)
        if item.assigned.answers_request:
            step.extra["gg_hold_s"] = float(step.extra.get("gg_hold_s", 0.0)) + item.held  # type: ignore[arg-type]
        add_time(step, "wake_s", max(item.arrived, began))
        return item.assigned

    def _to_gg(self, message: ToGG) -> None:
        gg = self.gg
        if gg is not None:
            self.gg_channel.hand_over(lambda: gg.put(self.rank, message))
        else:
            self.gg_channel.send(None, message.encode(), 0, TO_GG_TAG)

    def _deliver(self, assign: AssignGroup, held: float) -> None:
        """Rank 0's GG hands rank 0 its own assignments directly."""
        assigned = GroupAssigned(group=assign.group, answers_request=assign.answers_request)
        self.inbox.put(Arrival(assigned, time.perf_counter(), held))

    def _gg_failed(self, error: BaseException) -> None:
        """Rank 0's GG failed: rank 0's threads raise it at their next wait, with its traceback,
        instead of every worker timing out and a deadlock being blamed on one of them."""
        failure = RuntimeError(f"prague: the Group Generator (rank 0) failed: {error!r}")
        failure.__cause__ = error
        self._fail(failure)

    def _fail(self, failure: BaseException) -> None:
        """Wake every wait of the training thread with `failure`."""
        self.inbox.put(failure)

    def _receive(self) -> None:
        """Assignments from the GG, in its order, until the answer to this worker's last
        request has come and every group it announced has been run."""
        try:
            while True:
                message = FromGG.empty(self.runtime.world_size)
                self.gg_channel.recv(None, message, 0, FROM_GG_TAG)
                if self.gg_channel.network.emulated:  # an answer is charged with its request
                    self.gg_channel.occupy_control(answer_messages(self.rank, message))
                answer = FromGG.decode(message)
                if answer.group is None:
                    return
                assigned = GroupAssigned(group=answer.group,
                                         answers_request=answer.answers_request)
                self.inbox.put(Arrival(assigned, time.perf_counter(), answer.held))
        except BaseException as error:  # noqa: BLE001 - re-raised on the training thread
            self.inbox.put(error)

    def close(self) -> None:
        """Say goodbye to the GG; rank 0 waits until every worker has said it."""
        self._to_gg(ToGG(Kind.BYE, 0, 0.0))
        for thread in self._threads:
            thread.join()
        if self.gg is not None:
            self.gg.raise_error()
            if self.runtime.run_dir is not None:
                stats = dataclasses.asdict(self.gg.core.stats)
                path = self.runtime.run_dir / "group_generator.json"
                path.write_text(strict_json.dumps(stats))


def answer_messages(rank: int, message: torch.Tensor) -> list[Message]:
    """What the network is charged for the GG's answer `message` to `rank` (`FromGG`): with
    the request it answers, if it answers one (the end marker answers the goodbye); int64
    words, at their real size."""
    answer = FromGG.decode(message)
    if answer.answers_request or answer.group is None:
        return push_pull(rank, 0, ToGG.empty().nbytes, message.nbytes)
    return point_to_point(0, rank, message.nbytes)
