"""A run's options as a protocol package's checks read them, typed without importing config.

`hetsync.config.RunConfig` holds the chosen protocol's `Options` (see `catalog`), so the
protocol packages sit below config and may not import it, not even for annotations; their
`check(config)` and `tolerate_loss(config)`, and the catalog's, take a `RunOptions`: a
RunConfig, seen through the options every run has and the protocol's own, by name.
"""

from __future__ import annotations

import typing
from typing import Any

__all__ = ["RunOptions"]


class RunOptions(typing.Protocol):
    """The options every run has that the protocols' checks read (hetsync.config names all)."""

    protocol: str
    workers: int
    backend: str
    seed: int
    topology: str
    weights: str

    def __getattr__(self, name: str) -> Any:
        """The protocol's own options (its `Options` fields)."""
