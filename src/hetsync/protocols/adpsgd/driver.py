"""AD-PSGD (Lian et al., ICML 2018): asynchronous decentralized SGD by atomic pairwise averaging.

Theory of operation. Workers are split into *active* (odd ranks) and *passive* (even ranks) on
a bipartite graph (every edge joins an odd and an even rank: `--topology ring` with an even
number of workers, or `bipartite-exponential`). Each iteration an active worker picks a random
passive neighbour j, sends it x_i and receives the average; j, in a receiver thread that
serves one request at a time, sets x_j <- (x_i + x_j) / 2 under its model lock and replies
with it; the active worker sets x_i to the same average, then applies its gradient (computed
on x_i before averaging, as the algorithm prescribes). The request is posted when the
iteration starts, so averaging runs while the gradient is computed. With `--compress` both
messages carry their model in the wire format (each side's encoding error fed into its next
send): j keeps the average of its model and the decoded request, i loads the decoded reply, so
the pair's models, and the sum of all, are conserved only to within the codec's rounding.

Why no deadlock: only active workers wait for someone, and only for a passive worker's
receiver thread; a passive receiver never waits for anyone while it serves (it only takes its
own model lock, which its trainer holds for the length of one optimizer step). The wait-for
graph therefore has edges only from active to passive workers and can have no cycle.

`--adpsgd-mode naive` drops the split to show why it is needed: every worker is active and
passive on any graph, so to make its own averaging atomic an active worker must hold its own
model lock until its partner's reply arrives; its receiver thread then cannot serve, and two
workers that pick each other (or any cycle of them) wait forever. The launcher reports that
as a deadlock. Workers stop independently; a passive receiver exits once every active
neighbour has said goodbye.

The decisions (roles, the partner drawn, who holds the model lock, which request is served
next, who is lost) are `hetsync.protocols.adpsgd.core.ADPSGDCore`'s. The training thread, the
receiver thread and the lost-worker watcher share the core under one condition variable, and
whichever thread feeds an event carries out the decisions it returns (`_execute`): a grant
meant for the other thread (a `Serve` returned by the trainer's `StepFinished`, a `StepGranted` or a
deferred `SendRequest` returned by the receiver's `Served`) is recorded, and the thread it is
for waits on the condition until it is. The driver acts on decisions only, as the simulator
does, so the contract the fuzzer checks is the one real runs keep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from hetsync.config import RunConfig
from hetsync.network.patterns import point_to_point, push_pull
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
from hetsync.protocols.adpsgd.wire import Header, frame
from hetsync.protocols.base import Closures, Protocol, Step
from hetsync.protocols.registry import register_protocol
from hetsync.topology import build
from hetsync.transport.flat import BufferDrift, model_tensors
from hetsync.transport.links import bind_thread
from hetsync.transport.mixing import average_pair_into
from hetsync.transport.peer_streams import PeerStreams
from hetsync.transport.runtime import Runtime

_REQUEST_TAG, _REPLY_TAG = 31, 32


@dataclass(slots=True)
class _Pending:
    """The averaging request in flight."""

    message: torch.Tensor
    reply: torch.Tensor
    works: list[dist.Work]
    posted: float
    """When it was posted (time.time())."""
    modelled: float
    """Its modelled transfer time (seconds; 0 without a network model)."""
    partner: int


@register_protocol("adpsgd")
class ADPSGD(Protocol):
    """Asynchronous decentralized SGD with atomic pairwise averaging."""

    closures = Closures.LOCAL  # a closure: the step from the average, under the model lock

    @classmethod
    def ends_alone(cls, config: RunConfig) -> bool:
        return True  # nobody waits for a particular worker; a gone one's peer serves alone

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        config, rank = runtime.config, runtime.rank
        self.topology = build(config.topology, runtime.world_size, config.weights)
        self.tensors = model_tensors(model)
        self.frame = frame(self.tensors)
        self.drift = BufferDrift(model)
        self.link = runtime.links.host  # receives on threads: gloo, on host memory
        self.channel = self.open_channel(self.link)
        self._wire_bytes = self.channel.frame(self.frame).payload_bytes
        """What a request's or reply's model weighs on the wire (`--compress`): its charge."""
        self.core = ADPSGDCore.of_run(self.topology, rank, config.seed, config.adpsgd_mode,
                                      config.adpsgd_max_gap)
        self.cond = threading.Condition()  # guards the core, shared with the receiver thread
        self._pending: _Pending | None = None
        # Model-sized buffers reused message after message (hetsync.transport.links.Link.flat
        # says why): the request and its reply (training thread), the reply served (receiver
        # thread). One a lost partner may still hold is dropped, not reused.
        self._request_buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._served: torch.Tensor | None = None
        # What the core granted, recorded by `_execute` (cond held) for the thread it is for:
        self._request_to: int | None = None  # SendRequest: the partner
        self._step_granted = 0  # StepGranted: its iteration
        self._serve_granted: int | None = None  # Serve: the client
        self._stop = False  # Finish
        self._begun = 0  # the iteration whose request was posted
        self._byes: list[int] = []  # SendBye
        self._server_done = False  # ServerDone
        self._server: threading.Thread | None = None
        self._server_error: BaseException | None = None
        # Set at the first optimizer step (iteration 1 begins when the optimizer is built): a
        # model loaded after building the optimizer must not be averaged before it is loaded,
        # or the load would overwrite the average.
        self._started = threading.Event()
        if self.core.passive and self.core.clients:
            self._server = threading.Thread(target=self._serve, name="adpsgd-passive", daemon=True)
            self._server.start()
        if runtime.lost is not None:
            runtime.lost.subscribe(self._on_lost)

    @contextmanager
    def model_lock(self) -> Iterator[None]:
        """Hold off the serving thread's averages while the training thread reads the model
        whole: once no served average is being written (`ADPSGDCore.model_at_rest`), keep the
        core's condition, so that no next `Serve` is granted until the copy is done. A
        snapshot or checkpoint taken meanwhile mixed the model before and after an average."""
        with self.cond:
            self._wait(lambda: self.core.model_at_rest)
            yield

    def _on_lost(self, rank: int) -> None:
        """The launcher declared `rank` lost (a watcher thread calls this)."""
        with self.cond:
            self._execute(self.core.handle(PeerLost(rank=rank)))  # may end the serving

    # --- the active side, on the training thread ---------------------------------------------
    def begin_iteration(self, step: Step) -> None:
        """Post this iteration's averaging request; it runs while the gradient is computed.
        The first is posted when needed, so a model loaded after building the optimizer is
        the one averaged."""
        if step.iteration > 1:
            self._request(step)

    def _wait(self, granted: Callable[[], bool]) -> None:
        """Wait (condition held) until the core has `granted`, or the receiver thread died."""
        self.cond.wait_for(lambda: granted() or self._server_error is not None)
        self._raise_server_error()

    def _execute(self, decisions: list[Decision]) -> None:
        """Carry out the core's `decisions` (cond held): load an average now, record a grant
        for the thread it is for, and wake the threads waiting for one."""
        for decision in decisions:
            dispatch(decision, self)
        self.cond.notify_all()

    # --- the core's decisions (`ADPSGDDecisionHandler`), cond held ---------------------------
    def on_send_request(self, decision: SendRequest) -> None:
        self._request_to = decision.partner

    def on_load_average(self, decision: LoadAverage) -> None:
        pending = self._pending
        assert pending is not None and pending.partner == decision.partner
        average = self.channel.payload(self.frame, pending.reply)
        if self.drift.buffers:  # (a compressed message is decoded only where it is read)
            self.drift.apply(average, self.channel.payload(self.frame, pending.message))
        self._load(average)

    def on_step_granted(self, decision: StepGranted) -> None:
        self._step_granted = decision.iteration

    def on_finish(self, decision: Finish) -> None:
        self._stop = decision.stop

    def on_serve(self, decision: Serve) -> None:
        self._serve_granted = decision.client

    def on_send_bye(self, decision: SendBye) -> None:
        self._byes.extend(decision.to)

    def on_server_done(self, decision: ServerDone) -> None:
        self._server_done = True

    def _request(self, step: Step) -> None:
        self._begun = step.iteration
        with self.cond:
            self._execute(self.core.handle(IterationStarted(iteration=step.iteration)))
            # naive: a request deferred while a serve holds the lock is granted when it ends
            self._wait(lambda: self._request_to is not None or self.core.deferred is None)
            partner, self._request_to = self._request_to, None
        if partner is None:  # not active, or no partner
            return
        if self._request_buffers is None:
            self._request_buffers = (self.channel.empty(self.frame),
                                     self.channel.empty(self.frame))
        message, reply = self._request_buffers
        self.channel.pack(self.frame, Header(iteration=step.iteration).encode(), self.tensors,
                          out=message, feedback="model")
        works = self.channel.request(step, message, reply, partner, (_REQUEST_TAG, _REPLY_TAG))
        if works is None:
            self._request_buffers = None
            with self.cond:
                self._execute(self.core.handle(ReplyLost(src=partner)))
            return
        step.extra["partner"] = partner
        modelled = self.channel.duration(partial(push_pull, self.runtime.rank, partner),
                                         self._wire_bytes)
        self._pending = _Pending(message, reply, works, time.time(), modelled, partner)

    def before_optimizer_step(self, step: Step) -> None:
        self._started.set()
        if self._begun != step.iteration:  # iteration 1: not begun yet
            self._request(step)
        step.begin_sync()
        self._raise_server_error()
        with self.cond:
            self._execute(self.core.handle(ComputeFinished(iteration=step.iteration)))
        pending = self._pending
        if pending is not None:
            with self.channel.waiting(step):
                self._finish_request()
            self.channel.hold_for(step, pending.posted, pending.modelled)
        with self.cond:  # a passive worker's step must not interleave with a served average
            self._wait(lambda: self._step_granted == step.iteration)

    def after_optimizer_step(self, step: Step) -> None:
        with self.cond:  # the lock may be free for a queued request: Serve
            self._execute(self.core.handle(StepFinished(iteration=step.iteration,
                                                        wants_stop=step.wants_stop)))
            step.stop = self._stop

    def _finish_request(self) -> None:
        """Wait for the partner's average and load it: the partner has already applied it,
        so not loading it would break the conservation of the sum of the models."""
        assert self._pending is not None
        works, partner = self._pending.works, self._pending.partner
        if not self.channel.wait(None, works, partner):
            self._request_buffers = None
            with self.cond:
                self._pending = None
                self._execute(self.core.handle(ReplyLost(src=partner)))
            return
        with self.cond:  # LoadAverage: loaded before the core lets anyone else at the model
            self._execute(self.core.handle(ReplyReceived(src=partner)))
            self._pending = None

    def close(self) -> None:
        """Finish a request begun by an iteration that never ran (the script's loop ended
        without the run stopping), say goodbye to every partner, then wait until every
        client has said goodbye."""
        self._started.set()
        with self.cond:
            self._execute(self.core.handle(Leave()))
        if self._pending is not None:
            self._finish_request()
        with self.cond:
            byes, self._byes = self._byes, []
        bye = self.channel.pack(self.frame, Header(bye=True).encode())  # a header, no model
        for partner in byes:  # no model message: not delayed (--fault delay-messages) nor counted
            self.channel.lost(partner, partial(self.link.send, bye, partner, tag=_REQUEST_TAG))
        if self._server is not None:  # until every client said goodbye or was lost
            with self.cond:
                self._wait(lambda: self._server_done)
        self._raise_server_error()

    # --- the passive side, on the receiver thread -----------------------------------------------
    def _serve(self) -> None:
        bind_thread(self.runtime.device)
        try:
            rank = self.runtime.rank
            # A lossless wire: the average is made in the reply itself (packing then writes its
            # header only); else in a buffer of the model's, which packing encodes.
            encoded = None if self.channel.frame(self.frame) is self.frame else (
                self.link.zeros(self.frame.numel, self.frame.dtype))
            requests = PeerStreams(self.link, self.core.clients, _REQUEST_TAG,
                                   partial(self.channel.empty, self.frame),
                                   lambda message: Header.decode(self.frame, message).bye,
                                   reuse=True, name="adpsgd-passive")
            for source, buffer in requests:
                header = Header.decode(self.frame, buffer)
                if header.bye:
                    with self.cond:  # dropped if the core counts the client lost already
                        self._execute(self.core.handle(ByeReceived(src=source)))
                        if self._server_done:
                            return
                    continue
                self._started.wait()
                # the request's bytes come in, one at a time
                self.channel.busy_with(partial(point_to_point, source, rank), self._wire_bytes)
                with self.cond:
                    self._execute(self.core.handle(RequestReceived(src=source,
                                                                   iteration=header.iteration)))
                    if self._serve_granted != source and source not in self.core.queued:
                        continue  # dropped: its client was lost before it came
                    self.cond.wait_for(lambda src=source: self._serve_granted == src)
                    self._serve_granted = None
                # the core holds this worker's lock for us: no step or own average meanwhile;
                # the average is loaded through `.data` (`_load`)
                reply = self._served if self._served is not None else self.channel.empty(
                    self.frame)
                self._served = None
                average = self.frame.payload(reply) if encoded is None else encoded
                average_pair_into(self.link, [t.data for t in self.tensors],
                                  self.channel.payload(self.frame, buffer), average)
                with self.cond:  # the trainer may now step or send its request
                    self._execute(self.core.handle(Served(src=source)))
                self.channel.pack(self.frame, Header().encode(), () if encoded is None else
                                  (encoded,), out=reply, feedback="served")
                self.channel.busy_with(partial(point_to_point, rank, source), self._wire_bytes)
                if self.channel.send(None, reply, source, _REPLY_TAG):
                    self._served = reply  # sent: free again
        except BaseException as error:  # noqa: BLE001 - re-raised on the training thread
            with self.cond:
                self._server_error = error
                self.cond.notify_all()

    def _raise_server_error(self) -> None:
        if self._server_error is not None:
            raise RuntimeError(f"adpsgd receiver thread failed: {self._server_error!r}")

    # --- flat model helpers ---------------------------------------------------------------------
    def _load(self, flat: torch.Tensor) -> None:
        """Write a flat model through `.data`, so that a backward pass running on the training
        thread is not invalidated by a version-counter bump."""
        self.link.unpack_into(flat, [t.data for t in self.tensors])
