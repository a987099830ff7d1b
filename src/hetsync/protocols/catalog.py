"""The built-in protocols, found by their packages: what each brings to a run.

A protocol is one package here, found by its driver: `driver.py`, or a `driver/` package where
the transport takes several modules (its transport over torch.distributed, registered under
the package's name), with `core.py` (and other modules of
decisions, without I/O) and, by these names:
- `options.py` (optional): an `Options` dataclass (its flags, each field declared with
  `hetsync.protocols.option_field.option`: help, choices, range), a `check(config)` function
  (the checks that need the whole run's options) and, for a protocol that can go on without a
  lost worker, `tolerate_loss(config)` (see `essential_ranks`, `TOLERATE_LOSS`), and
  `USES_TOPOLOGY = True` for a protocol that averages over `--topology` (`GRAPH_PROTOCOLS`);
- `simulation.py` (optional): `build_workers(sim)`, its simulation (`SIMULATED`), imported
  by the simulator only;
- `invariants.py` (optional, beside a simulation): what the simulator's fuzz checks of it
  beyond every protocol's promises (`CHECKED`; hetsync.simulator.fuzz says what it may hold);
- `variants.py`: `VARIANTS`, its `NamedVariant`s, one of them the default (`all_variants`),
  which the bench suites and both fuzzers run.
A run's `RunConfig` holds the chosen protocol's `Options` (`OPTIONS_OF`), and the command line
has a flag for every protocol's, so adding a protocol adds its package and touches nothing
else (DEVELOPERS.md, "Adding a protocol"). Reading options imports no driver and no simulation.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, fields, replace
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any

from hetsync.errors import ConfigError
from hetsync.protocols.variant import NamedVariant

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["BUILTIN", "CHECKED", "GRAPH_PROTOCOLS", "OPTIONS_OF", "PROTOCOL_OPTIONS", "REJOIN",
           "SIMULATED", "TOLERATE_LOSS", "all_variants", "check_protocol_options",
           "check_rejoin", "essential_ranks",
           "option_clashes", "option_owners"]

#: Names of the built-in protocols: the packages beside this module that have a driver.
_HERE = Path(__file__).parent


def _has_driver(package: Path) -> bool:
    return (package / "driver.py").is_file() or (package / "driver" / "__init__.py").is_file()


BUILTIN = tuple(sorted(info.name for info in pkgutil.iter_modules([str(_HERE)])
                       if info.ispkg and _has_driver(_HERE / info.name)))

#: The built-in protocols that have a simulation (`<package>/simulation.py`, with
#: `build_workers(sim)`); only the simulator imports it (`hetsync.simulator.run.simulation`).
SIMULATED = tuple(name for name in BUILTIN if (_HERE / name / "simulation.py").is_file())

#: The simulated protocols whose package says what the fuzz checks of it beyond every
#: protocol's promises (`<package>/invariants.py`); only the fuzz imports it.
CHECKED = tuple(name for name in SIMULATED if (_HERE / name / "invariants.py").is_file())


def _options_module(name: str) -> ModuleType | None:
    if not (_HERE / name / "options.py").is_file():
        return None
    return importlib.import_module(f"hetsync.protocols.{name}.options")


_MODULES = {name: module for name in BUILTIN if (module := _options_module(name)) is not None}

#: The `Options` dataclass of each built-in protocol that has options, by protocol name.
OPTIONS_OF: Mapping[str, type[Any]] = MappingProxyType({
    name: module.Options for name, module in _MODULES.items() if hasattr(module, "Options")})
#: The same classes, in protocol name order.
PROTOCOL_OPTIONS: tuple[type[Any], ...] = tuple(OPTIONS_OF.values())


def option_owners() -> dict[str, tuple[str, ...]]:
    """Each protocol option's name, with the protocols that declare it."""
    owners: dict[str, tuple[str, ...]] = {}
    for name, options in OPTIONS_OF.items():
        for f in fields(options):
            owners[f.name] = (*owners.get(f.name, ()), name)
    return owners


def option_clashes(run_options: Iterable[str],
                   options_of: Mapping[str, type[Any]] = OPTIONS_OF) -> list[str]:
    """What makes a protocol option's flag ambiguous: a run option or a protocol's name of the
    same name (a TOML table is named by its protocol), or two protocols that declare one name
    with a different type, default or declaration (help, choices, range). Empty when the
    flags are sound; tests/protocols/test_options.py requires that."""
    declared: dict[str, tuple[str, Field[Any]]] = {}
    clashes = []
    taken = set(run_options) | set(BUILTIN)
    for protocol, options in options_of.items():
        for f in fields(options):
            if f.name in taken:
                clashes.append(f"{protocol}'s option {f.name} is also a run option or a "
                               "protocol's name")
            first = declared.setdefault(f.name, (protocol, f))
            other = first[1]
            if first[0] != protocol and (other.type, other.default, other.metadata) != (
                    f.type, f.default, f.metadata):
                clashes.append(f"{first[0]} and {protocol} both declare option {f.name}, "
                               "with different meanings")
    return clashes

#: The built-in protocols that can go on without a lost worker (`--on-failure continue`): those
#: whose options module has `tolerate_loss`.
TOLERATE_LOSS = tuple(name for name, module in _MODULES.items()
                      if hasattr(module, "tolerate_loss"))


#: The built-in protocols whose lost workers can rejoin the running run (`--on-failure
#: rejoin`): those whose options module sets `REJOINS`, their core taking a new generation
#: of the run's membership (hetsync.transport.membership).
REJOIN = tuple(name for name, module in _MODULES.items() if getattr(module, "REJOINS", False))


def check_rejoin(config: RunOptions) -> None:
    """Refuse `--on-failure rejoin` where a restarted worker could not rejoin: a protocol
    whose core takes no new membership yet, NCCL (a communicator cannot be re-formed around a
    restarted process here: hetsync's generations are gloo groups), a lossy codec (its
    all-to-all of shares is not generation-aware), or torchrun (whose agent restarts every
    worker itself: there the restarted workers resume from their checkpoints)."""
    if config.protocol not in REJOIN:
        raise ConfigError(f"--on-failure rejoin: {config.protocol}'s workers cannot rejoin a "
                          f"running run yet (its core takes no new membership); these can: "
                          f"{', '.join(REJOIN)}; or use --on-failure continue")
    if config.backend == "nccl":
        raise ConfigError("--on-failure rejoin needs --backend gloo: a restarted worker joins a "
                          "new generation of gloo groups, and an NCCL communicator is not "
                          "re-formed around it")
    if config.compress != "none":
        raise ConfigError(f"--on-failure rejoin sends models as they are: --compress "
                          f"{config.compress} is not generation-aware yet")


#: The built-in protocols that average over a graph (`--topology`, `--weights`): those whose
#: options module sets `USES_TOPOLOGY`.
GRAPH_PROTOCOLS = tuple(name for name, module in _MODULES.items()
                        if getattr(module, "USES_TOPOLOGY", False))


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
