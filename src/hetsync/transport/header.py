"""Messages whose header travels as 64-bit words, never in the model's dtype.

A header value carried as one more element of the model's buffer would round past the
dtype's exact integers (bf16: 256, fp16: 2048, float32: 2^24). Here a message is one byte
buffer, one send and one copy to pack: `words` int64 words (integers as they are, floats as
float64 bits, `float_word`), then the payload's bytes; the header comes first, so the payload
view starts on an 8-byte boundary that every dtype can view.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import torch

__all__ = ["Frame", "float_word", "word_float"]

_WORD = 8  # bytes


def float_word(value: float) -> int:
    """`value`'s float64 bits as an int64 word (exact: a time or a weight survives whole)."""
    return struct.unpack("<q", struct.pack("<d", value))[0]


def word_float(word: int) -> float:
    """The float64 whose bits are `word` (inverse of `float_word`)."""
    return struct.unpack("<d", struct.pack("<q", word))[0]


@dataclass(frozen=True, slots=True)
class Frame:
    """The layout of one kind of message: `words` header words, then `numel` elements of
    `dtype` (a flat model, or nothing)."""

    words: int
    numel: int
    dtype: torch.dtype

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor], words: int) -> Frame:
        """Messages carrying `tensors` (flattened, in the first one's dtype) after `words`."""
        dtype = tensors[0].dtype if tensors else torch.float32
        return cls(words, sum(t.numel() for t in tensors), dtype)

    @property
    def payload_bytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """The whole message's size: header and payload."""
        return self.words * _WORD + self.payload_bytes

    def write_header(self, message: torch.Tensor, header: Sequence[int]) -> None:
        """Write `header` (exactly `words` integers) at the start of `message`."""
        if len(header) != self.words:
            raise ValueError(f"a header of {self.words} words, not {len(header)}: {header!r}")
        words = _words(self.words).pack(*header)
        if not words:
            return
        if _in_host_memory(message, len(words)):
            ctypes.memmove(message.data_ptr(), words, len(words))
        else:
            message[: len(words)].copy_(torch.frombuffer(bytearray(words), dtype=torch.uint8))

    def header(self, message: torch.Tensor) -> tuple[int, ...]:
        """The header words of `message`, as Python integers."""
        codec = _words(self.words)
        if _in_host_memory(message, codec.size):
            return codec.unpack(ctypes.string_at(message.data_ptr(), codec.size))
        return codec.unpack(bytes(message[: codec.size].tolist()))

    def payload(self, message: torch.Tensor) -> torch.Tensor:
        """`message`'s payload: a 1-D view of `numel` elements of `dtype` (writes go through)."""
        return message[self.words * _WORD :].view(self.dtype)


@cache
def _words(count: int) -> struct.Struct:
    """`count` int64 words in the machine's byte order, as torch's int64 view reads them."""
    return struct.Struct(f"={count}q")


def _in_host_memory(message: torch.Tensor, nbytes: int) -> bool:
    """Whether `message`'s first `nbytes` are plain host bytes, to read and write as they lie:
    several times cheaper than a torch copy or `tolist`, and headers are read and written
    several times an iteration. Else (a GPU buffer) through torch."""
    return (message.device.type == "cpu" and message.dtype == torch.uint8
            and message.is_contiguous() and message.numel() >= nbytes)
