"""How a message's floating payload is written on the wire (`--compress`), and nowhere else.

A `Codec` turns a 1-D floating tensor into bytes and back. Four kinds:

- ``none``: the payload as it is (the model's dtype);
- ``bf16`` / ``fp16``: each value rounded to 16 bits (half the bytes of fp32);
- ``int8``: values in chunks of `INT8_CHUNK`, each chunk one fp32 scale (its largest magnitude
  / 127) and one signed byte per value (a quarter of fp32's bytes, plus 4 bytes a chunk).

A sum of compressed parts is made in fp32 after decoding, never in the wire's format
(`Codec.all_reduce`): int8 cannot be summed as bytes, and 16-bit sums over many workers round
each partial sum again. Where one worker sends the same quantity step after step (its
gradient's part of an all-reduce), the error of each encoding is kept and added to the next
(error feedback, `Residual`): the rounding then cancels over the steps instead of biasing the
model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hetsync.transport.codec_kinds import CODECS

__all__ = ["CODECS", "INT8_CHUNK", "Codec", "Residual", "codec"]

#: Values per int8 chunk: one fp32 scale each, 0.4 % more bytes than the values alone.
INT8_CHUNK = 1024
_HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Codec:
    """One wire format; `kind` is one of `CODECS`."""

    kind: str = "none"

    @property
    def lossless(self) -> bool:
        return self.kind == "none"

    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        """The bytes `numel` values of `dtype` take on the wire."""
        if self.kind == "none":
            return numel * dtype.itemsize
        if self.kind in _HALF:
            return numel * 2
        return numel + 4 * -(-numel // INT8_CHUNK)

    def ratio(self, dtype: torch.dtype = torch.float32) -> float:
        """Wire bytes per payload byte, for large payloads (what the network is charged)."""
        return self.nbytes(INT8_CHUNK * 1024, dtype) / (INT8_CHUNK * 1024 * dtype.itemsize)

    def encode(self, values: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """`values` (1-D, floating) as wire bytes: a uint8 tensor of `nbytes(numel)`, on
        `values`' device (a CUDA model's codec runs on its GPU)."""
        n = values.numel()
        size = self.nbytes(n, values.dtype)
        if out is None:
            out = torch.empty(size, dtype=torch.uint8, device=values.device)
        out = out[:size]  # (a larger buffer: its first bytes)
        if self.kind == "none":
            out.view(values.dtype).copy_(values)
        elif self.kind in _HALF:
            out.view(_HALF[self.kind]).copy_(values)
        else:
            chunks = -(-n // INT8_CHUNK)
            scales = out[: 4 * chunks].view(torch.float32)
            padded = _padded(values.float(), chunks * INT8_CHUNK).view(chunks, INT8_CHUNK)
            torch.amax(padded.abs(), dim=1, out=scales)
            scales.div_(127.0).clamp_(min=torch.finfo(torch.float32).tiny)
            q = torch.round(padded / scales[:, None]).clamp_(-127, 127).to(torch.int8)
            out[4 * chunks :].view(torch.int8).copy_(q.view(-1)[:n])
        return out

    def decode(self, data: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the values `data` (from `encode`) holds into `out` (1-D, their count)."""
        n = out.numel()
        data = data[: self.nbytes(n, out.dtype)]
        if self.kind == "none":
            out.copy_(data.view(out.dtype))
        elif self.kind in _HALF:
            out.copy_(data.view(_HALF[self.kind]))
        else:
            chunks = -(-n // INT8_CHUNK)
            scales = data[: 4 * chunks].view(torch.float32)
            q = data[4 * chunks : 4 * chunks + n].view(torch.int8)
            whole = n // INT8_CHUNK * INT8_CHUNK
            if whole:
                out[:whole].view(-1, INT8_CHUNK).copy_(
                    q[:whole].view(-1, INT8_CHUNK).float() * scales[: whole // INT8_CHUNK, None])
            if whole < n:
                out[whole:].copy_(q[whole:].float() * scales[-1])
        return out

    def encode_fed_back(self, values: torch.Tensor, residual: Residual,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        """`encode`, with error feedback: `residual`'s error is added to `values` (in place)
        first, and the error of this encoding kept in it for the next."""
        residual.add_into(values)
        wire = self.encode(values, out=out)
        residual.keep(values, self.decode(wire, torch.empty_like(values)))
        return wire

    @property
    def half(self) -> torch.dtype | None:
        """The 16-bit dtype values travel in (bf16, fp16), None for the other codecs."""
        return _HALF.get(self.kind)


@dataclass
class Residual:
    """The error the last encoding of one quantity left (error feedback): added to the next
    value before it is encoded."""

    error: torch.Tensor | None = field(default=None)

    def add_into(self, values: torch.Tensor) -> None:
        if self.error is not None and self.error.shape == values.shape:
            values.add_(self.error)

    def keep(self, wanted: torch.Tensor, sent: torch.Tensor) -> None:
        if self.error is None or self.error.shape != wanted.shape:
            self.error = torch.empty_like(wanted)
        torch.sub(wanted, sent, out=self.error)


def codec(kind: str) -> Codec:
    """The codec `--compress kind` names."""
    if kind not in CODECS:
        raise ValueError(f"--compress must be {' or '.join(CODECS)} (got {kind!r})")
    return Codec(kind)


def _padded(values: torch.Tensor, size: int) -> torch.Tensor:
    if values.numel() == size:
        return values
    padded = values.new_zeros(size)
    padded[: values.numel()].copy_(values)
    return padded
