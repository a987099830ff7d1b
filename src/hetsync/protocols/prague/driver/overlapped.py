"""Prague with random groups and `--overlap`: the P-Reduces run on a communication thread
beside the compute, on a copy of the model that `MergeModels` folds back in (see
`PragueWorkerCore`); the training thread only sends its request and, a step later, waits for
that request's group if it is not done yet. Every thread feeds the core under one lock and
executes the decisions it gets back (a merge, a message to the GG) under it, so the GG sees
each worker's messages in the core's order; P-Reduces go to the communication thread, steps
to the training thread."""

from __future__ import annotations

import queue
import threading
import time

import torch

from hetsync.protocols.base import Step
from hetsync.protocols.prague.driver.averaging import GroupAverager, add_time
from hetsync.protocols.prague.driver.random_groups import RandomGroups
from hetsync.protocols.prague.group_generator import Group
from hetsync.protocols.prague.worker import (
    Decision,
    MergeModels,
    PReduceFinished,
    RunPReduce,
    StartStep,
    StepFinished,
    StopTraining,
    WorkerState,
    dispatch,
)
from hetsync.transport.channel import Channel
from hetsync.transport.contiguous import span
from hetsync.transport.links import Link, bind_thread
from hetsync.transport.runtime import Runtime

__all__ = ["CommunicationCopy", "OverlappedGroups"]


class CommunicationCopy:
    """The model as it was handed over to the P-Reduces (s), their average (c), and `merge`,
    which folds it into the model: x <- c + (x - s), then s = x, handed over again.

    The first P-Reduce after a handover averages s into c (out of place: s needs no copy
    of its own for it), the next ones c in place; where none ran (a group of one, or none
    since the handover) c stands for s and x is left as it is (x <- s + (x - s) would only
    round), so the merge is the handover's copy alone. So a merge writes x and s, not c as
    well: one model-sized pass fewer than c = s = x (a 45 MB model's copy is 5-10 ms), and
    two fewer again where nothing was averaged. The buffers are reused merge after merge (a
    new one is fresh pages to fault in, see `Link.flat`)."""

    def __init__(self) -> None:
        self._handed: torch.Tensor | None = None
        self._comm: torch.Tensor | None = None
        self._averaged = False  # c holds an average of s, made since the handover
        self._spare: torch.Tensor | None = None  # where the merge through a copy makes x

    def preduce_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(what the next P-Reduce averages, where it puts the average); c holds it from now
        on. Only between merges, which hand the model over first."""
        assert self._handed is not None, "no model was handed over yet"
        if self._averaged:
            assert self._comm is not None
            return self._comm, self._comm
        handed, comm = self._handed, self._comm
        if (comm is None or comm.shape != handed.shape or comm.dtype != handed.dtype
                or comm.device != handed.device):  # the first, or the model changed
            comm = self._comm = torch.empty_like(handed)
        self._averaged = True
        return handed, comm

    def merge(self, link: Link, tensors: list[torch.Tensor]) -> None:
        """Merge (no P-Reduce may run) and hand the model over. A model laid out in one buffer
        on the wire (hetsync.transport.contiguous) is merged in place: three passes over it
        (one if nothing was averaged); in pieces, or off the wire device, through a copy: four
        (one). The same arithmetic, bit for bit."""
        whole = span(tensors)
        if whole is None or whole.device != link.device:
            self._merge_through_copy(link, tensors)
            return
        if self._averaged:
            assert self._handed is not None and self._comm is not None
            with torch.no_grad():
                whole.sub_(self._handed).add_(self._comm)  # exact with lr 0
        self._handed = link.flat([whole], out=self._handed)
        self._averaged = False

    def _merge_through_copy(self, link: Link, tensors: list[torch.Tensor]) -> None:
        """The new x is made in the spare buffer, which becomes s."""
        flat = link.flat(tensors, out=self._spare)
        if self._averaged:
            assert self._handed is not None and self._comm is not None
            flat.sub_(self._handed).add_(self._comm)  # exact with lr 0
            with torch.no_grad():
                link.unpack_into(flat, tensors)
        self._spare, self._handed = self._handed, flat
        self._averaged = False


class OverlappedGroups(RandomGroups):
    """A worker's steps with groups from the GG, P-Reduced on a communication thread."""

    def __init__(self, runtime: Runtime, averager: GroupAverager, gg_channel: Channel) -> None:
        self._lock = threading.Lock()  # the core, the GG channel and the model
        self._resume: queue.Queue[StartStep | StopTraining | BaseException] = queue.Queue()
        self._copies = CommunicationCopy()
        self._ran: list[list[int]] = []  # groups run since the last row
        self._comm_preduce_s = 0.0
        self._sent_bytes = 0
        super().__init__(runtime, averager, gg_channel)
        self._threads.append(threading.Thread(target=self._communicate, daemon=True,
                                              name="prague-preduce"))

    def after_step(self, step: Step) -> None:
        with self._lock:
            decisions = self.core.handle(StepFinished(iteration=step.iteration,
                                                      last=step.wants_stop))
            resume = self._execute(decisions)
        if resume is None:
            with self.averager.channel.waiting(step):
                began = time.perf_counter()
                try:
                    resume = self._resume.get(timeout=self.timeout)
                except queue.Empty:
                    raise TimeoutError(
                        f"prague: rank {self.rank} waited {self.timeout:g} s after step "
                        f"{step.iteration} for its previous group: {self._waiting_for()}"
                    ) from None
                add_time(step, "overlap_wait_s", began)
        if isinstance(resume, BaseException):
            raise RuntimeError(f"prague: the P-Reduce thread failed: {resume!r}") from resume
        with self._lock:  # the communication thread adds to these under it
            step.extra["groups"], self._ran = self._ran, []
            step.extra["preduce_s"], self._comm_preduce_s = self._comm_preduce_s, 0.0
            self.averager.channel.count(step, self._sent_bytes)
            self._sent_bytes = 0
        step.stop = isinstance(resume, StopTraining)

    def _waiting_for(self) -> str:
        """Whom the wait is for: the Group Generator's answer, or the members of the groups
        still to run."""
        with self._lock:
            core = self.core
            answer = ("the Group Generator's (rank 0) answer awaited" if core.awaiting_answer
                      else "the Group Generator's answer received")
            groups = [("running", core.running)] if core.running else []
            groups += [("queued", group) for group in core.queued]
            return "; ".join([answer] + [f"group {group.id} {state} with ranks "
                                         f"{list(group.members)}" for state, group in groups])

    def _execute(self, decisions: list[Decision]) -> StartStep | StopTraining | None:
        """Under the lock: merge and message the GG now, hand P-Reduces to the communication
        thread; the step to start (or StopTraining), for the training thread."""
        resume = None
        for decision in decisions:
            resume = dispatch(decision, self) or resume
        return resume

    # --- the core's decisions, where they differ from `RandomGroups`' (lock held) -------------
    def on_merge_models(self, decision: MergeModels) -> None:
        self._copies.merge(self.averager.link, self.averager.tensors)

    def on_run_preduce(self, decision: RunPReduce) -> None:
        """Hand the P-Reduce to the communication thread."""
        self.inbox.put(decision)

    def _communicate(self) -> None:
        """The communication thread: feeds assignments to the core, runs the P-Reduces."""
        bind_thread(self.runtime.device)
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
                    resume = self._execute(self.core.handle(item.assigned))
                if resume is not None:
                    self._resume.put(resume)
        except BaseException as error:  # noqa: BLE001 - re-raised on the training thread
            self._resume.put(error)

    def _background_preduce(self, group: Group) -> None:
        began = time.perf_counter()
        members = group.members
        comm = None
        if len(members) > 1:
            source, comm = self._copies.preduce_buffers()
            members = self.averager.average(None, comm, members, source)
        with self._lock:
            self._ran.append([group.id, *group.members])
            self._comm_preduce_s += time.perf_counter() - began
            if comm is not None:
                self._sent_bytes += self.averager.bytes_out(comm, members)
            resume = self._execute(self.core.handle(PReduceFinished(group_id=group.id)))
        if resume is not None:
            self._resume.put(resume)

    def _fail(self, failure: BaseException) -> None:
        """Wake the training thread's wait for a group as well as the inbox's."""
        super()._fail(failure)
        self._resume.put(failure)

    def close(self) -> None:
        self.inbox.put(None)  # the communication thread, if it still waits
        super().close()
