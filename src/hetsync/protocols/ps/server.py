"""The parameter server's own side: its model, its rounds and its serving thread, on rank 0.

The server holds a copy of each of rank 0's trainable parameters (every worker starts from
them: SyncOptimizer broadcasts rank 0's model first) in an optimizer of the worker's class with
the same param groups, so per-group settings (no weight decay on biases) hold. Before every
step it copies each group's current hyper-parameters (all but "params") from rank 0's
optimizer, the user's: an lr scheduler stepped on the worker side, or an lr set by hand, takes
effect at the server. The server's model and every message live in host memory whatever the
model's device (staged by one copy each way; on CPU the same code copies nothing).

Remote workers' pushes arrive on one receiving thread per worker (`PeerStreams`), and the
serving thread takes them one at a time: each push, then each reply, occupies rank 0's NIC for
its modelled time (the parameter server's hot link). Rank 0 hands its push over in-process
(`push`, as its own tensors where it can: `LocalPush`) and takes its reply (`reply`) once the
remote workers' replies to the same answer are sent.

On the wire (`--compress`): a remote push is decoded before it is summed. A reply is encoded
once and sent to every rank it answers, rank 0 included, so that all of a round's workers hold
the same model; with no error feedback, since each reply replaces the worker's model whole
(its rounding does not add up over replies) and the server steps its exact model.

Every decision comes from `hetsync.protocols.ps.core.PSServerCore`; shutdown and lost workers
are the driver's module doc's.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from hetsync.network.patterns import point_to_point
from hetsync.protocols.ps.core import (
    Accumulate,
    Answer,
    Apply,
    Bye,
    PSServerCore,
    Push,
    ServerDecision,
    WorkerLost,
    dispatch_server,
)
from hetsync.protocols.ps.wire import PULL_TAG, PUSH_TAG, PushHeader, ReplyHeader, frame
from hetsync.transport.channel import Channel
from hetsync.transport.contiguous import views
from hetsync.transport.flat import unflatten_into
from hetsync.transport.peer_streams import PeerStreams

__all__ = ["LocalPush", "Server", "host_flat", "trainable"]


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


def host_flat(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The tensors' values, detached, in one new 1-D host tensor of `dtype` (empty for none):
    the server's model and every message live in host memory, whatever the model's device."""
    return torch.cat([torch.zeros(0, dtype=dtype),
                      *(t.detach().reshape(-1).to(dtype=dtype, device="cpu") for t in tensors)])


def trainable(optimizer: torch.optim.Optimizer) -> list[list[nn.Parameter]]:
    """The optimizer's parameters that go through the server, group by group."""
    return [[p for p in group["params"] if p.requires_grad] for group in optimizer.param_groups]


@dataclass(frozen=True, slots=True)
class LocalPush:
    """Rank 0's push as its own tensors: the server adds them into its sums as they are,
    with no message packed first (a pass over the model fewer on rank 0, a 45 MB copy)."""

    header: PushHeader
    grads: list[torch.Tensor]
    delta: torch.Tensor


class Server:
    """The server's model and rounds; thread-safe, driven by the serving thread and rank 0.

    `optimizer` is rank 0's: the server keeps one copy of each of its trainable parameters,
    in an optimizer of its class with the same groups, and reads the groups' current
    hyper-parameters from it before every step. `buffers` are rank 0's floating buffers.
    `channel` is rank 0's channel to the workers: the server receives, replies and charges
    the network through it."""

    def __init__(self, optimizer: torch.optim.Optimizer, buffers: list[torch.Tensor],
                 core: PSServerCore, channel: Channel) -> None:
        self.source, self.channel = optimizer, channel
        groups = trainable(optimizer)
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
        self._sum_views = views(self.grad_sum, self.params)  # also where `LocalPush` grads go
        # The gradients are these views where every parameter has its dtype: the step reads
        # the mean where it was made, with no copy of the model a round.
        self._grads_are_views = all(p.dtype == self.dtype for p in self.params)
        self.grads = (self._sum_views if self._grads_are_views
                      else [torch.zeros_like(p) for p in self.params])
        for p, g in zip(self.params, self.grads, strict=True):
            p.grad = g
        self.buffers = host_flat(buffers, self.dtype)
        self.version = 0
        self.core = core
        world = core.world
        self.cond = threading.Condition()
        self.send_lock = threading.Lock()  # one thread at a time sends replies
        self.frame = frame(self.size + self.buffers.numel(), self.dtype)
        self._wire_bytes = channel.frame(self.frame).payload_bytes
        """A push's or reply's payload on the wire: what the network is charged for."""
        self.delta_sum = torch.zeros_like(self.buffers)
        self._summed = False  # whether the sums hold a push since the last `Apply`
        self.local_reply: torch.Tensor | None = None
        self._replies: list[torch.Tensor] = []  # reply buffers no send or rank 0 still reads
        self._readers: dict[int, int] = {}  # per reply in use (by id): sends and reads left
        self._push: torch.Tensor | LocalPush | None = None  # what `_execute`'s decisions answer
        self._sent = 0  # bytes of replies sent since rank 0 last took the count
        self.error: BaseException | None = None
        self.remote = set(range(1, world))
        """Remote workers that have neither said goodbye nor been lost."""
        self.thread = threading.Thread(target=self._serve, name="hetsync-ps", daemon=True)
        if world > 1:
            self.thread.start()
        if channel.runtime.lost is not None:
            channel.runtime.lost.subscribe(self._on_lost)

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
            return host_flat([*self.params, self.buffers], self.dtype)

    def takes_tensors(self, grads: list[torch.Tensor]) -> bool:
        """Whether rank 0 may push `grads` as they are (`LocalPush`): on the host, in the
        server's dtype, so that adding them is what adding a packed message would be."""
        return all(g.device.type == "cpu" and g.dtype == self.dtype for g in grads)

    def push(self, push: torch.Tensor | LocalPush) -> None:
        """Rank 0's push, a message in the model's frame (it never travels: not encoded) or
        its tensors, read before this returns; its reply is `reply()`'s."""
        with self.cond:
            self._check()
            sends = self._accept(push, 0)
        self._send(sends)

    def reply(self) -> torch.Tensor:
        """Rank 0's reply to its push, once it exists (the end of the round in sync mode): a
        message on the wire, read through the channel; `release` it once read."""
        with self.cond:
            self.cond.wait_for(lambda: self.local_reply is not None or self.error is not None)
            self._check()
            reply, self.local_reply = self.local_reply, None
        assert reply is not None
        return reply

    def release(self, reply: torch.Tensor) -> None:
        """Rank 0 has read the reply `reply` returned."""
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

    def take_sent(self) -> int:
        """The bytes of the replies sent since the last call (rank 0's row counts them)."""
        with self.cond:
            sent, self._sent = self._sent, 0
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
            pushes = PeerStreams(self.channel.link, self.remote, PUSH_TAG,
                                 partial(self.channel.empty, self.frame),
                                 lambda msg: PushHeader.decode(self.frame, msg).bye, reuse=True,
                                 name="hetsync-ps")
            for src, buf in pushes:
                bye = PushHeader.decode(self.frame, buf).bye
                if not bye:  # pushes queue at rank 0's NIC
                    self.channel.busy_with(partial(point_to_point, src, 0), self._wire_bytes)
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

    def _accept(self, msg: torch.Tensor | LocalPush, src: int) -> list[tuple[int, torch.Tensor]]:
        """Take one gradient and buffer change (lock held); return the replies to send to
        remote ranks."""
        header = msg.header if isinstance(msg, LocalPush) else PushHeader.decode(self.frame, msg)
        push = Push(rank=src, version=header.version, vote=header.vote)
        return self._execute(self.core.handle(push), msg)

    def _leave(self, rank: int) -> list[tuple[int, torch.Tensor]]:
        """`rank` left (lock held): sync rounds stop waiting for it."""
        return self._execute(self.core.handle(Bye(rank=rank)), None)

    def _execute(self, decisions: list[ServerDecision],
                 msg: torch.Tensor | LocalPush | None) -> list[tuple[int, torch.Tensor]]:
        """Carry out the core's decisions about `msg`, the push they answer (lock held);
        return the replies to send to remote ranks."""
        self._push = msg
        sends = [send for decision in decisions for send in dispatch_server(decision, self)]
        self._push = None
        return sends

    # --- the core's decisions (`ServerDecisionHandler`): the replies to send ------------------
    def on_accumulate(self, decision: Accumulate) -> list[tuple[int, torch.Tensor]]:
        assert self._push is not None
        if isinstance(self._push, LocalPush):
            parts = [*zip(self._sum_views, self._push.grads, strict=True),
                     (self.delta_sum, self._push.delta)]
        else:
            payload = (self.frame.payload(self._push) if decision.rank == 0  # handed over
                       else self.channel.payload(self.frame, self._push))
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
        reply = self.channel.pack(self.frame, header.encode(), [*self.params, self.buffers],
                                  out=self._replies.pop() if self._replies else None)
        self._readers[id(reply)] = len(answer.ranks)
        # Rank 0 takes its reply last, once the remote ones are sent (`_send`): its copy of
        # the model out of the reply then does not share the CPU with the sends (on one
        # machine, a 45 MB reply went out in 21 ms beside it, 13 ms alone), and a sync round
        # waits for the last remote worker anyway, whose reply it now gets with.
        return [(rank, reply) for rank in sorted(answer.ranks, key=lambda rank: rank == 0)]

    def _send(self, sends: list[tuple[int, torch.Tensor]]) -> None:
        """Send the replies to remote ranks, then hand rank 0 its own (`reply`), also when a
        send fails. A reply to a rank lost meanwhile is dropped: no one to reply to."""
        remote = [(rank, reply) for rank, reply in sends if rank != 0]
        sent = 0
        try:
            with self.send_lock:
                for rank, reply in remote:  # replies leave rank 0's NIC one by one
                    self.channel.busy_with(partial(point_to_point, 0, rank), self._wire_bytes)
                    if self.channel.send(None, reply, rank, PULL_TAG):
                        sent += reply.numel() * reply.element_size()
        finally:
            with self.cond:
                for rank, reply in sends:
                    if rank == 0:
                        self.local_reply = reply
                        self.cond.notify_all()
        if remote:
            with self.cond:
                self._sent += sent
                for _, reply in remote:
                    self._read(reply)
