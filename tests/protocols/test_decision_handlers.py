"""Each protocol's decisions have one typed interface, a `...DecisionHandler` Protocol next to
its core with one method per decision and a `dispatch` function that calls it, and both
engines implement it: the real driver and the simulated worker. A decision added to a core's
union without a method in the interface, or without its method in either engine, fails here,
without a type checker. The interfaces and engines are found by these names, so a new
protocol's are checked without an edit here."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from hetsync.cores.core import Core
from hetsync.protocols.catalog import BUILTIN


@dataclasses.dataclass(frozen=True)
class Interface:
    """One union of decisions: its handler Protocol, its dispatch, the classes that carry
    them out in the driver and in the simulation, and the cores that return them."""

    handler: type
    dispatch: Callable[[Any, Any], Any]
    decisions: tuple[type, ...]
    drivers: tuple[type, ...]
    simulated: tuple[type, ...]
    cores: tuple[type, ...]

    def __str__(self) -> str:
        return self.handler.__name__


def _modules(name: str) -> list[ModuleType]:
    package = importlib.import_module(f"hetsync.protocols.{name}")
    return [package, *(importlib.import_module(info.name) for info in
                       pkgutil.walk_packages(package.__path__, f"{package.__name__}."))]


def _own(module: ModuleType, kind: Callable[[Any], bool]) -> list[Any]:
    return [value for value in vars(module).values()
            if kind(value) and getattr(value, "__module__", None) == module.__name__]


def _methods(handler: type) -> set[str]:
    return {name for name, value in vars(handler).items()
            if inspect.isfunction(value) and not name.startswith("_")}


def _carrying(modules: list[ModuleType], parts: tuple[str, ...],
              dispatch: Callable[[Any, Any], Any], methods: set[str]) -> tuple[type, ...]:
    """The classes that carry out any of `methods` in the modules named with one of `parts`
    that import `dispatch` (DDP's driver carries out All-Reduce's decisions)."""
    return tuple(cls for module in modules if any(part in module.__name__ for part in parts)
                 and any(value is dispatch for value in vars(module).values())
                 for cls in _own(module, inspect.isclass)
                 if any(hasattr(cls, name) for name in methods))


def _interfaces() -> list[Interface]:
    found = []
    everywhere = [module for name in BUILTIN for module in _modules(name)]
    for module in everywhere:
        for handler in _own(module, lambda v: inspect.isclass(v) and getattr(
                v, "_is_protocol", False) and v.__name__.endswith("DecisionHandler")):
            [dispatch] = [f for f in _own(module, inspect.isfunction)
                          if typing.get_origin(typing.get_type_hints(f).get("handler"))
                          is handler]
            union = typing.get_type_hints(dispatch)["decision"]
            cores = tuple(cls for cls in _own(module, inspect.isclass)
                          if issubclass(cls, Core) and cls is not Core
                          and typing.get_args(cls.__orig_bases__[0])[1] == union)
            methods = _methods(handler)
            found.append(Interface(handler, dispatch, typing.get_args(union),
                                   _carrying(everywhere, (".driver", ".server"), dispatch,
                                             methods),  # (a server: the ps server's thread)
                                   _carrying(everywhere, (".simulation",), dispatch, methods),
                                   cores))
    return found


INTERFACES = _interfaces()


def test_every_protocol_with_decisions_has_an_interface():
    names = {i.handler.__module__.split(".")[2] for i in INTERFACES}
    assert names == {"hop", "adpsgd", "dpsgd", "ps", "prague", "localsgd", "allreduce"}
    assert len(INTERFACES) == 8  # ps: the server's and the workers'
    assert all(i.cores for i in INTERFACES), "each union is a core's decisions"


class _Recorder:
    """A handler that records which of its methods `dispatch` called."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda decision: self.called.append(name) or name


@pytest.mark.parametrize("interface", INTERFACES, ids=str)
def test_dispatch_calls_one_method_of_the_interface_per_decision(interface: Interface) -> None:
    methods, called = _methods(interface.handler), []
    for cls in interface.decisions:
        recorder = _Recorder()
        bare = object.__new__(cls)  # no fields set: `match` goes by its type
        assert interface.dispatch(bare, recorder) in methods, cls
        called += recorder.called
    assert sorted(called) == sorted(methods), "one method per decision, and no other"
    with pytest.raises(TypeError, match="no handler"):
        interface.dispatch(object(), _Recorder())


@pytest.mark.parametrize("interface", INTERFACES, ids=str)
def test_the_driver_and_the_simulation_implement_every_method(interface: Interface) -> None:
    assert interface.drivers and interface.simulated
    for engine in interface.drivers + interface.simulated:
        missing = [name for name in sorted(_methods(interface.handler))
                   if not inspect.isfunction(getattr(engine, name, None))]
        assert not missing, f"{engine.__qualname__} does not carry out {missing}"
        assert interface.handler not in engine.__mro__  # its bodies are `...`
