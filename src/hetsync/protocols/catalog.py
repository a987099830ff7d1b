"""The built-in protocols, found by their packages: what each brings to a run's options.

A protocol is one package here: `core.py` (and other modules of decisions, without I/O),
`driver.py` (its transport over torch.distributed, registered under the package's name), and
optionally `options.py` with an `Options` dataclass (its flags, with `HELP`, `CHOICES` and
the range checks `NON_NEGATIVE`, `AT_LEAST_ONE`, `FINITE`), a `check(config)` function (the
checks that need the whole run's options) and, for a protocol that can go on without a lost
worker, `tolerate_loss(config)` (see `essential_ranks`). `RunConfig` is composed from the
`Options` found here, so adding a protocol adds its package and touches nothing else; its
simulation, if it has one, is `hetsync.simulator.protocols.<name>`. Reading options imports
no driver.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hetsync.errors import ConfigError

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["BUILTIN", "PROTOCOL_OPTIONS", "check_protocol_options", "essential_ranks"]

#: Names of the built-in protocols: the packages beside this module that have a driver.
_HERE = Path(__file__).parent
BUILTIN = tuple(sorted(info.name for info in pkgutil.iter_modules([str(_HERE)])
                       if info.ispkg and (_HERE / info.name / "driver.py").is_file()))


def _options_module(name: str) -> ModuleType | None:
    if not (_HERE / name / "options.py").is_file():
        return None
    return importlib.import_module(f"hetsync.protocols.{name}.options")


_MODULES = {name: module for name in BUILTIN if (module := _options_module(name)) is not None}

#: The `Options` dataclass of every built-in protocol that has options.
PROTOCOL_OPTIONS: tuple[type[Any], ...] = tuple(
    module.Options for module in _MODULES.values() if hasattr(module, "Options"))


def check_protocol_options(config: RunOptions) -> None:
    """Run `config.protocol`'s own checks, where it is a built-in protocol (a user's protocol
    is checked by the registry: `hetsync.protocols.registry.validated`)."""
    check: Callable[[RunOptions], None] | None = getattr(_MODULES.get(config.protocol), "check",
                                                         None)
    if check is not None:
        check(config)


def essential_ranks(config: RunOptions) -> frozenset[int]:
    """Under `--on-failure continue`: the ranks whose loss still ends the run (those that host
    a service: the parameter server, the Group Generator). Raise ConfigError where the
    protocol, or these options of it, cannot go on without a worker: every step of
    All-Reduce, DDP and D-PSGD needs all of them, and so does a static Prague schedule."""
    tolerate: Callable[[RunOptions], frozenset[int]] | None = getattr(
        _MODULES.get(config.protocol), "tolerate_loss", None)
    if tolerate is None:
        able = ", ".join(name for name, module in _MODULES.items()
                         if hasattr(module, "tolerate_loss"))
        raise ConfigError(f"--on-failure continue: {config.protocol} cannot go on without a "
                          f"worker (each of its steps needs every worker); these can: {able}")
    return tolerate(config)
