"""Each protocol's simulation: `build_workers(sim)` around the protocol's own cores.

A simulation only schedules what the cores decide; it holds no protocol logic of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from hetsync.errors import ConfigError

if TYPE_CHECKING:
    from hetsync.simulator.world import Simulation, SimWorker

__all__ = ["builder"]

#: Protocol name -> module of its simulation (`ddp` is `allreduce` per bucket: one collective
#: per iteration on the virtual clock).
MODULES = {
    "allreduce": "allreduce", "ddp": "allreduce", "ps": "ps", "dpsgd": "dpsgd",
    "adpsgd": "adpsgd", "hop": "hop", "prague": "prague",
}


def builder(protocol: str) -> Callable[[Simulation], list[SimWorker]]:
    """The `build_workers` of `protocol`'s simulation."""
    if protocol not in MODULES:
        raise ConfigError(f"hetsync simulate has no simulation of protocol {protocol!r} "
                          f"(simulated: {', '.join(sorted(MODULES))})")
    module = importlib.import_module(f"hetsync.simulator.protocols.{MODULES[protocol]}")
    return module.build_workers  # type: ignore[no-any-return]
