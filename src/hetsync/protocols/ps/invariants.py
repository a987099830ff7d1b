"""What the simulator's fuzz checks of the parameter server beyond the promises every protocol
keeps (hetsync.simulator.fuzz): how many iterations its workers complete."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetsync.simulator.world import Simulation

__all__ = ["completed"]


def completed(sim: Simulation, iterations: int) -> None:
    """Every survivor completed `iterations`; with backups the stop is agreed at a round, so a
    worker whose gradient was dropped goes on to the round that carries it, one iteration past
    its own, and every worker ends on the server's final model."""
    done = [len(worker.rows) for worker in sim.survivors]
    if sim.config.ps_backup:
        assert iterations <= max(done) <= iterations + 1 and min(done) >= 1, (
            f"iterations completed: {done}")
    else:
        assert done == [iterations] * len(done), f"iterations completed: {done}"
