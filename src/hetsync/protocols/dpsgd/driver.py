"""D-PSGD (Lian et al., NeurIPS 2017): synchronous decentralized SGD over a fixed graph.

Per iteration k each worker computes its gradient on x_k, exchanges x_k with its neighbours,
takes the weighted neighbourhood average and applies the gradient to it:

    x_{k+1} = sum_j W_ij x_{k,j} - lr * g(x_k)

(with momentum: the optimizer's own update). Both the gradient and the exchange read x_k, so
the exchange is posted when the iteration starts and runs during forward and backward; it is
waited for only after the emulated compute. W must be doubly stochastic (`--weights
metropolis` makes it so on irregular undirected graphs). The stop iteration is agreed by
flooding it in the messages (hetsync.cores.stop_agreement). The decisions (whom to send x_k
and from whom to wait for it, the weights, the stop) are `hetsync.protocols.dpsgd.core.DPSGDCore`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hetsync.network.model import Message
from hetsync.network.patterns import fan_out
from hetsync.protocols.base import Closures, Protocol, Step
from hetsync.protocols.dpsgd.core import (
    Average,
    ComputeFinished,
    Decision,
    DPSGDCore,
    Exchange,
    IterationStarted,
    ModelReceived,
    dispatch,
)
from hetsync.protocols.dpsgd.wire import ModelHeader, frame
from hetsync.protocols.registry import register_protocol
from hetsync.topology import build
from hetsync.transport.flat import BufferDrift, model_tensors
from hetsync.transport.runtime import Runtime

_TAG = 11


@dataclass(slots=True)
class _Posted:
    """An exchange in flight: x_k sent, the buffers its neighbours' x_k arrive in (by rank),
    the works of both, and the core's `Exchange` it carries out."""

    send: torch.Tensor
    received: dict[int, torch.Tensor]
    works: list[dist.Work]
    exchange: Exchange


@register_protocol("dpsgd")
class DPSGD(Protocol):
    """Synchronous decentralized SGD with neighbour model averaging."""

    closures = Closures.LOCAL  # a closure: the step from the averaged x_k

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        config = runtime.config
        self.topology = build(config.topology, runtime.world_size, config.weights)
        self.tensors = model_tensors(model)
        self.frame = frame(self.tensors)
        self.drift = BufferDrift(model)
        self.link = runtime.links.direct  # known peers: on the GPU under NCCL
        self.channel = self.open_channel(self.link)
        self.core = self._new_core(config.max_iterations)
        self._exchange: _Posted | None = None
        self._step = Step(0)  # the step whose decisions are being carried out
        self._spare: list[torch.Tensor] = []  # message buffers no exchange is using
        self._scratch: torch.Tensor | None = None  # `mixing.mix_into`'s fallback buffer, if any

    def _new_core(self, max_iterations: int | None) -> DPSGDCore:
        return DPSGDCore.of_run(self.topology, self.runtime.rank, max_iterations)

    def go_on_from(self, iteration: int) -> None:
        """Steps count from 1 again: `--max-iterations` is K - iteration of them, `iteration`
        being every worker's common base, so the flooded limit is one for all (at least one;
        the first step's stop conditions then hold). Before the first exchange is posted."""
        left = self.runtime.config.max_iterations
        if left is not None:
            self.core = self._new_core(max(1, left - iteration))

    def begin_iteration(self, step: Step) -> None:
        """Post the exchange of x_k; it runs while the gradient is computed. The first one is
        posted when needed: a model loaded after building the optimizer must be the one sent."""
        if step.iteration > 1:
            self._post(step)

    def _post(self, step: Step) -> _Posted:
        self._step = step
        self._execute(self.core.handle(IterationStarted(iteration=step.iteration)))
        assert self._exchange is not None
        return self._exchange

    def before_optimizer_step(self, step: Step) -> None:
        inflight = self._exchange or self._post(step)
        self._step = step
        send, received, exchange = inflight.send, inflight.received, inflight.exchange
        step.begin_sync()
        k = step.iteration
        decisions = self.core.handle(ComputeFinished(iteration=k, wants_stop=step.wants_stop))
        self.channel.wait(step, inflight.works)
        self._charge_network(step, exchange, [send, *received.values()])
        for j, buf in received.items():
            stop_at = ModelHeader.decode(self.frame, buf).stop_at
            decisions += self.core.handle(ModelReceived(src=j, iteration=k, stop_at=stop_at))
        self._execute(decisions)
        self._exchange = None

    def _execute(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            dispatch(decision, self)

    # --- the core's decisions (`DPSGDDecisionHandler`), for `_step` --------------------------
    def on_exchange(self, exchange: Exchange) -> None:
        """Post the exchange of x_k: it runs while the gradient is computed."""
        step = self._step
        header = ModelHeader(exchange.stop_at, self.channel.stamp()).encode()
        send = self.channel.pack(self.frame, header, self.tensors, out=self._buffer(),
                                 feedback="model")
        received = {j: self._buffer() for j in exchange.receive_from}
        works = self.channel.post(step, [(send, j) for j in exchange.send_to],
                                  [(buf, j) for j, buf in received.items()], _TAG)
        self._exchange = _Posted(send, received, works, exchange)

    def on_average(self, average_: Average) -> None:
        """Average x_k with the neighbours' x_k, all in (`before_optimizer_step`)."""
        inflight = self._exchange
        assert inflight is not None
        inputs = [(self.channel.payload(self.frame, buf), average_.weights[j])
                  for j, buf in inflight.received.items()]
        self._scratch = self.drift.mix_into(self.link, self.tensors, average_.self_weight,
                                            self.channel.payload(self.frame, inflight.send),
                                            inputs, out=self._scratch)
        self._step.stop = average_.stop
        self._spare += [inflight.send, *inflight.received.values()]  # the exchange is over

    def _buffer(self) -> torch.Tensor:
        """A message buffer: one a finished exchange left, else a new one (reused because a
        new model-sized buffer costs page faults, see Link.flat)."""
        return self._spare.pop() if self._spare else self.channel.empty(self.frame)

    def _charge_network(self, step: Step, exchange: Exchange,
                        buffers: list[torch.Tensor]) -> None:
        """The exchange is usable once the last of its messages would have arrived: the model
        sent to the out-peers and received from the in-peers, from the latest time one was
        posted (each message's `ModelHeader.posted`; `buffers`: the one sent, then those
        received)."""
        rank = self.runtime.rank

        def pattern(nbytes: float) -> list[Message]:
            return fan_out(rank, exchange.send_to, nbytes) + [
                Message(j, rank, nbytes) for j in exchange.receive_from]

        posted = max(ModelHeader.decode(self.frame, buf).posted for buf in buffers)
        self.channel.hold(step, pattern, self.channel.frame(self.frame).payload_bytes, posted)

    def close(self) -> None:
        """An exchange begun by an iteration that never ran (the script's loop ended without
        the run stopping, as every rank does at the same iteration) is finished, not left in
        flight; its average is not applied."""
        if self._exchange is not None:
            for work in self._exchange.works:
                work.wait()
            self._exchange = None

    def after_optimizer_step(self, step: Step) -> None:
        """Nothing to do: the gradient lands on the averaged model."""
