"""D-PSGD has no options of its own (its graph is `--topology` with `--weights`): its checks.
None would make it tolerate a straggler: every iteration waits for every neighbour's model
(on the same graph, adpsgd and hop do not; docs/protocols.md, "Stragglers")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetsync.topology import build

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["check"]

#: Its neighbours are `--topology`'s, weighted by `--weights` (catalog.GRAPH_PROTOCOLS).
USES_TOPOLOGY = True


def check(config: RunOptions) -> None:
    build(config.topology, config.workers, config.weights).require_doubly_stochastic()
