"""Parameter server (Li et al., OSDI 2014): workers push gradients, a server applies them.

Theory of operation. The server is a background thread on rank 0, which also trains as an
ordinary worker. No extra process is needed, so the world size, the data shards and the
launcher are those of every other protocol, and the same code runs under torchrun. The cost
is that rank 0 shares its CPU (and the GIL, released while gloo waits) with the server.

The server holds a copy of each of rank 0's trainable parameters (every worker starts from
them: SyncOptimizer broadcasts rank 0's model first) in an optimizer of the worker's class with
the same param groups, so per-group settings (no weight decay on biases) hold. Before every
step it copies each group's current hyper-parameters (all but "params") from rank 0's
optimizer, the user's: an lr scheduler stepped on the worker side, or an lr set by hand, takes
effect at the server. Rank 0's schedule is the one the server follows; all workers normally run
the same one. Each iteration every worker, rank 0 included, pushes

    [kind (PUSH or BYE), model version the gradient was computed on, stop vote, gradient...,
     buffer change...]

and waits for the reply, a buffer of the same size

    [new model version, staleness, stop flag, model..., buffers...]

which it copies into its parameters and buffers; its own optimizer step is skipped. Remote
workers use `send(tag=PUSH_TAG)` / `recv(tag=PULL_TAG)`; the thread serves them as they come,
one receiving thread per remote worker (`PeerStreams`): these messages go over the runtime's
host link (gloo),
and the server's model and every message live in host memory whatever the model's device
(staged by one copy each way; on CPU the same code copies nothing). Rank 0
hands its message to the server object directly, and takes its reply once the remote workers'
replies to the same answer are sent.

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

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from hetsync.config import RunConfig
from hetsync.network.emulator import NetworkEmulator
from hetsync.network.patterns import point_to_point
from hetsync.protocols.base import Protocol, Step
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
    ServerDecision,
    WorkerDecision,
    WorkerLost,
    dispatch_server,
    dispatch_worker,
)
from hetsync.protocols.ps.wire import PushHeader, ReplyHeader, frame
from hetsync.protocols.registry import register_protocol
from hetsync.transport.flat import unflatten_into
from hetsync.transport.links import Link, views
from hetsync.transport.lost_workers import LostWorkers, unless_lost
from hetsync.transport.peer_streams import PeerStreams
from hetsync.transport.runtime import Runtime

PUSH_TAG, PULL_TAG, RESUME_TAG = 21, 22, 23


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    """A param group's hyper-parameters: everything but its parameters, for the server's
    copy on the host. A GPU model's settings that only a GPU takes become the host's: no
    `capturable` (CUDA graphs), and a hyper-parameter given as a tensor is its value."""
    hyper = dict(group)  # one atomic copy: rank 0's thread may be changing the group
    del hyper["params"]
    if hyper.get("capturable"):
        hyper["capturable"] = False
    return {name: _value(value) for name, value in hyper.items()}


def _value(value: Any) -> Any:
    """A tensor hyper-parameter (lr, or each of Adam's betas) as a float."""
    if isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, tuple) and any(isinstance(v, torch.Tensor) for v in value):
        return tuple(float(v) for v in value)
    return value


def _flat(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The tensors' values, detached, in one new 1-D host tensor of `dtype` (empty for none):
    the server's model and every message live in host memory, whatever the model's device."""
    return torch.cat([torch.zeros(0, dtype=dtype),
                      *(t.detach().reshape(-1).to(dtype=dtype, device="cpu") for t in tensors)])


@dataclass(frozen=True, slots=True)
class _Tensors:
    """Rank 0's push as its own tensors: the server adds them into its sums as they are,
    with no message packed first (a pass over the model fewer on rank 0, a 45 MB copy)."""

    header: PushHeader
    grads: list[torch.Tensor]
    delta: torch.Tensor


def _trainable(optimizer: torch.optim.Optimizer) -> list[list[nn.Parameter]]:
    """The optimizer's parameters that go through the server, group by group."""
    return [[p for p in group["params"] if p.requires_grad] for group in optimizer.param_groups]


class _Server:
    """The server's model and rounds; thread-safe, driven by the serving thread and rank 0.

    `optimizer` is rank 0's: the server keeps one copy of each of its trainable parameters,
    in an optimizer of its class with the same groups, and reads the groups' current
    hyper-parameters from it before every step. `buffers` are rank 0's floating buffers."""

    def __init__(self, optimizer: torch.optim.Optimizer, buffers: list[torch.Tensor],
                 core: PSServerCore, link: Link | None = None,
                 network: NetworkEmulator | None = None,
                 lost: LostWorkers | None = None,
                 before_send: Callable[[], None] | None = None) -> None:
        self.source, self.network, self.lost = optimizer, network, lost
        self.link = link if link is not None else Link.default()
        self.before_send = before_send
        groups = _trainable(optimizer)
        self.params = [nn.Parameter(p.detach().to("cpu", copy=True)) for group in groups
                       for p in group]
        copies = iter(self.params)
        self.optimizer = type(optimizer)([
            {**_hyper(group), "params": [next(copies) for _ in params]}
            for group, params in zip(optimizer.param_groups, groups, strict=True)
        ])
        self.dtype = self.params[0].dtype
        self.size = sum(p.numel() for p in self.params)
        self.grad_sum = torch.zeros(self.size, dtype=self.dtype)
        self._sum_views = views(self.grad_sum, self.params)  # also where `_Tensors` grads go
        # The gradients are these views where every parameter has its dtype: the step reads
        # the mean where it was made, with no copy of the model a round.
        self._grads_are_views = all(p.dtype == self.dtype for p in self.params)
        self.grads = (self._sum_views if self._grads_are_views
                      else [torch.zeros_like(p) for p in self.params])
        for p, g in zip(self.params, self.grads, strict=True):
            p.grad = g
        self.buffers = _flat(buffers, self.dtype)
        self.version = 0
        self.core = core
        world = core.world
        self.cond = threading.Condition()
        self.send_lock = threading.Lock()  # one thread at a time sends replies
        self.frame = frame(self.size + self.buffers.numel(), self.dtype)
        self.delta_sum = torch.zeros_like(self.buffers)
        self._summed = False  # whether the sums hold a push since the last `Apply`
        self.local_reply: torch.Tensor | None = None
        self._replies: list[torch.Tensor] = []  # reply buffers no send or rank 0 still reads
        self._readers: dict[int, int] = {}  # per reply in use (by id): sends and reads left
        self._push: torch.Tensor | _Tensors | None = None  # what `_execute`'s decisions answer
        self.bytes_sent = 0
        self.error: BaseException | None = None
        self.remote = set(range(1, world))
        """Remote workers that have neither said goodbye nor been lost."""
        self.thread = threading.Thread(target=self._serve, name="hetsync-ps", daemon=True)
        if world > 1:
            self.thread.start()
        if lost is not None:
            lost.subscribe(self._on_lost)

    def state_dict(self) -> dict[str, Any]:
        """The server's model, buffers and optimizer state (its version and rounds start
        afresh on resume)."""
        with self.cond:
            return {"params": [p.detach().clone() for p in self.params],
                    "buffers": self.buffers.clone(),
                    "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.cond, torch.no_grad():
            for mine, saved in zip(self.params, state["params"], strict=True):
                mine.copy_(saved)
            self.buffers.copy_(state["buffers"])
            self.optimizer.load_state_dict(state["optimizer"])

    def model(self) -> torch.Tensor:
        """The server's model and buffers, flat: what a resumed run starts from."""
        with self.cond:
            return _flat([*self.params, self.buffers], self.dtype)

    def takes_tensors(self, grads: list[torch.Tensor]) -> bool:
        """Whether rank 0 may push `grads` as they are (`_Tensors`): on the host, in the
        server's dtype, so that adding them is what adding a packed message would be."""
        return all(g.device.type == "cpu" and g.dtype == self.dtype for g in grads)

    def push(self, push: torch.Tensor | _Tensors) -> torch.Tensor:
        """Rank 0's push, a message or its tensors (read before this returns); blocks until
        its reply exists (the end of the round in sync mode)."""
        with self.cond:
            self._check()
            sends = self._accept(push, 0)
        self._send(sends)
        with self.cond:
            self.cond.wait_for(lambda: self.local_reply is not None or self.error is not None)
            self._check()
            reply, self.local_reply = self.local_reply, None
        assert reply is not None
        return reply

    def release(self, reply: torch.Tensor) -> None:
        """Rank 0 has read the reply `push` returned."""
        with self.cond:
            self._read(reply)

    def _read(self, reply: torch.Tensor) -> None:
        """One send or read of `reply` is done; after the last, it is free for the next
        reply (lock held). Model-sized buffers are reused, not allocated per reply: a new one
        is fresh pages to fault in, see `Link.flat`."""
        left = self._readers.pop(id(reply), 0) - 1
        if left > 0:
            self._readers[id(reply)] = left
        elif left == 0:  # (left < 0: a buffer `_deliver` did not make, not ours to reuse)
            self._replies.append(reply)

    def take_bytes_sent(self) -> int:
        with self.cond:
            sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    def close(self) -> None:
        """Rank 0 leaves; wait for every remote worker's BYE (or its loss)."""
        with self.cond:
            sends = self._leave(0)
        self._send(sends)
        with self.cond:
            self.cond.wait_for(lambda: not self.remote or self.error is not None)
            self._check()

    def _on_lost(self, rank: int) -> None:
        """The launcher declared `rank` lost: rounds stop waiting for it, as for a BYE (once
        the open round closes, if its push is in it)."""
        with self.cond:
            if rank not in self.remote:
                return
            self.remote.discard(rank)
            sends = self._execute(self.core.handle(WorkerLost(rank=rank)), None)
            self.cond.notify_all()
        self._send(sends)

    def _serve(self) -> None:
        try:
            pushes = PeerStreams(self.link, self.remote, PUSH_TAG,
                                 partial(self.link.empty, self.frame),
                                 lambda msg: PushHeader.decode(self.frame, msg).bye, reuse=True,
                                 name="hetsync-ps")
            for src, buf in pushes:
                bye = PushHeader.decode(self.frame, buf).bye
                if self.network is not None and not bye:  # pushes queue at rank 0's NIC
                    self.network.occupy(point_to_point(src, 0, self._model_bytes(buf)))
                with self.cond:  # the core drops what a lost worker sent before its loss
                    if bye:
                        self.remote.discard(src)
                        sends = self._leave(src)
                        self.cond.notify_all()
                    else:
                        sends = self._accept(buf, src)
                self._send(sends)
        except BaseException as err:  # surfaced by rank 0's next push or close
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"ps: the parameter server thread died: {self.error!r}") \
                from self.error

    def _accept(self, msg: torch.Tensor | _Tensors, src: int) -> list[tuple[int, torch.Tensor]]:
        """Take one gradient and buffer change (lock held); return the replies to send to
        remote ranks."""
        header = msg.header if isinstance(msg, _Tensors) else PushHeader.decode(self.frame, msg)
        push = Push(rank=src, version=header.version, vote=header.vote)
        return self._execute(self.core.handle(push), msg)

    def _leave(self, rank: int) -> list[tuple[int, torch.Tensor]]:
        """`rank` left (lock held): sync rounds stop waiting for it."""
        return self._execute(self.core.handle(Bye(rank=rank)), None)

    def _execute(self, decisions: list[ServerDecision],
                 msg: torch.Tensor | _Tensors | None) -> list[tuple[int, torch.Tensor]]:
        """Carry out the core's decisions about `msg`, the push they answer (lock held);
        return the replies to send to remote ranks."""
        self._push = msg
        sends = [send for decision in decisions for send in dispatch_server(decision, self)]
        self._push = None
        return sends

    # --- the core's decisions (`ServerDecisionHandler`): the replies to send ------------------
    def on_accumulate(self, decision: Accumulate) -> list[tuple[int, torch.Tensor]]:
        assert self._push is not None
        if isinstance(self._push, _Tensors):
            parts = [*zip(self._sum_views, self._push.grads, strict=True),
                     (self.delta_sum, self._push.delta)]
        else:
            payload = self.frame.payload(self._push)
            parts = [(self.grad_sum, payload[:self.size]), (self.delta_sum, payload[self.size:])]
        # The round's first push is copied in, not added to zeros: the sums are not zeroed
        # after each step, a pass over the model fewer (x + 0 is x, bar the sign of a zero).
        for total, part in parts:
            if self._summed:
                total.add_(part)
            else:
                total.copy_(part)
        self._summed = True
        return []

    def on_apply(self, decision: Apply) -> list[tuple[int, torch.Tensor]]:
        if not self._summed:  # a round closed with no push in it: nothing to add
            self.grad_sum.zero_()
            self.delta_sum.zero_()
        for total, divisor in ((self.grad_sum, decision.divisor),
                               (self.delta_sum, decision.buffer_divisor)):
            if divisor != 1:  # (async: each push alone, a pass saved)
                total.div_(divisor)
        self._apply(decision.lr_scale)
        self._summed = False
        assert self.version == decision.version
        return []

    def on_answer(self, decision: Answer) -> list[tuple[int, torch.Tensor]]:
        return self._deliver(decision)

    def _apply(self, lr_scale: float) -> None:
        """One step of the server's optimizer on the mean in the sums."""
        groups = self.source.param_groups
        if len(groups) != len(self.optimizer.param_groups):
            raise RuntimeError("ps: the optimizer's param groups changed after it was wrapped")
        for mine, theirs in zip(self.optimizer.param_groups, groups, strict=True):
            mine.update(_hyper(theirs))  # e.g. the lr set by rank 0's scheduler
            mine["lr"] = mine["lr"] * lr_scale
        if not self._grads_are_views:
            unflatten_into(self.grad_sum, self.grads)
        self.optimizer.step()
        self.buffers.add_(self.delta_sum)
        self.version += 1

    def _deliver(self, answer: Answer) -> list[tuple[int, torch.Tensor]]:
        header = ReplyHeader(answer.version, answer.staleness, answer.stop)
        reply = self.link.pack(self.frame, header.encode(), [*self.params, self.buffers],
                               out=self._replies.pop() if self._replies else None)
        self._readers[id(reply)] = len(answer.ranks)
        # Rank 0 takes its reply last, once the remote ones are sent (`_send`): its copy of
        # the model out of the reply then does not share the CPU with the sends (on one
        # machine, a 45 MB reply went out in 21 ms beside it, 13 ms alone), and a sync round
        # waits for the last remote worker anyway, whose reply it now gets with.
        return [(rank, reply) for rank in sorted(answer.ranks, key=lambda rank: rank == 0)]

    def _model_bytes(self, message: torch.Tensor) -> float:
        """A push's or reply's size as declared (`--payload`): all but its header."""
        assert self.network is not None
        return self.network.scaled(message.numel() - self.frame.words * 8)  # bytes

    def _send(self, sends: list[tuple[int, torch.Tensor]]) -> None:
        """Send the replies to remote ranks, then hand rank 0 its own (`push`), also when a
        send fails."""
        remote = [(rank, reply) for rank, reply in sends if rank != 0]
        try:
            with self.send_lock:
                for rank, reply in remote:
                    if self.network is not None:  # replies leave rank 0's NIC one by one
                        self.network.occupy(point_to_point(0, rank, self._model_bytes(reply)))
                    if self.before_send is not None:
                        self.before_send()
                    unless_lost(self.lost, rank, partial(self.link.send, reply, rank,
                                                         tag=PULL_TAG))  # lost: no one to reply to
        finally:
            with self.cond:
                for rank, reply in sends:
                    if rank == 0:
                        self.local_reply = reply
                        self.cond.notify_all()
        if remote:
            with self.cond:
                self.bytes_sent += sum(r.numel() * r.element_size() for _, r in remote)
                for _, reply in remote:
                    self._read(reply)


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
        self.core = PSWorkerCore.of_run(runtime.config, runtime.rank)
        self.params = [p for group in _trainable(optimizer) for p in group]
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.dtype = self.params[0].dtype
        self.loaded = _flat(self.buffers, self.dtype)  # as last loaded from the server
        self.frame = frame(sum(p.numel() for p in self.params) + self.loaded.numel(),
                           self.dtype)
        self.reply = self.link.empty(self.frame)
        self._push: torch.Tensor | None = None  # the last message pushed, reused
        self.server = (
            _Server(optimizer, self.buffers,
                    PSServerCore.of_run(runtime.config, runtime.world_size), self.link,
                    network=self.network, lost=runtime.lost, before_send=runtime.before_send)
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
        delta = _flat(self.buffers, self.dtype) - self.loaded  # what the forward passes did
        pushed = PushHeader(decision.version, decision.vote)
        # A push is sent (or, rank 0's, accumulated by the server) before the reply comes,
        # so its buffer is free for the next (a new model-sized buffer costs page faults, see
        # Link.flat). Rank 0's gradients, on the host in the server's dtype, are added in as
        # they are: no message to pack.
        msg: torch.Tensor | _Tensors
        if self.server is not None and self.server.takes_tensors(grads):
            msg = _Tensors(pushed, grads, delta)
        else:
            msg = self._push = self.link.pack(self.frame, pushed.encode(), [*grads, delta],
                                              out=self._push)
        with step.blocking():
            self.runtime.before_send()
            if self.server is not None:
                reply = self.server.push(msg)
            else:
                assert isinstance(msg, torch.Tensor)
                self.link.send(msg, 0, tag=PUSH_TAG)
                self.link.recv(self.reply, 0, tag=PULL_TAG)
                reply = self.reply
        payload = self.frame.payload(reply)
        split = len(payload) - self.loaded.numel()
        with torch.no_grad():
            self.link.unpack_into(payload[:split], self.params)
            self.link.unpack_into(payload[split:], self.buffers)
        self.loaded = _flat(self.buffers, self.dtype)
        header = ReplyHeader.decode(self.frame, reply)
        if self.server is not None:
            self.server.release(reply)
        self._execute(self.core.handle(ReplyReceived(version=header.version,
                                                     staleness=header.staleness,
                                                     stop=header.stop)))
        if self.server is not None:  # rank 0's own push is local: count what the server sent
            step.bytes_sent += self.server.take_bytes_sent()
        else:
            step.bytes_sent += msg.numel() * msg.element_size()

    def on_load_model(self, decision: LoadModel) -> None:
        """The reply's model is loaded (`on_send_push`): record and end the iteration."""
        step = self._step
        step.extra["staleness"] = float(decision.staleness)
        if decision.dropped is not None:  # sync with backups: its round closed without it
            step.extra["dropped"] = float(decision.dropped)
        step.stop = decision.stop
        step.skip_optimizer_step = True

    def on_send_bye(self, decision: SendBye) -> None:
        """Rank 0 leaves the server directly (`close`); the others send their goodbye."""
        if self.server is None:
            bye = self.link.pack(self.frame, PushHeader(0, False, bye=True).encode(),
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
        resume have left (hetsync.launch.worker), and a collective would wait for them."""
        if self.server is not None and "server" in state:
            self.server.load_state_dict(state["server"])
        size = sum(p.numel() for p in self.params)
        model = (self.server.model() if self.server is not None
                 else self.link.zeros(size + self.loaded.numel(), self.dtype))
        if self.server is not None:
            lost = self.runtime.lost.refresh() if self.runtime.lost is not None else frozenset()
            for rank in range(1, self.runtime.world_size):
                if rank not in lost:
                    unless_lost(self.runtime.lost, rank,
                                partial(self.link.send, model, rank, tag=RESUME_TAG))
        else:
            self.link.recv(model, 0, tag=RESUME_TAG)
        with torch.no_grad():
            self.link.unpack_into(model[:size], self.params)
            self.link.unpack_into(model[size:], self.buffers)
        self.loaded = _flat(self.buffers, self.dtype)  # the buffers just loaded into the model

    def close(self) -> None:
        self._execute(self.core.handle(Leave()))
        if self.server is not None:
            self.server.close()
