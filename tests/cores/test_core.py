"""The shared `handle` of every protocol core: ERROR after a protocol error, refusal after."""

from __future__ import annotations

from enum import Enum

import pytest

from hetsync.cores.core import Core
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.protocols.adpsgd.core import ADPSGDCore
from hetsync.protocols.allreduce.core import AllReduceRound, AllReduceWorker
from hetsync.protocols.dpsgd.core import DPSGDCore
from hetsync.protocols.hop.core import HopCore
from hetsync.protocols.prague.group_generator import GroupGeneratorCore
from hetsync.protocols.prague.worker import PragueWorkerCore
from hetsync.protocols.ps.core import PSServerCore, PSWorkerCore


class _State(Enum):
    RUNNING = "running"
    DONE = "done"
    ERROR = "error"


class _Echo(Core[int, int]):
    """Echoes non-negative events; a negative one is a peer's error; 0 ends the run."""

    REFUSING = frozenset({"ERROR", "DONE"})

    def __init__(self) -> None:
        self.state = _State.RUNNING

    @property
    def who(self) -> str:
        return "echo"

    def _handle(self, event: int) -> list[int]:
        if event < 0:
            raise RemoteProtocolError(f"echo: {event} is negative")
        if event == 0:
            self.state = _State.DONE
        return [event]


def test_a_protocol_error_puts_the_core_in_error_and_every_later_event_is_refused():
    core = _Echo()
    assert core.handle(3) == [3]
    with pytest.raises(RemoteProtocolError, match="negative"):
        core.handle(-1)
    assert core.state is _State.ERROR
    with pytest.raises(LocalProtocolError, match="echo: core is in ERROR; got 3"):
        core.handle(3)


def test_a_refusing_state_other_than_error_refuses_without_breaking_the_core():
    core = _Echo()
    assert core.handle(0) == [0]
    with pytest.raises(LocalProtocolError, match="core is in DONE"):
        core.handle(1)
    assert core.state is _State.DONE


@pytest.mark.parametrize("core", [
    ADPSGDCore, AllReduceRound, AllReduceWorker, DPSGDCore, GroupGeneratorCore, HopCore,
    PragueWorkerCore, PSServerCore, PSWorkerCore,
])
def test_every_protocol_core_shares_it(core):
    assert issubclass(core, Core) and "ERROR" in core.REFUSING
