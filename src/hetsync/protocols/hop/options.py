"""Hop's options (`--max-gap`, `--backup`, `--staleness`, `--skip`, ...) and their checks."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetsync.errors import ConfigError
from hetsync.protocols.hop.core import MODES, HopConfig
from hetsync.protocols.option_field import option
from hetsync.topology import build, cut_by_loss

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["Options", "check", "tolerate_loss"]

#: Its neighbours are `--topology`'s, weighted by `--weights` (catalog.GRAPH_PROTOCOLS).
USES_TOPOLOGY = True

_HOP = HopConfig()  # the defaults, defined once in the core


@dataclass
class Options:
    max_gap: int = option(_HOP.max_gap, at_least=1, help="Hop: tokens per edge, the most "
                          "iterations a worker may run ahead of a receiver")
    backup: int = option(_HOP.backup, at_least=0, help="Hop: in-neighbours not waited for in "
                         "each iteration (backup workers)")
    staleness: int = option(_HOP.staleness, at_least=0, help="Hop: use in-neighbours' updates "
                            "up to this many iterations old")
    skip: bool = option(_HOP.skip, help="Hop: a worker behind its in-neighbours skips to their "
                        "newest iteration")
    skip_threshold: int = option(_HOP.skip_threshold, at_least=1, help="Hop: skip only when at "
                                 "least this many iterations would be skipped")
    send_ahead: int = option(_HOP.send_ahead, at_least=0, help="Hop: defer an update to a "
                             "receiver this many iterations short of the last one it was sent "
                             "(0: send every update, as the paper)")
    average_once: bool = option(_HOP.average_once, help="Hop: average each update in once; "
                                "an iteration with nothing new from an in-neighbour goes on "
                                "without it (default: reuse its last update within --staleness)")
    hop_mode: str = option(_HOP.mode, choices=MODES, help="Hop: queues (token and update "
                           "queues) or notify-ack (for comparison)")

    def hop_config(self) -> HopConfig:
        """The core's configuration."""
        return HopConfig(max_gap=self.max_gap, backup=self.backup, staleness=self.staleness,
                         skip=self.skip, skip_threshold=self.skip_threshold,
                         send_ahead=self.send_ahead, average_once=self.average_once,
                         mode=self.hop_mode)


def check(config: RunOptions) -> None:
    """Raise ConfigError if `config` cannot run Hop (before anything starts)."""
    topology = build(config.topology, config.workers, config.weights)
    if topology.dynamic:
        raise ConfigError(f"hop needs a fixed graph; --topology {config.topology} changes "
                          "every iteration")
    if config.hop_mode == "notify-ack" and (config.backup or config.staleness or config.skip
                                            or config.send_ahead):
        raise ConfigError("--hop-mode notify-ack cannot express --backup, --staleness, --skip "
                          "or --send-ahead (that is the point of Hop's queues)")
    if config.hop_mode == "queues" and config.max_gap <= config.staleness:
        raise ConfigError(f"--max-gap must be > --staleness {config.staleness} (got "
                          f"{config.max_gap}): a fresh enough update must be sendable")
    for rank in range(config.workers):
        degree = len(topology.in_peers(rank))
        if degree and config.backup >= degree:
            raise ConfigError(f"--backup must be < the in-degree {degree} of rank {rank} on "
                              f"--topology {config.topology} (got {config.backup})")
    if config.skip and not (config.backup or config.staleness or topology.directed):
        warnings.warn("--skip has no effect here: on an undirected graph with no --backup "
                      "or --staleness no worker can fall behind its neighbours", stacklevel=3)


def tolerate_loss(config: RunOptions) -> frozenset[int]:
    """`--on-failure continue`: a lost worker leaves its neighbours' queues (they stop waiting
    for its updates and tokens), so any rank may go, as long as the graph stays connected."""
    cut = cut_by_loss(build(config.topology, config.workers, config.weights))
    if cut is not None:
        raise ConfigError(f"--on-failure continue: --topology {config.topology} with "
                          f"{config.workers} workers would be {cut[1]} without rank {cut[0]}")
    return frozenset()
