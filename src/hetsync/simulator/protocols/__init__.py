"""Each protocol's simulation: module `<protocol>` with `build_workers(sim)` around the
protocol's own cores (`hetsync.protocols.<protocol>`).

A simulation only schedules what the cores decide; it holds no protocol logic of its own.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hetsync.errors import ConfigError

if TYPE_CHECKING:
    from hetsync.simulator.world import Simulation, SimWorker

__all__ = ["SIMULATED", "builder"]

#: The protocols that have a simulation: the modules beside this one.
SIMULATED = tuple(sorted(info.name for info in pkgutil.iter_modules([str(Path(__file__).parent)])))


def builder(protocol: str) -> Callable[[Simulation], list[SimWorker]]:
    """The `build_workers` of `protocol`'s simulation."""
    if protocol not in SIMULATED:
        raise ConfigError(f"hetsync simulate has no simulation of protocol {protocol!r} "
                          f"(simulated: {', '.join(SIMULATED)})")
    module = importlib.import_module(f"hetsync.simulator.protocols.{protocol}")
    return module.build_workers  # type: ignore[no-any-return]
