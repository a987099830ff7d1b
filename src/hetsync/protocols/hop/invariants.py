"""What the simulator's fuzz checks of Hop beyond the promises every protocol keeps
(hetsync.simulator.fuzz): the staleness bound, which skipping lifts on purpose."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetsync.simulator.world import Simulation

__all__ = ["check"]


def check(sim: Simulation) -> Mapping[str, int]:
    """Without `--skip`, no worker used an update more than `--staleness` iterations old."""
    if sim.config.skip:
        return {}
    bound = sim.config.staleness or 0
    old = max(row["staleness"] for worker in sim.workers for row in worker.rows)
    assert old <= bound, f"hop used an update {old} iterations old (bound {bound})"
    return {}
