"""D-PSGD's message header: the sender's `stop_at` (math.inf: none) and when it posted the
message (on the run's clock, for the network model), as float64 bits in int64 words ahead of
the flat model (`Frame`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hetsync.transport.header import Frame, float_word, word_float

__all__ = ["ModelHeader", "frame"]


def frame(tensors: Sequence[torch.Tensor]) -> Frame:
    """The layout of every exchanged model: the header, then the flat model."""
    return Frame.of(tensors, words=2)


@dataclass(frozen=True, slots=True)
class ModelHeader:
    """What rides with x_k: the stop the sender knows of and when it posted x_k (seconds)."""

    stop_at: float
    posted: float

    def encode(self) -> tuple[int, int]:
        return (float_word(self.stop_at), float_word(self.posted))

    @classmethod
    def decode(cls, frame: Frame, message: torch.Tensor) -> ModelHeader:
        stop_at, posted = frame.header(message)
        return cls(stop_at=word_float(stop_at), posted=word_float(posted))
