"""Whose fault a protocol error is: the driver's (local) or a peer's (remote).

Theory of operation. A core takes events and returns decisions; an event can be wrong in two
ways. `LocalProtocolError`: the driver fed an event the core cannot take in its state (it
misuses the core, e.g. reports a step it never started). `RemoteProtocolError`: the event is a
message from a peer that breaks an invariant of the protocol (a group that does not contain
this rank, a group id never assigned). Messages name the event, the rank and the state, so the
message alone says what went wrong where. After either, a core is in its ERROR state and every
later call raises `LocalProtocolError`.
"""

from __future__ import annotations

from hetsync.errors import HetsyncError

__all__ = ["LocalProtocolError", "ProtocolError", "RemoteProtocolError"]


class ProtocolError(HetsyncError):
    """Base of the two kinds below; raise one of them, never this."""

    def __init__(self, message: str) -> None:
        if type(self) is ProtocolError:
            raise TypeError("raise LocalProtocolError or RemoteProtocolError, not ProtocolError")
        super().__init__(message)


class LocalProtocolError(ProtocolError):
    """The driver misused the core (an event it cannot take now)."""


class RemoteProtocolError(ProtocolError):
    """A peer broke the protocol (its message contradicts what the core knows)."""
