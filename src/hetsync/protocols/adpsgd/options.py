"""AD-PSGD's options (`--adpsgd-mode`) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetsync.errors import ConfigError
from hetsync.protocols.option_field import option
from hetsync.topology import build, cut_by_loss

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["Options", "check", "tolerate_loss"]

#: Its neighbours are `--topology`'s, weighted by `--weights` (catalog.GRAPH_PROTOCOLS).
USES_TOPOLOGY = True


@dataclass
class Options:
    adpsgd_mode: str = option("bipartite", choices=("bipartite", "naive"),
                              help="AD-PSGD: bipartite (deadlock-free) or naive (can deadlock; "
                              "for comparison)")
    """Naive: every worker active, as the paper's algorithm without its bipartite split."""
    adpsgd_max_gap: int = option(0, at_least=0,
                                 help="AD-PSGD: a passive worker's step waits until its clients "
                                 "are at most this many iterations behind it, so that serving "
                                 "them is not starved by its own compute (0: unbounded, the "
                                 "paper's)")
    """A passive worker's bounded lead over its clients (`ADPSGDCore`'s module doc)."""


def check(config: RunOptions) -> None:
    if config.adpsgd_max_gap and config.adpsgd_mode == "naive":
        raise ConfigError("--adpsgd-max-gap needs --adpsgd-mode bipartite (in naive mode every "
                          "worker is active too, and a bounded lead could wait in a cycle)")
    topology = build(config.topology, config.workers, config.weights)
    edge = next(((i, j) for i, j in topology.graph.edges if i % 2 == j % 2), None)
    if config.adpsgd_mode == "bipartite" and config.workers > 1 and edge is not None:
        raise ConfigError(
            f"adpsgd needs a bipartite graph (edges only between even and odd ranks); "
            f"--topology {config.topology} with {config.workers} workers has edge "
            f"{edge[0]}-{edge[1]} (use an even number of workers with ring or "
            "bipartite-exponential)"
        )


def tolerate_loss(config: RunOptions) -> frozenset[int]:
    """`--on-failure continue`: active workers stop choosing a lost passive one and passive
    ones stop serving a lost active one, so any rank may go where the graph stays connected."""
    if config.adpsgd_mode == "naive":
        raise ConfigError("--on-failure continue: --adpsgd-mode naive is for showing its "
                          "deadlock; use the bipartite mode")
    cut = cut_by_loss(build(config.topology, config.workers, config.weights))
    if cut is not None:
        raise ConfigError(f"--on-failure continue: --topology {config.topology} with "
                          f"{config.workers} workers would be {cut[1]} without rank {cut[0]}")
    return frozenset()
