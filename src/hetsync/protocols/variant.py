"""A protocol's named variants, declared by its own package (`<package>/variants.py`, a
`VARIANTS` tuple of these): what the bench suites, the simulator's fuzz and the real-process
fault fuzz run, so that a new protocol appears in all of them without a central list."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["NamedVariant"]


@dataclass(frozen=True)
class NamedVariant:
    """One way to run a protocol: a label (`hop-backup1`) and the run options it sets beyond
    `protocol`, which its package implies."""

    label: str
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""
    """What a table should call it where the label alone would mislead (empty: the label)."""
    default: bool = False
    """The package's one variant in the suites that run one per protocol family."""
    fuzz: bool = True
    """Run by the simulator's schedule fuzz (`hetsync.simulator.fuzz`)."""
    conserving: bool = False
    """Its averaging conserves the sum of the models (checked by the fuzz with lr 0)."""
    fault_fuzz: bool = False
    """Run by the real-process fault fuzz (it must go on without a lost worker)."""
    bench: bool = True
    """In the suites that run every variant (`EVERY_PROTOCOL`); False for what only a fuzz
    runs (a lost worker) or only names its own way (the fault fuzz's labels, kept for replays)."""
    protocol: str = ""
    """The package that declares it: set by the catalog (`all_variants`), not by the package."""

    @property
    def run_options(self) -> Mapping[str, Any]:
        """Its options with `protocol`: what `RunConfig(**run_options)` runs."""
        return MappingProxyType({"protocol": self.protocol, **self.options})
