"""The Group Generator's messages on the wire: int64 words, so group ids and iterations stay
exact (as float32 they rounded past 2^24, about a day of training at 8 workers); the float
fields (a request's flag, how long the GG held it) ride as float64 bits."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from hetsync.protocols.prague.group_generator import Group
from hetsync.transport.header import float_word, word_float

__all__ = ["FROM_GG_TAG", "TO_GG_TAG", "FromGG", "Kind", "ToGG"]

TO_GG_TAG, FROM_GG_TAG = 51, 52
"""A worker's messages to rank 0's GG travel on one tag, its assignments back on another."""


class Kind(IntEnum):
    """What a worker's message to the GG says."""

    REQUEST = 1  # value: the iteration it finished; flag: 1.0 if it was its last; finished:
    # a group it has run, told before the request (-1: none)
    FINISHED = 2  # value: the id of a group it has run
    BYE = 3  # it leaves: no more messages from it


@dataclass(frozen=True, slots=True)
class ToGG:
    """A worker's message to the GG: its kind, an iteration or group id, a flag, and a group
    finished (a request's, -1 for none; `PragueWorkerCore` says when one rides along)."""

    kind: int
    value: int
    flag: float
    finished: int = -1

    def encode(self) -> torch.Tensor:
        return torch.tensor([self.kind, self.value, float_word(self.flag), self.finished],
                            dtype=torch.int64)

    @staticmethod
    def empty() -> torch.Tensor:
        return torch.empty(4, dtype=torch.int64)

    @classmethod
    def decode(cls, message: torch.Tensor) -> ToGG:
        kind, value, flag, finished = message.tolist()
        return cls(kind, value, word_float(flag), finished)


@dataclass(frozen=True, slots=True)
class FromGG:
    """An assignment to a worker (`group`; None: the end marker), whether it answers the
    worker's request, and how long the GG held that request (seconds)."""

    group: Group | None
    answers_request: bool = False
    held: float = 0.0

    def encode(self, world: int) -> torch.Tensor:
        """id, answers, held, size, then the members, padded with -1 to `world` of them."""
        message = torch.full((4 + world,), -1, dtype=torch.int64)
        if self.group is not None:
            members = self.group.members
            message[: 4 + len(members)] = torch.tensor(
                [self.group.id, int(self.answers_request), float_word(self.held), len(members),
                 *members], dtype=torch.int64)
        return message

    @staticmethod
    def empty(world: int) -> torch.Tensor:
        return torch.empty(4 + world, dtype=torch.int64)

    @classmethod
    def decode(cls, message: torch.Tensor) -> FromGG:
        words = message.tolist()
        if words[0] < 0:
            return cls(None)
        group = Group(id=words[0], members=tuple(words[4 : 4 + words[3]]))
        return cls(group, bool(words[1]), word_float(words[2]))
