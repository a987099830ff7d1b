"""Hop's options (`--max-gap`, `--backup`, `--staleness`, `--skip`, ...) and their checks."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from hetsync.errors import ConfigError
from hetsync.protocols.hop.core import MODES, HopConfig
from hetsync.protocols.option_field import option
from hetsync.topology import Topology, build, cut_by_loss

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["STALE_SKIP", "Options", "check", "tolerate_loss"]

#: Its neighbours are `--topology`'s, weighted by `--weights` (catalog.GRAPH_PROTOCOLS).
USES_TOPOLOGY = True

_HOP = HopConfig()  # the paper's settings, the core's defaults

#: What a run with no backup worker possible (every rank's in-neighbours are waited for: a
#: ring of 2, a directed ring) gets where Hop's options are left unset: staleness lets a fast
#: worker go on without a slow neighbour's newest update, skipping brings the slow one back
#: up (the variant hop-stale-skip, docs/notes/real-compute-log.md).
STALE_SKIP = {"staleness": 12, "max_gap": 16, "skip": True, "send_ahead": 1,
              "average_once": True}


@dataclass
class Options:
    """Unset (None) options are resolved per run by `for_graph`, from the graph: Hop tolerates
    a straggler by default. `--backup 0 --staleness 0 --no-skip` is the paper's Hop."""

    max_gap: int | None = option(None, at_least=1, default_text="8, or --staleness + 4 where "
                                 "that is more", help="Hop: tokens per edge, the most "
                                 "iterations a worker may run ahead of a receiver")
    backup: int | None = option(None, at_least=0, default_text="1 where every rank has 2 or "
                                "more in-neighbours, else 0", help="Hop: in-neighbours not "
                                "waited for in each iteration (backup workers; 0 waits for "
                                "all, as the paper)")
    staleness: int | None = option(None, at_least=0, default_text=f"{STALE_SKIP['staleness']} "
                                   "where --backup is unset and no backup worker can be set "
                                   "(a ring of 2, a directed ring), else 0",
                                   help="Hop: use in-neighbours' updates up to this many "
                                   "iterations old")
    skip: bool | None = option(None, default_text="on where a worker can fall behind (a backup "
                               "worker, staleness or a directed graph)", help="Hop: a worker "
                               "behind its in-neighbours skips to their newest iteration "
                               "(--no-skip: never)")
    skip_threshold: int = option(_HOP.skip_threshold, at_least=1, help="Hop: skip only when at "
                                 "least this many iterations would be skipped")
    send_ahead: int | None = option(None, at_least=0, default_text="1 where --staleness "
                                    "stands in for a backup worker (as its default does), "
                                    "else 0", help="Hop: defer an update to a "
                                    "receiver this many iterations short of the last one it "
                                    "was sent (0: send every update, as the paper)")
    average_once: bool | None = option(None, default_text="on where --staleness "
                                       "stands in for a backup worker (as its default does), "
                                       "else off", help="Hop: average each update in "
                                       "once; an iteration with nothing new from an "
                                       "in-neighbour goes on without it (--no-average-once: "
                                       "reuse its last update within --staleness)")
    hop_mode: str = option(_HOP.mode, choices=MODES, help="Hop: queues (token and update "
                           "queues) or notify-ack (for comparison)")

    def for_graph(self, topology: Topology) -> Options:
        """A copy with each unset option resolved on the run's graph: the one rule that
        `check`, the driver and the simulation share. A backup worker and skipping where every
        rank has two in-neighbours or more; where one has a single one (a backup worker would
        leave it waiting for nobody), staleness and skipping (`STALE_SKIP`); notify-ack, which
        can express neither, the paper's settings."""
        queues = self.hop_mode == "queues"
        degrees = [len(topology.in_peers(rank)) for rank in range(topology.world)]
        can_backup = queues and min(degrees) >= 2
        stale = queues and self.backup is None and not can_backup and max(degrees) > 0
        backup = _given(self.backup, int(can_backup))
        staleness = _given(self.staleness, STALE_SKIP["staleness"] if stale else 0)
        stale = stale and staleness > 0
        return replace(
            self, max_gap=_given(self.max_gap, max(_HOP.max_gap, staleness + 4)), backup=backup,
            staleness=staleness,
            skip=_given(self.skip, queues and bool(backup or staleness or topology.directed)),
            send_ahead=_given(self.send_ahead, STALE_SKIP["send_ahead"] if stale else 0),
            average_once=_given(self.average_once, stale and STALE_SKIP["average_once"]))

    def hop_config(self, topology: Topology) -> HopConfig:
        """The core's configuration on the run's graph (`for_graph`)."""
        hop = self.for_graph(topology)
        return HopConfig(max_gap=hop.max_gap, backup=hop.backup, staleness=hop.staleness,
                         skip=hop.skip, skip_threshold=hop.skip_threshold,
                         send_ahead=hop.send_ahead, average_once=hop.average_once,
                         mode=hop.hop_mode)


_T = TypeVar("_T")


def _given(value: _T | None, otherwise: _T) -> _T:
    return otherwise if value is None else value


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
    hop = config.for_graph(topology)
    if hop.hop_mode == "queues" and hop.max_gap <= hop.staleness:
        default = " (its default on this graph)" if config.staleness is None else ""
        raise ConfigError(f"--max-gap must be > --staleness {hop.staleness}{default} (got "
                          f"{hop.max_gap}): a fresh enough update must be sendable")
    for rank in range(config.workers):
        degree = len(topology.in_peers(rank))
        if degree and hop.backup >= degree:
            raise ConfigError(f"--backup must be < the in-degree {degree} of rank {rank} on "
                              f"--topology {config.topology} (got {hop.backup})")
    if hop.skip and not (hop.backup or hop.staleness or topology.directed):
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
