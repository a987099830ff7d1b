"""Stopping together in a decentralized run, with no collective and no coordinator.

Theory of operation. A worker of a synchronous decentralized protocol (D-PSGD) waits for each
in-neighbour's message of every iteration, so all workers must stop after the *same* iteration.
Each message carries the sender's `stop_at` (the iteration after which it will stop; infinite
while none is known). A worker whose own stop conditions hold at iteration k proposes
`stop_at = k + 1 + hops`, where `hops` bounds the number of iterations the news takes to reach
every worker (the graph's diameter; for time-varying graphs, period x (world - 1)). Receivers
keep the minimum and forward it in their next message. A worker at distance d learns a proposal
made at iteration k by iteration k + d <= k + hops < stop_at, so every worker knows the same
minimum before it is reached, and all stop after completing iteration stop_at: everyone sends
and receives the messages of that iteration and no one waits for the next.
"""

from __future__ import annotations

import math

__all__ = ["StopAgreement"]


class StopAgreement:
    """The stop iteration of one worker, agreed by flooding (see the module doc)."""

    def __init__(self, hops: int, max_iterations: int | None = None) -> None:
        if hops < 0:
            raise ValueError(f"Arg `hops` must be >= 0 (got {hops})")
        self.hops = hops
        self.stop_at: float = float(max_iterations) if max_iterations else math.inf

    def vote(self, iteration: int) -> None:
        """This worker's stop conditions hold during `iteration`."""
        self.stop_at = min(self.stop_at, iteration + 1 + self.hops)

    def merge(self, received: float) -> None:
        """A neighbour's `stop_at` arrived."""
        self.stop_at = min(self.stop_at, received)

    def should_stop(self, iteration: int) -> bool:
        """True once `iteration` (just completed) is the agreed last one."""
        return iteration >= self.stop_at
