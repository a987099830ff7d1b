"""The built-in protocols, found by their packages: what each brings to a run.

A protocol is one package here, found by its driver: `driver.py`, or a `driver/` package where
the transport takes several modules (its transport over torch.distributed, registered under
the package's name), with `core.py` (and other modules of
decisions, without I/O) and, by these names:
- `options.py` (optional): an `Options` dataclass (its flags, with `HELP`, `CHOICES` and the
  range checks `NON_NEGATIVE`, `AT_LEAST_ONE`, `FINITE`), a `check(config)` function (the
  checks that need the whole run's options) and, for a protocol that can go on without a lost
  worker, `tolerate_loss(config)` (see `essential_ranks`, `TOLERATE_LOSS`);
- `simulation.py` (optional): `build_workers(sim)`, its simulation (`SIMULATED`), imported
  by the simulator only;
- `variants.py`: `VARIANTS`, its `NamedVariant`s, one of them the default (`all_variants`),
  which the bench suites and both fuzzers run.
`RunConfig` is composed from the `Options` found here, so adding a protocol adds its package
and touches nothing else (DEVELOPERS.md, "Adding a protocol"). Reading options imports no
driver and no simulation.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any

from hetsync.errors import ConfigError
from hetsync.protocols.variant import NamedVariant

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["BUILTIN", "PROTOCOL_OPTIONS", "SIMULATED", "TOLERATE_LOSS", "all_variants",
           "check_protocol_options", "essential_ranks"]

#: Names of the built-in protocols: the packages beside this module that have a driver.
_HERE = Path(__file__).parent


def _has_driver(package: Path) -> bool:
    return (package / "driver.py").is_file() or (package / "driver" / "__init__.py").is_file()


BUILTIN = tuple(sorted(info.name for info in pkgutil.iter_modules([str(_HERE)])
                       if info.ispkg and _has_driver(_HERE / info.name)))

#: The built-in protocols that have a simulation (`<package>/simulation.py`, with
#: `build_workers(sim)`); only the simulator imports it (`hetsync.simulator.run.simulation`).
SIMULATED = tuple(name for name in BUILTIN if (_HERE / name / "simulation.py").is_file())


def _options_module(name: str) -> ModuleType | None:
    if not (_HERE / name / "options.py").is_file():
        return None
    return importlib.import_module(f"hetsync.protocols.{name}.options")


_MODULES = {name: module for name in BUILTIN if (module := _options_module(name)) is not None}

#: The `Options` dataclass of every built-in protocol that has options.
PROTOCOL_OPTIONS: tuple[type[Any], ...] = tuple(
    module.Options for module in _MODULES.values() if hasattr(module, "Options"))

#: The built-in protocols that can go on without a lost worker (`--on-failure continue`): those
#: whose options module has `tolerate_loss`.
TOLERATE_LOSS = tuple(name for name, module in _MODULES.items()
                      if hasattr(module, "tolerate_loss"))


@functools.cache
def all_variants() -> tuple[NamedVariant, ...]:
    """Every built-in package's `VARIANTS` (its `variants.py`), package by package in name
    order, each with its `protocol` set. Raise ValueError where a package has no variants.py,
    not exactly one `default`, sets `protocol` in its options, has the fault fuzz run a
    protocol that cannot lose a worker, or reuses another's label."""
    variants: list[NamedVariant] = []
    for name in BUILTIN:
        if not (_HERE / name / "variants.py").is_file():
            raise ValueError(f"protocol package {name} has no variants.py")
        declared = importlib.import_module(f"hetsync.protocols.{name}.variants").VARIANTS
        defaults = [variant.label for variant in declared if variant.default]
        if len(defaults) != 1:
            raise ValueError(f"protocol package {name} must mark exactly one variant default "
                             f"(marked: {defaults or 'none'})")
        for variant in declared:
            if "protocol" in variant.options:
                raise ValueError(f"variant {variant.label}: its package implies its protocol")
            if variant.fault_fuzz and name not in TOLERATE_LOSS:
                raise ValueError(f"variant {variant.label}: the fault fuzz runs only protocols "
                                 "that can lose a worker (options.py's tolerate_loss)")
            variants.append(replace(variant, protocol=name,
                                    options=MappingProxyType(dict(variant.options))))
    labels = [variant.label for variant in variants]
    if len(set(labels)) != len(labels):
        twice = sorted({label for label in labels if labels.count(label) > 1})
        raise ValueError(f"variant labels declared twice: {', '.join(twice)}")
    return tuple(variants)


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
        raise ConfigError(f"--on-failure continue: {config.protocol} cannot go on without a "
                          f"worker (each of its steps needs every worker); these can: "
                          f"{', '.join(TOLERATE_LOSS)}")
    return tolerate(config)
