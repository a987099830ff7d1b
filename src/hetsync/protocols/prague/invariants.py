"""What the simulator's fuzz checks of Prague beyond the promises every protocol keeps
(hetsync.simulator.fuzz): the groups, as the Group Generator promises them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetsync.simulator.world import Simulation

__all__ = ["check"]


def check(sim: Simulation) -> Mapping[str, int]:
    """Every group run by all its members (but a lost one), in id order on each (the Group
    Generator's global order), with members that agree on who is in it. A static schedule's
    groups come from no Group Generator (its ids repeat each period): they are only counted."""
    members: dict[int, tuple[int, ...]] = {}
    ran: dict[int, set[int]] = {}
    ordered = sim.config.schedule != "static"
    for worker in sim.workers:
        ids = [group[0] for row in worker.rows for group in row["groups"]]
        if ordered:
            assert ids == sorted(ids) and len(set(ids)) == len(ids), (
                f"rank {worker.rank} ran groups out of the global order: {ids}")
        for row in worker.rows:
            for group_id, *group in row["groups"]:
                key = tuple(group)
                assert members.setdefault(group_id, key) == key or not ordered, (
                    f"group {group_id}: members disagree ({members[group_id]}, {key})")
                ran.setdefault(group_id, set()).add(worker.rank)
    if ordered:
        for group_id, ranks in ran.items():
            assert set(members[group_id]) - ranks <= sim.dead, (
                f"group {group_id} {members[group_id]} was run by {sorted(ranks)} only")
    return {"groups": len(ran)}
