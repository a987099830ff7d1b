"""Prague on a static schedule (`--schedule static`): a periodic sequence of partitions, no
Group Generator and no conflicts. Every worker runs the same steps in lock-step, so all stop
after the same step: after `--max-iterations`, which every worker foresees, or else after a
step proposed far enough ahead in the control store by the first worker whose other stop
conditions hold; every worker reads it before each step (`StaticStop`)."""

from __future__ import annotations

from hetsync.protocols.base import Step
from hetsync.protocols.prague.driver.averaging import GroupAverager
from hetsync.protocols.prague.static_schedule import StaticStop, static_group, static_schedule
from hetsync.transport.runtime import Runtime

__all__ = ["StaticMode"]

_STOP_KEY = "prague/stop_at"


class StaticMode:
    """A worker's steps on the static schedule: after each, the P-Reduce its partition says."""

    def __init__(self, runtime: Runtime, averager: GroupAverager) -> None:
        self.runtime, self.rank, self.averager = runtime, runtime.rank, averager
        self.period = static_schedule(runtime.world_size, runtime.config.workers_per_node)
        # the period times the number of workers bounds how far apart two workers can be
        self.stopping = StaticStop(len(self.period) * runtime.world_size,
                                   runtime.config.max_iterations)

    def after_step(self, step: Step) -> None:
        store, stopping = self.runtime.store, self.stopping
        proposal = stopping.proposal(step.iteration, step.wants_stop)
        if proposal is not None:
            self._learn_stop(store.compare_set(_STOP_KEY, "", str(proposal)), step.iteration)
        elif stopping.needs_news(step.iteration) and store.check([_STOP_KEY]):
            self._learn_stop(store.get(_STOP_KEY), step.iteration)
        members = static_group(self.period, step.iteration, self.rank)
        step.extra["groups"] = [[step.iteration, *members]]
        self.averager.preduce(members, step)
        step.stop = stopping.stops_after(step.iteration)

    def loop_ended(self, step: Step) -> None:
        """Propose a stop and keep averaging (no update) until the agreed step: the others
        may still have data."""
        self.after_step(step)
        while not step.stop:
            step = Step(iteration=step.iteration + 1, wants_stop=True, on_phase=step.on_phase)
            self.after_step(step)

    def go_on_from(self, iteration: int) -> None:
        """The schedule's steps count from 1 again: `--max-iterations` is K - iteration of
        them, `iteration` being every worker's common base, so all stop after the same step
        of the schedule (counted from each worker's own checkpoint, a worker went on into a
        group whose other members had stopped: a deadlock). At least one step; the first
        step's stop conditions then hold."""
        left = self.runtime.config.max_iterations
        if left is not None:
            self.stopping = StaticStop(self.stopping.lead, max(1, left - iteration))

    def _learn_stop(self, agreed: bytes, iteration: int) -> None:
        try:
            self.stopping.learn(int(agreed.decode()), iteration)
        except RuntimeError as error:
            raise RuntimeError(f"prague: rank {self.rank} {error}") from None

    def close(self) -> None:
        """Nothing to end: no threads, no Group Generator."""
