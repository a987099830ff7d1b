"""Each protocol's decisions have one typed interface (`<X>DecisionHandler`, next to its core)
that both engines implement: the real driver and the simulated worker. A decision added to a
core without a method in the interface, or without its method in either engine, fails here,
without a type checker."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from types import ModuleType
from typing import Any

import pytest

from hetsync.protocols.adpsgd import core as adpsgd
from hetsync.protocols.adpsgd.driver import ADPSGD
from hetsync.protocols.adpsgd.simulation import ADPSGDSimWorker
from hetsync.protocols.allreduce import core as allreduce
from hetsync.protocols.allreduce.driver import AllReduce
from hetsync.protocols.allreduce.simulation import AllReduceSimWorker
from hetsync.protocols.dpsgd import core as dpsgd
from hetsync.protocols.dpsgd.driver import DPSGD
from hetsync.protocols.dpsgd.simulation import DPSGDSimWorker
from hetsync.protocols.hop import core as hop
from hetsync.protocols.hop.driver import Hop
from hetsync.protocols.hop.simulation import HopWorker
from hetsync.protocols.localsgd import core as localsgd
from hetsync.protocols.localsgd.driver import LocalSGD
from hetsync.protocols.localsgd.simulation import LocalSGDSimWorker
from hetsync.protocols.prague import worker as prague
from hetsync.protocols.prague.driver.overlapped import OverlappedGroups
from hetsync.protocols.prague.driver.random_groups import RandomGroups
from hetsync.protocols.prague.simulation import PragueWorker
from hetsync.protocols.ps import core as ps
from hetsync.protocols.ps.driver import ParameterServer, _Server
from hetsync.protocols.ps.simulation import PSSimWorker, ServerThread


@dataclasses.dataclass(frozen=True)
class Interface:
    """One core's decisions: the module, its union of them, its handler Protocol and its
    dispatch, the engines that carry them out, and the module's other classes that are
    not decisions (its events, options and states)."""

    module: ModuleType
    union: Any
    handler: type
    dispatch: Any
    engines: tuple[type, ...]
    not_decisions: Any

    def __str__(self) -> str:
        return self.handler.__name__


INTERFACES = [
    Interface(hop, hop.Decision, hop.HopDecisionHandler, hop.dispatch, (Hop, HopWorker),
              hop.Event | hop.HopConfig),
    Interface(adpsgd, adpsgd.Decision, adpsgd.ADPSGDDecisionHandler, adpsgd.dispatch,
              (ADPSGD, ADPSGDSimWorker), adpsgd.Event),
    Interface(dpsgd, dpsgd.Decision, dpsgd.DPSGDDecisionHandler, dpsgd.dispatch,
              (DPSGD, DPSGDSimWorker),
              dpsgd.IterationStarted | dpsgd.ComputeFinished | dpsgd.ModelReceived
              | dpsgd.Neighbourhood),
    Interface(ps, ps.ServerDecision, ps.ServerDecisionHandler, ps.dispatch_server,
              (_Server, ServerThread),
              ps.Push | ps.Bye | ps.WorkerLost | ps.WorkerDecision | ps.GradientReady
              | ps.ReplyReceived | ps.Leave),
    Interface(ps, ps.WorkerDecision, ps.WorkerDecisionHandler, ps.dispatch_worker,
              (ParameterServer, PSSimWorker),
              ps.Push | ps.Bye | ps.WorkerLost | ps.ServerDecision | ps.GradientReady
              | ps.ReplyReceived | ps.Leave),
    Interface(prague, prague.Decision, prague.PragueDecisionHandler, prague.dispatch,
              (RandomGroups, OverlappedGroups, PragueWorker),
              prague.StepFinished | prague.GroupAssigned | prague.PReduceFinished),
    Interface(localsgd, localsgd.Decision, localsgd.LocalSGDDecisionHandler, localsgd.dispatch,
              (LocalSGD, LocalSGDSimWorker),
              localsgd.StepDone | localsgd.Averaged | localsgd.LoopEnded),
    Interface(allreduce, allreduce.Decision, allreduce.AllReduceDecisionHandler,
              allreduce.dispatch, (AllReduce, AllReduceSimWorker),
              allreduce.GradientsReady | allreduce.Reduced | allreduce.Contributed
              | allreduce.Completed),
]


class _Recorder:
    """A handler that records which of its methods `dispatch` called."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda decision: self.called.append(name) or name


def _protocol_methods(handler: type) -> set[str]:
    return {name for name, value in vars(handler).items()
            if inspect.isfunction(value) and not name.startswith("_")}


def _bare(cls: type) -> Any:
    """An instance of a decision class with no fields set: enough for `match` by type."""
    return object.__new__(cls)


@pytest.mark.parametrize("interface", INTERFACES, ids=str)
def test_every_decision_of_a_core_is_in_its_union(interface: Interface) -> None:
    decisions = set(typing.get_args(interface.union))
    others = set(typing.get_args(interface.not_decisions)) or {interface.not_decisions}
    defined = {value for value in vars(interface.module).values()
               if dataclasses.is_dataclass(value) and isinstance(value, type)
               and value.__module__ == interface.module.__name__}
    assert defined - others == decisions, "a dataclass of the core is neither an event nor a " \
        "decision its handler carries out"


@pytest.mark.parametrize("interface", INTERFACES, ids=str)
def test_dispatch_calls_one_method_of_the_interface_per_decision(interface: Interface) -> None:
    methods = _protocol_methods(interface.handler)
    called = []
    for cls in typing.get_args(interface.union):
        recorder = _Recorder()
        assert interface.dispatch(_bare(cls), recorder) in methods, cls
        called += recorder.called
    assert sorted(called) == sorted(methods), "one method per decision, and no other"
    with pytest.raises(TypeError, match="no handler"):
        interface.dispatch(object(), _Recorder())


@pytest.mark.parametrize("interface", INTERFACES, ids=str)
def test_the_driver_and_the_simulation_implement_every_method(interface: Interface) -> None:
    for engine in interface.engines:
        missing = [name for name in sorted(_protocol_methods(interface.handler))
                   if not inspect.isfunction(getattr(engine, name, None))]
        assert not missing, f"{engine.__qualname__} does not carry out {missing}"
        assert interface.handler not in engine.__mro__  # its bodies are `...`
