"""AD-PSGD's message header: one int64 word ahead of the flat model (`Frame`) saying whether
the message is an averaging request (or its reply) or a client's goodbye."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hetsync.transport.header import Frame

__all__ = ["Header", "frame"]

_AVERAGE, _BYE = 1, 0


def frame(tensors: Sequence[torch.Tensor]) -> Frame:
    """The layout of every request, reply and goodbye: the header, then the flat model."""
    return Frame.of(tensors, words=1)


@dataclass(frozen=True, slots=True)
class Header:
    """A request or reply carrying a model to average (`bye` False), or a goodbye."""

    bye: bool = False

    def encode(self) -> tuple[int]:
        return (_BYE if self.bye else _AVERAGE,)

    @classmethod
    def decode(cls, frame: Frame, message: torch.Tensor) -> Header:
        (kind,) = frame.header(message)
        return cls(bye=kind == _BYE)
