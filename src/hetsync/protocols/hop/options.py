"""Hop's options (`--max-gap`, `--backup`, `--staleness`, `--skip`, ...) and their checks."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hetsync.errors import ConfigError
from hetsync.protocols.hop.core import MODES, HopConfig
from hetsync.topology import build, cut_by_loss

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["Options", "check", "tolerate_loss"]

_HOP = HopConfig()  # the defaults, defined once in the core


@dataclass
class Options:
    max_gap: int = _HOP.max_gap
    """Hop: tokens per edge, the most iterations a worker may run ahead of an out-neighbour."""
    backup: int = _HOP.backup
    """Hop: in-neighbours a worker need not wait for in each iteration."""
    staleness: int = _HOP.staleness
    """Hop: how many iterations old an in-neighbour's update may be and still be used."""
    skip: bool = _HOP.skip
    """Hop: a worker behind its in-neighbours jumps to their newest iteration."""
    skip_threshold: int = _HOP.skip_threshold
    """Hop: skip only when at least this many iterations would be skipped."""
    hop_mode: str = _HOP.mode
    """Hop: queues (token and update queues) or notify-ack (the design Hop improves on)."""

    HELP: ClassVar[dict[str, str]] = {
        "max_gap": "Hop: tokens per edge, the most iterations a worker may run ahead of a "
        "receiver",
        "backup": "Hop: in-neighbours not waited for in each iteration (backup workers)",
        "staleness": "Hop: use in-neighbours' updates up to this many iterations old",
        "skip": "Hop: a worker behind its in-neighbours skips to their newest iteration",
        "skip_threshold": "Hop: skip only when at least this many iterations would be skipped",
        "hop_mode": "Hop: queues (token and update queues) or notify-ack (for comparison)",
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"hop_mode": MODES}
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("backup", "staleness")
    AT_LEAST_ONE: ClassVar[tuple[str, ...]] = ("max_gap", "skip_threshold")
    FINITE: ClassVar[tuple[str, ...]] = ()

    def hop_config(self) -> HopConfig:
        """The core's configuration."""
        return HopConfig(max_gap=self.max_gap, backup=self.backup, staleness=self.staleness,
                         skip=self.skip, skip_threshold=self.skip_threshold, mode=self.hop_mode)


def check(config: RunOptions) -> None:
    """Raise ConfigError if `config` cannot run Hop (before anything starts)."""
    topology = build(config.topology, config.workers, config.weights)
    if topology.dynamic:
        raise ConfigError(f"hop needs a fixed graph; --topology {config.topology} changes "
                          "every iteration")
    if config.hop_mode == "notify-ack" and (config.backup or config.staleness or config.skip):
        raise ConfigError("--hop-mode notify-ack cannot express --backup, --staleness or "
                          "--skip (that is the point of Hop's queues)")
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
