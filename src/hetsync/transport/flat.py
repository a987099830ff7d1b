"""One flat buffer per synchronisation: a single collective instead of one per tensor.

The last element of a gradient buffer carries this worker's stop vote, so that all workers
agree to stop at the same iteration without an extra collective.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "BufferDrift",
    "average_model",
    "broadcast_model",
    "flatten",
    "flatten_with_vote",
    "model_tensors",
    "ring_allreduce_bytes",
    "unflatten_into",
    "wire_device",
]


def flatten(
    tensors: Sequence[torch.Tensor], *extra: float, device: torch.device | None = None
) -> torch.Tensor:
    """A new 1-D buffer: the tensors' values (detached), then the `extra` scalars in the
    tensors' dtype, on `device` (default: the tensors'), which stages a model on a GPU through
    host memory for a gloo transport. The extras round as the dtype does (bf16 holds integers
    exactly only up to 256): fit for a stop vote a collective sums over at most 256 workers;
    a header (a tag, a version, a time) goes in `hetsync.transport.header.Frame` instead."""
    first = tensors[0]
    device = first.device if device is None else device
    tail = torch.tensor(extra, dtype=first.dtype, device=device)
    return torch.cat([t.detach().reshape(-1).to(device) for t in tensors] + [tail])


def flatten_with_vote(tensors: Sequence[torch.Tensor], vote: bool) -> torch.Tensor:
    """Concatenate `tensors` and a trailing 1.0 (stop) or 0.0 (go on) into a new buffer."""
    return flatten(tensors, 1.0 if vote else 0.0)


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


def wire_device(backend: str, device: torch.device) -> torch.device:
    """Where a buffer must be for `backend` to send it: NCCL sends device memory, gloo host
    memory (on a CPU-only run the staging copy is a no-op, so that path runs the same code)."""
    return device if backend == "nccl" else torch.device("cpu")


def average_model(model: nn.Module, backend: str) -> None:
    """Set `model`'s floating parameters and buffers to their average over all workers."""
    tensors = model_tensors(model)
    if not tensors:
        return
    with torch.no_grad():
        flat = flatten(tensors)
        wire = flat.to(wire_device(backend, flat.device))
        dist.all_reduce(wire)
        wire.div_(dist.get_world_size())
        unflatten_into(wire.to(flat.device), tensors)
    # Leave together: a rank that exits (tearing down its gloo pairs) while a peer still
    # finishes its part of the all-reduce can make that peer abort (seen once in CI).
    dist.barrier()


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

    def apply(self, average: torch.Tensor, sent: torch.Tensor) -> torch.Tensor:
        """`average` with its buffer part corrected in place; `sent` is what was sent (the
        average's layout, trailing headers allowed)."""
        if self.buffers:
            end = self.offset + sum(b.numel() for b in self.buffers)
            now = torch.cat([b.detach().reshape(-1).to(average.device) for b in self.buffers])
            average[self.offset : end].add_(now - sent[self.offset : end])
        return average


def broadcast_model(model: nn.Module, src: int = 0) -> None:
    """Give every worker `src`'s floating-point parameters and buffers (one broadcast)."""
    tensors = model_tensors(model)
    if not tensors:
        return
    with torch.no_grad():
        flat = flatten(tensors)
        dist.broadcast(flat, src)
        unflatten_into(flat, tensors)
