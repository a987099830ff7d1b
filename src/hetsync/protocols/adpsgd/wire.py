"""AD-PSGD's message header: two int64 words ahead of the flat model (`Frame`): whether the
message is an averaging request (or its reply) or a client's goodbye, and the iteration its
sender was at (what a passive worker's bounded lead reads, `--adpsgd-max-gap`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hetsync.transport.header import Frame

__all__ = ["Header", "frame"]

_AVERAGE, _BYE = 1, 0


def frame(tensors: Sequence[torch.Tensor]) -> Frame:
    """The layout of every request, reply and goodbye: the header, then the flat model."""
    return Frame.of(tensors, words=2)


@dataclass(frozen=True, slots=True)
class Header:
    """A request or reply carrying a model to average (`bye` False), or a goodbye; `iteration`:
    the sender's (a request's: the iteration it was sent in)."""

    bye: bool = False
    iteration: int = 0

    def encode(self) -> tuple[int, int]:
        return (_BYE if self.bye else _AVERAGE, self.iteration)

    @classmethod
    def decode(cls, frame: Frame, message: torch.Tensor) -> Header:
        kind, iteration = frame.header(message)
        return cls(bye=kind == _BYE, iteration=iteration)
