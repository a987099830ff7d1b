from __future__ import annotations

import pytest

from hetsync.errors import ConfigError
from hetsync.protocols.base import Protocol
from hetsync.protocols.registry import (
    _REGISTRY,
    available_protocols,
    get_protocol,
    register_protocol,
)


def test_builtins_are_registered():
    assert {"allreduce", "ddp"} <= set(available_protocols())
    assert get_protocol("allreduce").name == "allreduce"


def test_unknown_protocol_lists_known():
    with pytest.raises(ConfigError, match="unknown protocol 'gossip' \\(known: .*allreduce"):
        get_protocol("gossip")


def test_a_new_protocol_is_one_decorator(monkeypatch):
    monkeypatch.setattr("hetsync.protocols.registry._REGISTRY", dict(_REGISTRY))
    @register_protocol("test-noop")
    class Noop(Protocol):
        pass

    assert get_protocol("test-noop") is Noop
    with pytest.raises(ValueError, match="already registered"):

        @register_protocol("test-noop")
        class Other(Protocol):
            pass
