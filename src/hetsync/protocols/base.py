"""The one interface every protocol implements; the per-iteration record it fills in is
`hetsync.step.Step`.

The training loop (`hetsync.SyncOptimizer`) calls a protocol at three points of an iteration:

    backward() -> before_optimizer_step(step) -> optimizer.step() -> after_optimizer_step(step)

Gradient protocols (allreduce, ps) act before the optimizer step, model-averaging protocols
(D-PSGD, Hop, Prague, ...) after it. A protocol calls `step.begin_sync()` right before it first
communicates: that is where the emulated compute time and the injected slowdown are slept, so a
slow worker delays exactly the synchronisation it takes part in. Every blocking wait goes
inside `with step.blocking():` so that it is counted as synchronisation time.

`optimizer.step(closure)` (LBFGS evaluates its closure, a forward and a backward pass, several
times a step) runs as the protocol's `closures` says (`Closures`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from hetsync.faults import link_changes, parse_faults
from hetsync.network.emulator import Network, NetworkEmulator
from hetsync.step import Step
from hetsync.transport.channel import Channel, Seconds
from hetsync.transport.codec import codec
from hetsync.transport.links import Link

if TYPE_CHECKING:
    from hetsync.config import RunConfig
    from hetsync.transport.runtime import Runtime

__all__ = ["Closures", "Protocol", "Step"]


def _run_time(runtime: Runtime) -> float:
    """Seconds into the run, 0 until its clock has started (a receiver thread may ask)."""
    return runtime.elapsed() if runtime.clock_started.is_set() else 0.0


class Closures(Enum):
    """How a protocol runs `optimizer.step(closure)`, whose closure may run many times."""

    REFUSED = "refused"
    """The update is not the optimizer's own step (the parameter server's): `prepare` refuses
    an optimizer that needs a closure, and `step` a closure."""
    LOCAL = "local"
    """Every evaluation is local, the whole inner step between `before_optimizer_step` and
    `after_optimizer_step`: the model is exchanged once a step (the model-averaging ones)."""
    AVERAGED = "averaged"
    """`before_optimizer_step` after the first evaluation's backward pass, and
    `closure_evaluated` after each later one's: every evaluation's gradients are averaged,
    its loss too (by SyncOptimizer), so that every worker's optimizer, given the same
    parameters, gradients and losses, takes the same decisions (lock-step gradient ones)."""


class Protocol:
    """Base of all protocols; subclasses register with `@register_protocol(name)`."""

    name: ClassVar[str]
    closures: ClassVar[Closures] = Closures.REFUSED
    """How `optimizer.step(closure)` runs (`Closures`); refused unless a protocol says how."""

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        self.runtime = runtime
        self.model = model
        self.optimizer = optimizer
        config = runtime.config
        self.network: Network = NetworkEmulator.for_run(
            config.network, config.payload, runtime.world_size, model,
            link_changes(parse_faults(config.fault)), partial(_run_time, runtime))
        """The emulated network (`--network`; `FreeNetwork`: nothing is delayed)."""
        self.codec = codec(runtime.config.compress)
        self.codec_time = Seconds()
        """Every channel's encoding and decoding, for the rows (`codec_s`)."""

    def open_channel(self, link: Link) -> Channel:
        """The channel of this worker's traffic on `link`: every message's duties."""
        return Channel(link, self.runtime, self.network, self.codec, self.codec_time)

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        """Raise ConfigError if the run's options do not suit this protocol (before spawning)."""

    @classmethod
    def ends_alone(cls, config: RunConfig) -> bool:
        """Whether a worker may end its loop while the others still step (each stops alone),
        so that `hetsync.data` may deal a faster worker more of an epoch. False, the default:
        lock-step, every worker in every step, and equal shares (a worker that ran out early
        would leave the others waiting for it)."""
        return False

    def begin_iteration(self, step: Step) -> None:
        """Called before the forward pass of `step` (for hooks that fire inside backward())."""

    def before_optimizer_step(self, step: Step) -> None:
        """Called after backward(), before optimizer.step()."""

    def closure_evaluated(self, step: Step) -> None:
        """`Closures.AVERAGED`: the closure ran again within `step` (its backward pass is
        done): average its gradients as `before_optimizer_step` did the first evaluation's
        (the stop was agreed with those)."""
        raise NotImplementedError(f"{self.name}: closures are {self.closures.value}")

    def after_optimizer_step(self, step: Step) -> None:
        """Called after optimizer.step(); model averaging happens here."""
        step.begin_sync()
        step.stop = step.wants_stop

    def model_lock(self) -> AbstractContextManager[None]:
        """Held while the training thread reads the model whole (a snapshot, a checkpoint): a
        protocol whose own threads write into the model (AD-PSGD's serving) holds them off
        meanwhile. The others write it on the training thread, or while that thread waits
        for them (Prague's overlapped merge): nothing to hold."""
        return nullcontext()

    def loop_ended(self, step: Step) -> None:
        """The script's loop ended before the run stopped (its epochs ran out): `step` was
        begun and will not run. A protocol whose workers wait for each other until they agree
        to stop ends this worker's part here, so that `close()` leaves no peer waiting."""

    def go_on_from(self, iteration: int) -> None:
        """A resumed run goes on, the protocol's steps counting from 1 again, and
        `--max-iterations` K counting them from `iteration`, the same on every worker (a
        launched resume's earliest checkpoint): stop logic that foresees K counts K -
        `iteration` steps left, as every worker does."""

    def state_dict(self) -> dict[str, Any]:
        """What this worker's side of the protocol must keep across a checkpoint and resume:
        state a resumed run cannot rebuild from the models. Synchronisation state (tokens,
        queues, groups, rounds) is not in it: a resumed run starts that afresh."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s, before the first iteration, after the model's own state
        has been loaded (a protocol may also refresh what it derived from the model)."""

    def close(self) -> None:
        """Release threads and buffers; the process group is torn down by the caller."""
