"""Parameter server (Li et al., OSDI 2014): workers push gradients, a server applies them.

Theory of operation. The server is a background thread on rank 0, which also trains as an
ordinary worker (`hetsync.protocols.ps.server`). No extra process is needed, so the world size,
the data shards and the launcher are those of every other protocol, and the same code runs
under torchrun. The cost is that rank 0 shares its CPU (and the GIL, released while gloo
waits) with the server. Each iteration every worker, rank 0 included, pushes

    [kind (PUSH or BYE), model version the gradient was computed on, stop vote, gradient...,
     buffer change...]

and waits for the reply, a buffer of the same size

    [new model version, staleness, stop flag, model..., buffers...]

which it copies into its parameters and buffers; its own optimizer step is skipped. Remote
workers send their push (`PUSH_TAG`) and receive the reply (`PULL_TAG`) over the runtime's
host link (gloo), through the worker's channel; on the wire (`--compress`) a push is encoded
with error feedback (a worker's gradient is sent again and again). Rank 0 hands its push to
the server object directly.

- `--ps-mode sync`: a round collects one gradient from every live worker for the current
  version, applies their mean in one step, and answers all of them with the new model. The
  stop votes are OR-ed over the round, so every worker stops after the same iteration.
  With `--ps-backup b` (backup workers, Chen et al. 2016, "Revisiting Distributed
  Synchronous SGD") a round closes at the first n - b gradients computed on its version:
  their mean is applied and they are answered. A gradient arriving after its round closed
  is dropped (its row has `dropped` 1 and `staleness` > 0) and its sender is answered at
  once with the current model, so a straggler holds no one back and catches up each
  iteration. Its stop vote still counts; from the first round closed after a vote, every
  reply says stop, so all workers end with the same model, the late ones after fewer
  iterations. The bookkeeping is `hetsync.protocols.ps.rounds.SyncRounds`.
- `--ps-mode async`: each gradient is applied as it arrives and only its sender gets the new
  model; staleness = server version at apply time - version the gradient was computed on.
  Each gradient is applied with 1/n of the learning rate, its share of the synchronous mean:
  n workers' pushes then move the model as far as one sync round, so both modes take the same
  learning rate and momentum (at the full rate, 4 async workers with momentum 0.9 diverge on
  digits). Scaling the rate rather than the gradient keeps that true for optimizers that
  normalise the gradient (Adam: a gradient scaled by 1/n is a full step) and for weight decay.
  Workers stop on their own.

Buffers are shared too (floating ones: BatchNorm's running statistics; integer ones such as
num_batches_tracked stay local). The buffer change a worker pushes is what its forward passes
did to its floating buffers since it last loaded the server's; the server adds the round's
mean change (sync) or the change / n (async, like the gradient), and the reply carries the
server's buffers, which the worker loads. In sync mode the running statistics then follow all
of the round's batches, as one running statistic over the round would.

Shutdown: in `close()` every remote worker sends BYE; the thread exits after one BYE per
remote rank, and rank 0's `close()` waits for that, so no p2p is in flight at SyncOptimizer's
final barrier. A worker lost from the run (`--on-failure continue`) counts as having said BYE
(`WorkerLost`: a push of its in the open sync round still counts; a reply to it that fails is
dropped once the launcher confirms the loss). A worker that
leaves is no longer waited for by sync rounds. No worker waits at
shutdown with backups either: a late push after the stop round is answered at once, with
stop.

Every decision (what to add, when to apply with which divisor and learning-rate scale, whom to
answer with which version, staleness and stop; a worker's version tag and stop) comes from
`hetsync.protocols.ps.core`: `PSServerCore` on the server thread, `PSWorkerCore` on each worker.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetsync.config import RunConfig
from hetsync.protocols.base import Protocol, Step
from hetsync.protocols.ps.core import (
    GradientReady,
    Leave,
    LoadModel,
    PSServerCore,
    PSWorkerCore,
    ReplyReceived,
    SendBye,
    SendPush,
    WorkerDecision,
    dispatch_worker,
)
from hetsync.protocols.ps.server import LocalPush, Server, host_flat, trainable
from hetsync.protocols.ps.wire import (
    PULL_TAG,
    PUSH_TAG,
    RESUME_TAG,
    PushHeader,
    ReplyHeader,
    frame,
)
from hetsync.protocols.registry import register_protocol
from hetsync.transport.runtime import Runtime


@register_protocol("ps")
class ParameterServer(Protocol):
    """Gradients pushed to a server thread on rank 0, which answers with the new model."""

    @classmethod
    def ends_alone(cls, config: RunConfig) -> bool:
        return config.ps_mode == "async"  # a sync round waits for every worker's gradient

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        self.link = runtime.links.host  # the server receives on threads: gloo
        self.channel = self.open_channel(self.link)
        self.core = PSWorkerCore.of_run(runtime.config, runtime.rank)
        self.params = [p for group in trainable(optimizer) for p in group]
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.dtype = self.params[0].dtype
        self.loaded = host_flat(self.buffers, self.dtype)  # as last loaded from the server
        self.frame = frame(sum(p.numel() for p in self.params) + self.loaded.numel(),
                           self.dtype)
        self.reply = self.channel.empty(self.frame)
        self._push: torch.Tensor | None = None  # the last message pushed, reused
        self.server = (
            Server(optimizer, self.buffers,
                   PSServerCore.of_run(runtime.config, runtime.world_size), self.channel)
            if runtime.rank == 0 else None
        )
        self._step = Step(0)  # the step whose decisions are being carried out

    def before_optimizer_step(self, step: Step) -> None:
        step.begin_sync()
        self._step = step
        self._execute(self.core.handle(GradientReady(iteration=step.iteration,
                                                     wants_stop=step.wants_stop)))

    def _execute(self, decisions: list[WorkerDecision]) -> None:
        for decision in decisions:
            dispatch_worker(decision, self)

    # --- the core's decisions (`WorkerDecisionHandler`) -------------------------------------
    def on_send_push(self, decision: SendPush) -> None:
        """Push the gradient, wait for the reply and load it."""
        step = self._step
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        delta = host_flat(self.buffers, self.dtype) - self.loaded  # what the forward passes did
        pushed = PushHeader(decision.version, decision.vote)
        # A push is sent (or, rank 0's, accumulated by the server) before the reply comes,
        # so its buffer is free for the next (a new model-sized buffer costs page faults, see
        # Link.flat). Rank 0's push never travels: its gradients, on the host in the server's
        # dtype, are added in as they are (no message to pack), else packed as they are.
        server = self.server
        if server is not None:
            msg: torch.Tensor | LocalPush
            if server.takes_tensors(grads):
                msg = LocalPush(pushed, grads, delta)
            else:
                msg = self._push = self.link.pack(self.frame, pushed.encode(), [*grads, delta],
                                                  out=self._push)
            with self.channel.waiting(step):
                self.channel.hand_over(lambda: server.push(msg))
                reply = server.reply()
        else:
            self._push = self.channel.pack(self.frame, pushed.encode(), [*grads, delta],
                                           out=self._push, feedback="gradient")
            with self.channel.waiting(step):
                sent = self.channel.send(step, self._push, 0, PUSH_TAG)
                assert sent, "rank 0 is never lost: it hosts the server (options.tolerate_loss)"
                self.channel.recv(None, self.reply, 0, PULL_TAG)  # (None: waited for above)
            reply = self.reply
        payload = self.channel.payload(self.frame, reply)
        split = len(payload) - self.loaded.numel()
        with torch.no_grad():
            self.link.unpack_into(payload[:split], self.params)
            self.link.unpack_into(payload[split:], self.buffers)
        self.loaded = host_flat(self.buffers, self.dtype)
        header = ReplyHeader.decode(self.frame, reply)
        if server is not None:
            server.release(reply)
        self._execute(self.core.handle(ReplyReceived(version=header.version,
                                                     staleness=header.staleness,
                                                     stop=header.stop)))
        if server is not None:  # rank 0's own push is local: count what the server sent
            self.channel.count(step, server.take_sent())

    def on_load_model(self, decision: LoadModel) -> None:
        """The reply's model is loaded (`on_send_push`): record and end the iteration."""
        step = self._step
        step.extra["staleness"] = float(decision.staleness)
        if decision.dropped is not None:  # sync with backups: its round closed without it
            step.extra["dropped"] = float(decision.dropped)
        step.stop = decision.stop
        step.skip_optimizer_step = True

    def on_send_bye(self, decision: SendBye) -> None:
        """Rank 0 leaves the server directly (`close`); the others send their goodbye (after
        the iterations: no fault delays it, and no row counts it)."""
        if self.server is None:
            bye = self.channel.pack(self.frame, PushHeader(0, False, bye=True).encode(),
                                    [torch.zeros(self.frame.numel, dtype=self.dtype)])
            self.link.send(bye, 0, tag=PUSH_TAG)

    def after_optimizer_step(self, step: Step) -> None:
        """Nothing to do: the server applied the update and the stop was decided above."""

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's: the server's model and optimizer state; the other ranks' models are
        the server's on resume."""
        return {"server": self.server.state_dict()} if self.server is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the server takes rank 0's saved state, then every worker starts from the
        server's model, as at a reply. Each worker's own checkpoint may be versions older, and
        its first gradient, computed there, would be applied as a fresh one: versions restart
        at 0 on both sides. Sent to each survivor, not broadcast: the ranks lost before the
        resume have left (hetsync.launch.worker), and a collective would wait for them. The
        model goes as it is, not encoded (once, before the iterations: no fault delays it)."""
        if self.server is not None and "server" in state:
            self.server.load_state_dict(state["server"])
        size = sum(p.numel() for p in self.params)
        model = (self.server.model() if self.server is not None
                 else self.link.zeros(size + self.loaded.numel(), self.dtype))
        if self.server is not None:
            lost = self.runtime.lost.refresh() if self.runtime.lost is not None else frozenset()
            for rank in range(1, self.runtime.world_size):
                if rank not in lost:
                    self.channel.lost(rank, lambda rank=rank: self.link.send(
                        model, rank, tag=RESUME_TAG))
        else:
            self.channel.recv(None, model, 0, RESUME_TAG)
        with torch.no_grad():
            self.link.unpack_into(model[:size], self.params)
            self.link.unpack_into(model[size:], self.buffers)
        self.loaded = host_flat(self.buffers, self.dtype)  # the buffers just loaded into the model

    def close(self) -> None:
        self._execute(self.core.handle(Leave()))
        if self.server is not None:
            self.server.close()
