"""Parameter server (Li et al., OSDI 2014): workers push gradients, a server applies them.

Theory of operation. The server is a background thread on rank 0, which also trains as an
ordinary worker. No extra process is needed, so the world size, the data shards and the
launcher are those of every other protocol, and the same code runs under torchrun. The cost
is that rank 0 shares its CPU (and the GIL, released while gloo waits) with the server.

The server holds the model as one flat `nn.Parameter`, a copy of rank 0's parameters (every
worker starts from them: SyncOptimizer broadcasts rank 0's model first), and an optimizer of
the worker's class and hyper-parameters. Each iteration every worker, rank 0 included, pushes

    [kind (PUSH or BYE), model version the gradient was computed on, stop vote, gradient...]

and waits for the reply, a buffer of the same size

    [new model version, staleness, stop flag, model...]

which it copies into its parameters; its own optimizer step is skipped. Remote workers use
`send(tag=PUSH_TAG)` / `recv(tag=PULL_TAG)`; the thread serves them with an any-source
`recv` (gloo only: NCCL has none). Rank 0 hands its message to the server object directly.

- `--ps-mode sync`: a round collects one gradient from every live worker for the current
  version, applies their mean in one step, and answers all of them with the new model. The
  stop votes are OR-ed over the round, so every worker stops after the same iteration.
- `--ps-mode async`: each gradient is applied as it arrives and only its sender gets the new
  model; staleness = server version at apply time - version the gradient was computed on.
  A gradient is applied scaled by 1/n, its share of the synchronous mean: n workers' pushes
  then move the model as far as one sync round, so both modes take the same learning rate
  and momentum (unscaled, 4 async workers with momentum 0.9 diverge on digits). Workers stop
  on their own.

Shutdown: in `close()` every remote worker sends BYE; the thread exits after one BYE per
remote rank, and rank 0's `close()` joins it, so no p2p is in flight at SyncOptimizer's final
barrier. A worker that leaves is no longer waited for by sync rounds. Only parameters go
through the server: buffers (BatchNorm statistics) stay local to each worker.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
from torch import nn

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.protocols import register_protocol
from hetsync.protocols.base import Protocol, Step
from hetsync.transport.flat import unflatten_into
from hetsync.transport.runtime import Runtime

PUSH_TAG, PULL_TAG = 21, 22
_PUSH, _BYE = 1.0, 2.0
_HEADER = 3  # push: kind, version, vote; reply: version, staleness, stop


class _Server:
    """The server's model and rounds; thread-safe, driven by the serving thread and rank 0."""

    def __init__(self, params: list[nn.Parameter], optimizer: torch.optim.Optimizer,
                 sync: bool, world: int) -> None:
        with torch.no_grad():
            self.param = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
        self.param.grad = torch.zeros_like(self.param)
        hyper = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        self.optimizer = type(optimizer)([self.param], **hyper)
        self.sync, self.world, self.live, self.version = sync, world, world, 0
        self.cond = threading.Condition()
        self.send_lock = threading.Lock()  # one thread at a time sends replies
        self.grad_sum = torch.zeros_like(self.param)
        self.waiting: list[int] = []  # sync: ranks whose gradient is in this round
        self.vote = False
        self.local_reply: torch.Tensor | None = None
        self.bytes_sent = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, args=(world - 1,),
                                       name="hetsync-ps", daemon=True)
        if world > 1:
            self.thread.start()

    def push(self, msg: torch.Tensor) -> torch.Tensor:
        """Rank 0's push; blocks until its reply exists (the end of the round in sync mode)."""
        with self.cond:
            self._check()
            sends = self._accept(msg, 0)
        self._send(sends)
        with self.cond:
            self.cond.wait_for(lambda: self.local_reply is not None or self.error is not None)
            self._check()
            reply, self.local_reply = self.local_reply, None
        assert reply is not None
        return reply

    def take_bytes_sent(self) -> int:
        with self.cond:
            sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    def close(self) -> None:
        """Rank 0 leaves; wait for every remote worker's BYE."""
        with self.cond:
            self.live -= 1
            sends = self._finish_round()
        self._send(sends)
        if self.thread.is_alive():
            self.thread.join()
        with self.cond:
            self._check()

    def _serve(self, remote: int) -> None:
        buf = torch.empty(_HEADER + self.param.numel(), dtype=self.param.dtype)
        try:
            while remote > 0:
                src = dist.recv(buf, src=None, tag=PUSH_TAG)
                with self.cond:
                    if buf[0] == _BYE:
                        remote, self.live = remote - 1, self.live - 1
                        sends = self._finish_round()
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

    def _accept(self, msg: torch.Tensor, src: int) -> list[tuple[int, torch.Tensor]]:
        """Take one gradient (lock held); return the replies to send to remote ranks."""
        version, grad = int(msg[1]), msg[_HEADER:]
        if self.sync:
            if version != self.version:
                raise RuntimeError(f"ps: rank {src} pushed for version {version}, "
                                   f"the round is for {self.version}")
            self.grad_sum.add_(grad)
            self.waiting.append(src)
            self.vote = self.vote or bool(msg[2] > 0)
            return self._finish_round()
        staleness = self.version - version
        self._apply(grad / self.world)  # 1/n of a step: a gradient's share of the sync mean
        return self._deliver([src], staleness, stop=False)

    def _finish_round(self) -> list[tuple[int, torch.Tensor]]:
        """Sync: apply the mean once every live worker has pushed (lock held)."""
        if not self.sync or not self.waiting or len(self.waiting) < self.live:
            return []
        self._apply(self.grad_sum.div_(len(self.waiting)))
        self.grad_sum.zero_()
        ranks, self.waiting = self.waiting, []
        stop, self.vote = self.vote, False
        return self._deliver(ranks, 0, stop)

    def _apply(self, grad: torch.Tensor) -> None:
        assert self.param.grad is not None
        self.param.grad.copy_(grad)
        self.optimizer.step()
        self.version += 1

    def _deliver(self, ranks: list[int], staleness: int,
                 stop: bool) -> list[tuple[int, torch.Tensor]]:
        header = torch.tensor([self.version, staleness, float(stop)], dtype=self.param.dtype)
        reply = torch.cat([header, self.param.detach()])
        if 0 in ranks:
            self.local_reply = reply
            self.cond.notify_all()
        return [(rank, reply) for rank in ranks if rank != 0]

    def _send(self, sends: list[tuple[int, torch.Tensor]]) -> None:
        with self.send_lock:
            for rank, reply in sends:
                dist.send(reply, rank, tag=PULL_TAG)
        if sends:
            with self.cond:
                self.bytes_sent += sum(r.numel() * r.element_size() for _, r in sends)


@register_protocol("ps")
class ParameterServer(Protocol):
    """Gradients pushed to a server thread on rank 0, which answers with the new model."""

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        if config.backend == "nccl":
            raise ConfigError("ps needs gloo: its server receives from any source")

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        if runtime.world_size > 1 and runtime.backend != "gloo":
            raise RuntimeError(f"ps needs the gloo backend (this run uses {runtime.backend})")
        self.sync = runtime.config.ps_mode == "sync"
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.version = 0
        size = _HEADER + sum(p.numel() for p in self.params)
        self.reply = torch.empty(size, dtype=self.params[0].dtype)
        self.server = (
            _Server(self.params, optimizer, self.sync, runtime.world_size)
            if runtime.rank == 0 else None
        )

    def before_optimizer_step(self, step: Step) -> None:
        step.begin_sync()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        vote = float(step.wants_stop)
        header = torch.tensor([_PUSH, self.version, vote], dtype=self.reply.dtype)
        msg = torch.cat([header, *(g.detach().reshape(-1) for g in grads)])
        with step.blocking():
            if self.server is not None:
                reply = self.server.push(msg)
            else:
                dist.send(msg, 0, tag=PUSH_TAG)
                dist.recv(self.reply, 0, tag=PULL_TAG)
                reply = self.reply
        with torch.no_grad():
            unflatten_into(reply[_HEADER:], self.params)
        self.version = int(reply[0])
        step.extra["staleness"] = float(reply[1])
        step.stop = bool(reply[2] > 0) if self.sync else step.wants_stop
        step.skip_optimizer_step = True
        if self.server is not None:  # rank 0's own push is local: count what the server sent
            step.bytes_sent += self.server.take_bytes_sent()
        else:
            step.bytes_sent += msg.numel() * msg.element_size()

    def after_optimizer_step(self, step: Step) -> None:
        """Nothing to do: the server applied the update and the stop was decided above."""

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        else:
            bye = torch.zeros_like(self.reply)
            bye[0] = _BYE
            dist.send(bye, 0, tag=PUSH_TAG)
