"""One flat buffer per synchronisation: a single collective instead of one per tensor.

The last element of a gradient buffer carries this worker's stop vote, so that all workers
agree to stop at the same iteration without an extra collective. Buffers that travel are
packed by their link (hetsync.transport.links), which puts them on its wire device; the
helpers here work on one device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from hetsync.transport.contiguous import span
from hetsync.transport.links import Link
from hetsync.transport.mixing import mix, mix_into

__all__ = [
    "BufferDrift",
    "average_model",
    "broadcast_model",
    "flatten",
    "model_tensors",
    "ring_allreduce_bytes",
    "unflatten_into",
]


def flatten(tensors: Sequence[torch.Tensor], *extra: float) -> torch.Tensor:
    """A new 1-D buffer on the tensors' device: their values (detached), then the `extra`
    scalars in the first one's dtype (`Link.flat` makes one on a link's wire)."""
    first = tensors[0]
    tail = torch.tensor(extra, dtype=first.dtype, device=first.device)
    return torch.cat([t.detach().reshape(-1) for t in tensors] + [tail])


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of `flat` back into `tensors` (in place)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def ring_allreduce_bytes(buffer: torch.Tensor, world_size: int) -> int:
    """Bytes one worker sends in a bandwidth-optimal (ring) all-reduce of `buffer`."""
    if world_size <= 1:
        return 0
    return int(2 * (world_size - 1) * buffer.numel() * buffer.element_size() / world_size)


def model_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors that make up a model's state to share: parameters and floating buffers."""
    return [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]


def average_model(model: nn.Module, link: Link) -> None:
    """Set `model`'s floating parameters and buffers to their average over all workers
    (`link`: the runtime's direct one, which all-reduces on its wire device)."""
    tensors = model_tensors(model)
    if not tensors:
        return
    with torch.no_grad():
        flat = link.flat(tensors)
        link.all_reduce(flat)
        flat.div_(dist.get_world_size(link.group))
        link.unpack_into(flat, tensors)
    # Leave together: a rank that exits (tearing down its gloo pairs) while a peer still
    # finishes its part of the all-reduce can make that peer abort (seen once in CI).
    link.barrier()


class BufferDrift:
    """Keeps the forward pass's update of a model's buffers through an average of old copies.

    D-PSGD and AD-PSGD send the model when an iteration begins and write the average back
    after the forward pass; for BatchNorm statistics, which the forward pass itself moves,
    writing the average back would undo that move every iteration. The buffers' part of the
    average is corrected by what they moved since they were sent: x <- avg + (x_now - x_sent).
    Parameters, which the forward pass does not touch, take the average as it is.
    """

    def __init__(self, model: nn.Module) -> None:
        self.offset = sum(p.numel() for p in model.parameters() if p.is_floating_point())
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.end = self.offset + sum(b.numel() for b in self.buffers)

    def mix_into(self, link: Link, tensors: Sequence[torch.Tensor], self_weight: float,
                 sent: torch.Tensor, inputs: Sequence[tuple[torch.Tensor, float]],
                 out: torch.Tensor | None = None) -> torch.Tensor | None:
        """tensors <- self_weight * sent + sum(weight * flat) over `inputs`, the buffers
        corrected (`apply`): as that sum in a flat buffer, `apply` and `unpack_into` would
        give (bit for bit in fp32; in bf16 as `mixing.mix_into` says). The parameters have
        not moved since `sent` was packed, so they are their own term and are averaged in
        place (`mixing.mix_into`: no model-sized buffer, one pass fewer); only the buffers' few
        values go through a copy. `tensors`: the model's (`model_tensors`), whose trailing
        ones are these buffers. Returns `mixing.mix_into`'s scratch buffer, for the next call."""
        split = len(tensors) - len(self.buffers)
        out = mix_into(link, tensors[:split], self_weight,
                            [(flat[: self.offset], weight) for flat, weight in inputs], out=out)
        if self.buffers:
            average = sent[self.offset : self.end].clone()
            mix(average, self_weight,
                [(flat[self.offset : self.end], weight) for flat, weight in inputs])
            average.add_(self._moved(sent))
            with torch.no_grad():
                link.unpack_into(average, tensors[split:])
        return out

    def apply(self, average: torch.Tensor, sent: torch.Tensor) -> torch.Tensor:
        """`average` with its buffer part corrected in place; `sent` is what was sent (the
        average's layout, trailing headers allowed)."""
        if self.buffers:
            average[self.offset : self.end].add_(self._moved(sent))
        return average

    def _moved(self, sent: torch.Tensor) -> torch.Tensor:
        """How far the buffers moved since `sent` was packed: x_now - x_sent."""
        now = span(self.buffers)  # laid out (`lay_out`): read in place, not gathered
        if now is None:
            now = torch.cat([b.detach().reshape(-1) for b in self.buffers])
        return torch.sub(now.to(sent.device), sent[self.offset : self.end])


def broadcast_model(model: nn.Module, link: Link, src: int = 0) -> None:
    """Give every worker `src`'s floating-point parameters and buffers (one broadcast)."""
    tensors = model_tensors(model)
    if not tensors:
        return
    with torch.no_grad():
        flat = link.flat(tensors)
        link.broadcast(flat, src)
        link.unpack_into(flat, tensors)
