"""All-Reduce: average the gradients of all workers before every optimizer step.

The baseline that runs at the speed of the slowest worker. Gradients are flattened into one
buffer, divided by the world size and summed with a single `all_reduce`, as DDP's default
communication hook does, so that `allreduce` and `ddp` compute the same parameters. Floating
buffers (BatchNorm statistics) ride in the same buffer and are averaged: every worker ends
each iteration with the statistics of all workers' batches (DDP instead broadcasts rank 0's
at every forward pass, which keeps only rank 0's batches). The decisions (the divisor, the
agreed stop) are `hetsync.protocols.allreduce.core.AllReduceWorker`'s.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from hetsync.network.patterns import ring_allreduce
from hetsync.protocols.allreduce.core import (
    AllReduceWorker,
    Decision,
    Finish,
    GradientsReady,
    Reduce,
    Reduced,
    dispatch,
)
from hetsync.protocols.base import Protocol, Step
from hetsync.protocols.registry import register_protocol
from hetsync.transport.flat import ring_allreduce_bytes
from hetsync.transport.runtime import Runtime


@register_protocol("allreduce")
class AllReduce(Protocol):
    """Synchronous data-parallel SGD with gradients averaged by one all-reduce per step."""

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        self.core = AllReduceWorker(runtime.rank, runtime.world_size)
        self.link = runtime.links.direct
        self._flat: torch.Tensor | None = None
        """The gradients' buffer, reused step after step (Link.flat says why)."""
        self._step = Step(0)  # the step whose decisions are being carried out

    def before_optimizer_step(self, step: Step) -> None:
        step.begin_sync()
        self._step = step
        self._execute(self.core.handle(GradientsReady(iteration=step.iteration,
                                                      wants_stop=step.wants_stop)))

    def _execute(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            dispatch(decision, self)

    # --- the core's decisions (`AllReduceDecisionHandler`), for `_step` ----------------------
    def on_reduce(self, reduce: Reduce) -> None:
        """All-reduce the gradients, the buffers and the vote; the gradients are then the
        mean, and the core says whether to stop."""
        step = self._step
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        world = self.runtime.world_size
        if world == 1:  # alone, nothing to average: the real suites' solo reference
            self._reduced(reduce.vote)
            return
        self._flat = flat = self.link.flat(grads + buffers, float(reduce.vote), out=self._flat)
        flat[:-1].div_(reduce.divisor)
        with step.blocking():
            began = time.perf_counter()
            self.runtime.before_send()
            self.link.all_reduce(flat)
        if self.network is not None:
            nbytes = self.network.scaled(flat.numel() * flat.element_size())
            self.network.after_blocking(step, ring_allreduce(range(world), nbytes), "allreduce",
                                        time.perf_counter() - began)
        with torch.no_grad():
            self.link.unpack_into(flat[:-1], grads + buffers)
        step.bytes_sent += ring_allreduce_bytes(flat, world)
        self._reduced(round(float(flat[-1])))

    def _reduced(self, votes: int) -> None:
        self._execute(self.core.handle(Reduced(iteration=self._step.iteration, votes=votes)))

    def on_finish(self, finish: Finish) -> None:
        self._step.stop = finish.stop

    def after_optimizer_step(self, step: Step) -> None:
        """Nothing to do: the stop decision was agreed in the all-reduce."""
