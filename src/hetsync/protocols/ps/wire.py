"""The parameter server's messages: their tags, and their headers, a push's (kind, version,
vote) and a reply's (version, staleness, stop), as int64 words ahead of the flat gradient or
model (`Frame`), so a version stays exact past any dtype's integers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetsync.transport.header import Frame

__all__ = ["PULL_TAG", "PUSH_TAG", "RESUME_TAG", "PushHeader", "ReplyHeader", "frame"]

PUSH_TAG, PULL_TAG, RESUME_TAG = 21, 22, 23
"""A push (or goodbye) to the server, its reply, and a resumed run's model from rank 0."""

_WORDS = 3  # a push's and a reply's headers have the same size: one Frame for both
_PUSH, _BYE = 1, 2


def frame(numel: int, dtype: torch.dtype) -> Frame:
    """The layout of every push and reply: the header, then `numel` elements of `dtype`
    (gradient and buffer change, or model and buffers)."""
    return Frame(_WORDS, numel, dtype)


@dataclass(frozen=True, slots=True)
class PushHeader:
    """A worker's push: the model version its gradient was computed on and its stop vote; or,
    with `bye`, its goodbye (the payload is then ignored)."""

    version: int
    vote: bool
    bye: bool = False

    def encode(self) -> tuple[int, int, int]:
        return (_BYE if self.bye else _PUSH, self.version, int(self.vote))

    @classmethod
    def decode(cls, frame: Frame, message: torch.Tensor) -> PushHeader:
        kind, version, vote = frame.header(message)
        return cls(version=version, vote=bool(vote), bye=kind == _BYE)


@dataclass(frozen=True, slots=True)
class ReplyHeader:
    """The server's answer: the version of the model it carries, the push's staleness and
    whether the worker stops."""

    version: int
    staleness: int
    stop: bool

    def encode(self) -> tuple[int, int, int]:
        return (self.version, self.staleness, int(self.stop))

    @classmethod
    def decode(cls, frame: Frame, message: torch.Tensor) -> ReplyHeader:
        version, staleness, stop = frame.header(message)
        return cls(version=version, staleness=staleness, stop=bool(stop))
