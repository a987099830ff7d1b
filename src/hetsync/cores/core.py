"""What every protocol core shares: `handle(event) -> decisions` and its ERROR state.

A core's own logic is `_handle`. `handle` wraps it the way h11 wraps its state machine: a
`ProtocolError` puts the core in ERROR, and a core in ERROR (or in another state it lists in
`REFUSING`, such as a finished run's DONE) refuses every later event with a
`LocalProtocolError` naming the state. A driver that caught the first error cannot then go on
with a core whose state it broke halfway.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar, Generic, NoReturn, TypeVar

from hetsync.cores.errors import LocalProtocolError, ProtocolError

__all__ = ["Core", "unhandled"]

EventT = TypeVar("EventT")
DecisionT = TypeVar("DecisionT")


class Core(Generic[EventT, DecisionT]):
    """Base of the protocol cores; `state` is a member of an Enum that has an ERROR member."""

    state: Enum
    REFUSING: ClassVar[frozenset[str]] = frozenset({"ERROR"})
    """Names of the states in which every event is refused."""

    def handle(self, event: EventT) -> list[DecisionT]:
        """Take one event; return the decisions to execute, in order."""
        if self.state.name in self.REFUSING:
            raise LocalProtocolError(f"{self.who}: core is in {self.state.name}; got {event!r}")
        try:
            return self._handle(event)
        except ProtocolError:
            self.state = type(self.state)["ERROR"]
            raise

    @property
    def who(self) -> str:
        """The core's name in error messages ("hop rank 3", "group generator")."""
        raise NotImplementedError

    def _handle(self, event: EventT) -> list[DecisionT]:
        raise NotImplementedError


def unhandled(decision: NoReturn) -> NoReturn:
    """The last case of a protocol's `dispatch`: a type checker sees that `decision` can be
    no member of the decisions' union (`typing.assert_never`'s check, on Python 3.10 too), so
    a decision added to the union without a case fails type-checking; at run time, a value
    that is no decision at all fails here."""
    raise TypeError(f"no handler for decision {decision!r}")
