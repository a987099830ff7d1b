"""Local SGD: each worker steps alone, and every `--local-steps` iterations all average.

The decisions (when to average, the agreed stop) are
`hetsync.protocols.localsgd.core.LocalSGDWorker`'s. An average is one sum-all-reduce of the
flat model (floating parameters, then floating buffers such as BatchNorm statistics, each
divided by the world size first) with the stop vote and the `moved` flag in its last two
elements, over the direct link, after the optimizer step of the round's last iteration.
With `--outer-optimizer nesterov` (DiLoCo) the parameters take the outer step from the
anchor, the model the round began from (`outer_nesterov`); buffers take the mean either way,
as they are statistics, not parameters. The inner optimizer's state (momentum, Adam's
moments) stays each worker's own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetsync.protocols.base import Closures, Protocol, Step
from hetsync.protocols.localsgd.core import (
    Average,
    Averaged,
    Decision,
    Finish,
    LocalSGDWorker,
    LoopEnded,
    StepDone,
    dispatch,
    outer_nesterov,
)
from hetsync.protocols.registry import register_protocol
from hetsync.transport.flat import model_tensors
from hetsync.transport.runtime import Runtime


@register_protocol("localsgd")
class LocalSGD(Protocol):
    """Local SGD with periodic model averaging; DiLoCo with `--outer-optimizer nesterov`."""

    closures = Closures.LOCAL  # a closure: a local step, then the round

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        config = runtime.config
        self.link = runtime.links.direct
        self.channel = self.open_channel(self.link)
        self.tensors = model_tensors(model)
        params = [p for p in model.parameters() if p.is_floating_point()]
        self.params = self.tensors[:len(params)]  # model_tensors puts them first
        self.n_params = sum(p.numel() for p in params)
        self.core = self._new_core(config.max_iterations)
        self.outer = config.outer_optimizer == "nesterov"
        self._anchor: torch.Tensor | None = None  # DiLoCo: the round's first model, flat
        self._buffer: torch.Tensor | None = None  # DiLoCo: the outer momentum, flat
        self._step: Step | None = None  # the step whose decisions are being carried out
        self._mean: torch.Tensor | None = None  # the round's mean, for its `Finish`
        self._round: torch.Tensor | None = None  # the round's buffer, reused round after round

    def _new_core(self, max_iterations: int | None) -> LocalSGDWorker:
        return LocalSGDWorker(self.runtime.rank, self.runtime.world_size,
                              self.runtime.config.local_steps, max_iterations)

    def go_on_from(self, iteration: int) -> None:
        """Steps count from 1 again: `--max-iterations` is K - iteration of them, `iteration`
        being every worker's common base, so every worker's last round is the same one (at
        least one step). The rounds start afresh from the loaded models."""
        left = self.runtime.config.max_iterations
        if left is not None:
            self.core = self._new_core(max(1, left - iteration))

    def before_optimizer_step(self, step: Step) -> None:
        """DiLoCo's first anchor is taken here, before the first step: a model loaded after
        the optimizer was built must be the one the first round began from."""
        if self.outer and self._anchor is None:
            self._anchor = self.link.flat(self.params)

    def after_optimizer_step(self, step: Step) -> None:
        step.begin_sync()
        self._step = step
        self._execute(self.core.handle(StepDone(iteration=step.iteration,
                                                wants_stop=step.wants_stop)))

    def loop_ended(self, step: Step) -> None:
        """Average the local steps since the last round, voting to stop (see the core)."""
        self._step = None
        self._execute(self.core.handle(LoopEnded(iteration=step.iteration - 1)))

    def _execute(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            dispatch(decision, self)

    # --- the core's decisions (`LocalSGDDecisionHandler`), for `_step` ---------------------
    def on_average(self, average: Average) -> None:
        """Run the round `average` asks for. `_step` is None at a loop's end: no row is
        written, and the worker is already closing."""
        step, world = self._step, self.runtime.world_size
        flat = self._round = self.link.flat(self.tensors, float(average.vote),
                                            float(average.moved), out=self._round)
        flat[:-2].div_(world)
        self.channel.all_reduce(step, flat, "localsgd", exact_tail=2)
        votes, moved = (round(float(word)) for word in flat[-2:])
        self._mean = flat[:-2]
        self._execute(self.core.handle(Averaged(round=average.round, votes=votes, moved=moved)))

    def on_finish(self, finish: Finish) -> None:
        """After a round, its mean (or DiLoCo's outer step from it) becomes the model."""
        mean, self._mean = self._mean, None
        if mean is not None:
            if self.outer and finish.outer_step:
                self._outer_step(mean[:self.n_params])
            with torch.no_grad():
                self.link.unpack_into(mean, self.tensors)
        if self._step is not None:
            self._step.stop = finish.stop

    def _outer_step(self, mean: torch.Tensor) -> None:
        """DiLoCo: the parameters' part of `mean` becomes the outer step from the anchor,
        which then moves there. No anchor yet: this worker took no step (its loop ended
        before the first), so its model is the one the round began from."""
        if self._anchor is None:
            self._anchor = self.link.flat(self.params)
        if self._buffer is None:
            self._buffer = torch.zeros_like(self._anchor)
        mean.copy_(outer_nesterov(self._anchor, mean, self._buffer,
                                  self.runtime.config.outer_lr,
                                  self.runtime.config.outer_momentum))
        self._anchor.copy_(mean)

    def state_dict(self) -> dict[str, Any]:
        """DiLoCo's outer momentum; the anchor is the loaded model (a round starts there)."""
        return {"outer_momentum": None if self._buffer is None else self._buffer.cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("outer_momentum")
        if saved is not None:
            self._buffer = self.link.flat([saved])
