"""All-Reduce: average the gradients of all workers before every optimizer step.

The baseline that runs at the speed of the slowest worker. Gradients are flattened into one
buffer, divided by the world size and summed with a single `all_reduce`, as DDP's default
communication hook does, so that `allreduce` and `ddp` compute the same parameters. Floating
buffers (BatchNorm statistics) ride in the same buffer and are averaged: every worker ends
each iteration with the statistics of all workers' batches (DDP instead broadcasts rank 0's
at every forward pass, which keeps only rank 0's batches). The decisions (the divisor, the
agreed stop) are `hetsync.protocols.allreduce.core.AllReduceWorker`'s.

The mean is not copied back: after a reduction each parameter's `.grad` becomes its slice
of that buffer (torch's DDP does the same with `gradient_as_bucket_view`). `zero_grad()` is
left as torch's: set to None (its default), the next backward pass steals fresh gradients,
gathered by one copy; zeroed in place (`set_to_none=False`), it accumulates into the slices
and the next step gathers nothing. hetsync does not zero them in place for the user: autograd
computes each gradient into a new tensor either way, and adding it into a kept one costs a
pass over the model more than taking it (tried: a 45 MB model's compute step went from
120-128 to 161-166 ms on this 2-core VM, more than the copy it saves).
"""

from __future__ import annotations

import torch
from torch import nn

from hetsync.protocols.allreduce.core import (
    AllReduceWorker,
    Decision,
    Finish,
    GradientsReady,
    Reduce,
    Reduced,
    Regrouped,
    dispatch,
)
from hetsync.protocols.base import Closures, Protocol, Step
from hetsync.protocols.registry import register_protocol
from hetsync.transport.contiguous import span
from hetsync.transport.membership import Regrouped as NewGeneration
from hetsync.transport.runtime import Runtime


@register_protocol("allreduce")
class AllReduce(Protocol):
    """Synchronous data-parallel SGD with gradients averaged by one all-reduce per step."""

    closures = Closures.AVERAGED  # a closure's later evaluations: `closure_evaluated`

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        members = runtime.members()
        self.core = AllReduceWorker(members.index(runtime.rank), len(members))
        self.link = runtime.links.direct
        self.channel = self.open_channel(self.link)
        self._flat: torch.Tensor | None = None
        """The reduction's buffer, reused step after step; the gradients are its slices."""
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
        mean, and the core says whether to stop. Where the run's membership changes in the
        collective (`--on-failure rejoin`), the core decides the contribution again."""
        self._reduced(self._all_reduce(self._step, reduce.divisor, reduce.vote))

    def _regrouped(self, change: NewGeneration) -> int:
        """The core's divisor in the run's new generation (its `Reduce` again)."""
        world = len(change.generation.members)
        decisions = self.core.handle(Regrouped(iteration=self.core.iteration, world=world))
        return next((d.divisor for d in decisions if isinstance(d, Reduce)), self.core.divisor)

    def closure_evaluated(self, step: Step) -> None:
        """A closure's later evaluation: its gradients and buffers averaged as the first's,
        with the core's divisor; its vote is void (the stop was agreed with the first)."""
        self._all_reduce(step, self.core.divisor, 0)

    def _all_reduce(self, step: Step, divisor: int, vote: int) -> int:
        """Average the gradients and buffers; returns the votes."""
        params = self._params()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        if self.link.world_size() == 1:  # alone, nothing to average: the solo reference
            return vote
        flat, held = self._gather(grads, buffers, vote)
        kept = flat.clone() if self.runtime.membership is not None else None
        while True:
            flat[:-1].div_(divisor)
            try:
                self.channel.all_reduce(step, flat, "allreduce", exact_tail=1)
                break
            except NewGeneration as change:  # partly reduced: contributed again, from `kept`
                assert kept is not None
                flat.copy_(kept)
                divisor = self._regrouped(change)
                if self.link.world_size() == 1:
                    break
        with torch.no_grad():
            self._scatter(flat, params, grads, buffers, held)
        return round(float(flat[-1]))

    def _params(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @staticmethod
    def _holds(flat: torch.Tensor, grads: list[torch.Tensor]) -> bool:
        """Whether `grads` are, in order, the slices at the start of `flat`."""
        whole = span(grads)
        return (whole is not None and whole.data_ptr() == flat.data_ptr()
                and whole.numel() == sum(g.numel() for g in grads))

    def _gather(self, grads: list[torch.Tensor], buffers: list[torch.Tensor],
                vote: int) -> tuple[torch.Tensor, bool]:
        """The reduction's buffer, reused (Link.flat says why): the gradients, the floating
        buffers, the vote; and whether the gradients were in it already (from the last step:
        not copied)."""
        flat = self._flat
        if flat is not None and self._holds(flat, grads):
            n = sum(g.numel() for g in grads)
            if buffers:
                self.link.write(flat[n:-1], buffers)
            flat[-1] = vote
            return flat, True
        if flat is not None and any(
                g.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
                for g in grads):
            flat = None  # some in it, some not: gathered into a new one, not onto itself
        self._flat = flat = self.link.flat(grads + buffers, float(vote), out=flat)
        return flat, False

    def _scatter(self, flat: torch.Tensor, params: list[nn.Parameter],
                 grads: list[torch.Tensor], buffers: list[torch.Tensor], held: bool) -> None:
        """Give the reduced buffers back, and make each gradient its slice of `flat` (no copy;
        `held`: they are already) where it can be one: on the buffer's device, in its dtype,
        for a contiguous parameter (a gradient is laid out as its parameter)."""
        n = sum(g.numel() for g in grads)
        if buffers:
            self.link.unpack_into(flat[n:-1], buffers)
        if held:
            return
        if all(p.is_contiguous() and p.device == flat.device and p.dtype == flat.dtype
               for p in params):
            pieces = flat[:n].split([p.numel() for p in params])
            for p, piece in zip(params, pieces, strict=True):
                p.grad = piece.view_as(p)
        else:
            self.link.unpack_into(flat[:n], grads)

    def _reduced(self, votes: int) -> None:
        self._execute(self.core.handle(Reduced(iteration=self._step.iteration, votes=votes)))

    def on_finish(self, finish: Finish) -> None:
        self._step.stop = finish.stop

    def after_optimizer_step(self, step: Step) -> None:
        """Nothing to do: the stop decision was agreed in the all-reduce."""
