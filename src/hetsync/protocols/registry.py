"""Protocols by name: a registry filled by the `@register_protocol` decorator.

A built-in protocol is one package here (see `catalog`): its driver module defines a
`Protocol` subclass and registers it; nothing else in the tree changes. Drivers are imported
lazily, on the first lookup, so that importing hetsync (or reading a run's options) stays
cheap. A user's protocol registers the same way from its own module.

The registry sits with the drivers (see the layers in DEVELOPERS.md): the `hetsync.protocols`
package itself stays empty, so that importing a protocol's options or decisions imports no
driver and no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from hetsync.errors import ConfigError
from hetsync.protocols.base import Protocol
from hetsync.protocols.catalog import BUILTIN

if TYPE_CHECKING:
    from hetsync.config import RunConfig

__all__ = ["available_protocols", "get_protocol", "register_protocol", "validated"]

_REGISTRY: dict[str, type[Protocol]] = {}


def register_protocol(name: str) -> Callable[[type[Protocol]], type[Protocol]]:
    """Class decorator: make a Protocol subclass available as `--protocol name`."""

    def register(cls: type[Protocol]) -> type[Protocol]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"protocol {name!r} is already registered by {_REGISTRY[name]}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return register


def _load_builtins() -> None:
    for name in BUILTIN:
        importlib.import_module(f"hetsync.protocols.{name}.driver")


def available_protocols() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_protocol(name: str) -> type[Protocol]:
    """The protocol class called `name`; the error lists the known ones."""
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ConfigError(f"unknown protocol {name!r} (known: {known})") from None


def validated(config: RunConfig) -> RunConfig:
    """`config.validate()`, with the checks of a protocol that a user's module registered
    (`Protocol.check_config`); an unknown protocol name fails first. Config itself knows only
    the built-in protocols, whose packages it is composed from."""
    protocol = None if config.protocol in BUILTIN else get_protocol(config.protocol)
    config.validate()
    if protocol is not None:
        protocol.check_config(config)
    return config
