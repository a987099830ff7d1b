"""Hop's message headers, as int64 words ahead of the payload (`Frame`): an update's tag and
when it was sent (float64 bits), a token message's count. A channel's last message carries the
end marker instead of a tag or count (`None` here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hetsync.transport.header import Frame, float_word, word_float

__all__ = ["TOKEN_FRAME", "TokenHeader", "UpdateHeader", "update_frame"]

_END = -1  # tags and counts are never negative
TOKEN_FRAME = Frame(words=1, numel=0, dtype=torch.int64)
"""A token message: its header alone."""


def update_frame(tensors: Sequence[torch.Tensor]) -> Frame:
    """The layout of an update: its header, then the flat model."""
    return Frame.of(tensors, words=2)


@dataclass(frozen=True, slots=True)
class UpdateHeader:
    """A model tagged `tag` (None: the update channel's end marker), sent at `sent_at`
    seconds on the run's clock (what the network model charges from)."""

    tag: int | None
    sent_at: float

    @property
    def end(self) -> bool:
        return self.tag is None

    def encode(self) -> tuple[int, int]:
        return (_END if self.tag is None else self.tag, float_word(self.sent_at))

    @classmethod
    def decode(cls, frame: Frame, message: torch.Tensor) -> UpdateHeader:
        tag, sent_at = frame.header(message)
        return cls(tag=None if tag == _END else tag, sent_at=word_float(sent_at))


@dataclass(frozen=True, slots=True)
class TokenHeader:
    """`count` tokens returned (None: the token channel's end marker)."""

    count: int | None

    @property
    def end(self) -> bool:
        return self.count is None

    def encode(self) -> tuple[int]:
        return (_END if self.count is None else self.count,)

    @classmethod
    def decode(cls, frame: Frame, message: torch.Tensor) -> TokenHeader:
        (count,) = frame.header(message)
        return cls(count=None if count == _END else count)
