"""Prague (Luo et al., ASPLOS'20): Partial All-Reduce among groups of workers.

Theory of operation. After its local step a worker averages its model with a *group* of
workers (P-Reduce, hetsync.protocols.prague.preduce), then starts its next step. Who averages
with whom comes from one of two places, and each mode is a module:

- `--schedule random` (default): the Group Generator, a service on rank 0 (`gg_service`);
  each worker P-Reduces with the groups it forms between its steps (`random_groups`), or,
  with `--overlap`, beside the compute on a communication thread (`overlapped`).
- `--schedule static`: a periodic sequence of partitions (`static_mode`), no GG traffic and
  no conflicts; meant for homogeneous clusters.

This module only picks the mode; the P-Reduce itself is `averaging.GroupAverager`'s.

Where the time goes (rows' `extra`, seconds per iteration): `gg_wait_s` waiting for the GG's
answer, of which `gg_hold_s` the GG held the request for a group to form (ready policy);
`wake_s` from the answer's arrival on the receiving thread to the training thread running;
`preduce_s` the P-Reduces, waits for late members included; with overlap `overlap_wait_s`
the training thread's wait for the previous request's group, and `preduce_s` is the
communication thread's (not on the training thread's path).

Every wait is bounded by `--hang-timeout`, and its error names what was awaited.

Lost workers (`--on-failure continue`, hetsync.transport.lost_workers): the GG hears of each
from a watcher and puts it in no later group (`WorkerLost`); a group it was already in runs
without it, its P-Reduce averaging over the members whose buffers arrived (only ``mesh`` can
do that, so it is the P-Reduce used). Rank 0 hosts the GG: its loss ends the run.

Compression (`--compress`): the models travel encoded in a mesh P-Reduce (``auto`` is the
mesh then; ``ring``, ``leader`` and ``subgroup`` are refused), every member averaging the
decoded ones (hetsync.protocols.prague.preduce); the Group Generator's messages stay exact.
"""

from __future__ import annotations

import torch
from torch import nn

from hetsync.config import RunConfig
from hetsync.protocols.base import Closures, Protocol, Step
from hetsync.protocols.prague.driver.averaging import GroupAverager
from hetsync.protocols.prague.driver.overlapped import OverlappedGroups
from hetsync.protocols.prague.driver.random_groups import RandomGroups
from hetsync.protocols.prague.driver.static_mode import StaticMode
from hetsync.protocols.registry import register_protocol
from hetsync.transport.flat import model_tensors
from hetsync.transport.runtime import Runtime


@register_protocol("prague")
class Prague(Protocol):
    """Model averaging within groups: random groups from a Group Generator, or static ones."""

    closures = Closures.LOCAL  # a closure: a local step, then the group average

    @classmethod
    def ends_alone(cls, config: RunConfig) -> bool:
        return config.schedule != "static"  # the Group Generator groups whoever is left

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        config = runtime.config
        self.channel = self.open_channel(runtime.links.direct)  # known peers: NCCL on a GPU
        self.averager = GroupAverager(runtime, model_tensors(model), self.channel)
        self.mode: StaticMode | RandomGroups
        if config.schedule == "static":
            self.mode = StaticMode(runtime, self.averager)
        else:
            gg_channel = self.open_channel(runtime.links.host)  # received on threads: gloo
            self.mode = (OverlappedGroups if config.overlap else RandomGroups)(
                runtime, self.averager, gg_channel)
            self.mode.start()

    def after_optimizer_step(self, step: Step) -> None:
        step.begin_sync()
        self.mode.after_step(step)

    def go_on_from(self, iteration: int) -> None:
        """The static schedule's steps count from 1 again (random groups need nothing)."""
        if isinstance(self.mode, StaticMode):
            self.mode.go_on_from(iteration)

    def loop_ended(self, step: Step) -> None:
        """The script's loop ended without a last step (its epochs ran out): the step begun
        ends as a last one without an update, so that no peer waits for this worker."""
        step.wants_stop = True
        self.mode.loop_ended(step)

    def close(self) -> None:
        """End the mode (with the GG: say goodbye; rank 0 waits until every worker has)."""
        self.mode.close()
        self.averager.close()
